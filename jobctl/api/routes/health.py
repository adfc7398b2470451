"""/healthz, /readyz and /metrics: probes open to every client, as a load
balancer's or an orchestrator's are; /metrics as the reads are (the token, when the
server has one), unless it serves metrics openly."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from pydantic import TypeAdapter

from hybrid_jobs.jobctl.api.guards import GuardedRoute, has_valid_bearer, may_scrape
from hybrid_jobs.jobctl.api.models import Health
from hybrid_jobs.jobctl.api.problems import responses
from hybrid_jobs.jobctl.service.health import ReadinessCache
from hybrid_jobs.jobctl.service.models import Readiness

router = APIRouter(tags=["health"], route_class=GuardedRoute)


@router.get("/healthz", response_model=Health, summary="The process answers")
async def healthz() -> Health:
    """The process is up and serving; says nothing of the database or broker."""
    return Health()


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={
        503: {"model": Readiness, "description": "A service did not answer."},
        **responses(401),
    },
    summary="PostgreSQL and RabbitMQ answer",
)
async def readyz(request: Request) -> Response:
    """PostgreSQL and RabbitMQ, each asked with a 2 s timeout: 200 when both
    answered, 503 otherwise. The answer is cached for a couple of seconds, so
    probing costs little. Without the token it says only which service answered;
    with it (`Authorization: Bearer`), also where (host:port) and why not; the
    server's log has the why too (`api.not_ready`)."""
    cache: ReadinessCache = request.app.state.readiness
    found = await cache.get()
    shown = found if has_valid_bearer(request) else found.public()
    document = TypeAdapter(Readiness).dump_python(shown, mode="json", exclude_none=True)
    return JSONResponse(document, status_code=200 if found.ready else 503)


@router.get(
    "/metrics",
    response_class=Response,
    dependencies=[Depends(may_scrape)],
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        **responses(401),
    },
    summary="Prometheus metrics",
)
async def metrics(request: Request) -> Response:
    """The collector's cached snapshot in the Prometheus text format (see
    docs/guides/metrics.md); a scrape never queries the database. Needs the token when the
    server has one (Prometheus: `authorization: {credentials_file: ...}`), unless
    `jobctl serve --open-metrics`."""
    body, content_type = request.app.state.collector.render()
    return Response(body, media_type=content_type)
