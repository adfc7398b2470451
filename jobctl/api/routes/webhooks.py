"""/v1/webhooks: the calls owed to completion webhooks, and a second chance for one
that was given up."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from hybrid_jobs.jobctl.api.guards import GuardedRoute, may_read, may_write
from hybrid_jobs.jobctl.api.problems import responses
from hybrid_jobs.jobctl.api.routes.common import database
from hybrid_jobs.jobctl.service import list_webhook_calls, retry_webhook_call
from hybrid_jobs.jobctl.service.models import WebhookCallView

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"], route_class=GuardedRoute)


@router.get(
    "",
    response_model=list[WebhookCallView],
    dependencies=[Depends(may_read)],
    responses=responses(401, 422, 503),
    summary="Webhook calls, newest first",
)
async def calls(
    request: Request,
    state: Annotated[str | None, Query(description="PENDING, DELIVERED or GAVE_UP.")] = None,
    job_id: Annotated[uuid.UUID | None, Query(description="Only the calls about this job.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[WebhookCallView]:
    """Each call owed when a job with a webhook ended: where it goes, its state, the
    calls made, what the last one got and when the next is due."""
    async with database(request).reading() as session:
        return await list_webhook_calls(session, state=state, job_id=job_id, limit=limit)


@router.post(
    "/{delivery_id}/retry",
    response_model=WebhookCallView,
    dependencies=[Depends(may_write)],
    responses=responses(401, 403, 404, 422, 503),
    summary="Deliver a given-up call again",
)
async def retry(delivery_id: int, request: Request) -> WebhookCallView:
    """A GAVE_UP call is due again now, its attempts counted afresh; any other is
    refused (422)."""
    async with database(request).writing() as session:
        return await retry_webhook_call(session, delivery_id)
