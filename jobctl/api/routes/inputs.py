"""/v1/inputs: what may be shown of a stored input (never its content), and its
redaction."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from hybrid_jobs.jobctl.api.guards import GuardedRoute, may_read, may_write
from hybrid_jobs.jobctl.api.models import RedactBody
from hybrid_jobs.jobctl.api.problems import WITH_BODY, responses
from hybrid_jobs.jobctl.api.routes.common import actor, database
from hybrid_jobs.jobctl.service import get_input, parse_input_id, redact_input
from hybrid_jobs.jobctl.service.models import InputView

router = APIRouter(prefix="/v1/inputs", tags=["inputs"], route_class=GuardedRoute)


@router.get(
    "/{input_id}",
    response_model=InputView,
    dependencies=[Depends(may_read)],
    responses=responses(401, 404, 422, 503),
    summary="A stored input, without its content",
)
async def stored_input(input_id: str, request: Request) -> InputView:
    """Its size, whether it is sensitive, whether and why it was redacted, and how
    many jobs run on it. Its content is never served, sensitive or not: the
    handlers read it, no operator surface does."""
    ident = parse_input_id(input_id)
    async with database(request).reading() as session:
        return await get_input(session, ident)


@router.post(
    "/{input_id}/redact",
    response_model=InputView,
    dependencies=[Depends(may_write)],
    responses=responses(401, 403, 404, 422, 503, *WITH_BODY),
    summary="Erase a stored input's content",
)
async def redact(input_id: str, body: RedactBody, request: Request) -> InputView:
    """Its content goes for good (an erasure request); the jobs naming it and their
    history stay as they were. A job that has not started on it fails with
    INPUT_REDACTED; one that ran keeps its result. Who asked, when and why are
    recorded; redacting it again changes nothing."""
    ident = parse_input_id(input_id)
    async with database(request).writing() as session:
        return await redact_input(session, ident, reason=body.reason, by=actor(request))
