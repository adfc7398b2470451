"""/healthz, /readyz and /metrics: open to every client, like a load balancer's
or Prometheus's."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from jobctl.api.models import Health
from jobctl.service import jsonable, readiness
from jobctl.service.models import Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="The process answers")
async def healthz() -> Health:
    """The process is up and serving; says nothing of the database or broker."""
    return Health()


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "A service did not answer."}},
    summary="PostgreSQL and RabbitMQ answer",
)
async def readyz(request: Request) -> Response:
    """PostgreSQL and RabbitMQ, each asked with a 2 s timeout: 200 when both
    answered, 503 (with which one did not, and why) otherwise."""
    found = await readiness(request.app.state.database, request.app.state.amqp)
    return JSONResponse(jsonable(found), status_code=200 if found.ready else 503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    summary="Prometheus metrics",
)
async def metrics(request: Request) -> Response:
    """The collector's cached snapshot in the Prometheus text format (see
    docs/metrics.md); a scrape never queries the database."""
    body, content_type = request.app.state.collector.render()
    return Response(body, media_type=content_type)
