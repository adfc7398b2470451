"""The FastAPI application of ``jobctl serve``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from hybrid_jobs.jobctl import dashboard
from hybrid_jobs.jobctl.api import problems
from hybrid_jobs.jobctl.api.guards import READ_ONLY, AccessLog, BodyLimit, FailureLimiter, HostCheck
from hybrid_jobs.jobctl.api.headers import ResponseHeaders
from hybrid_jobs.jobctl.api.proxies import ForwardedHeaders
from hybrid_jobs.jobctl.api.routes import health, inputs, jobs, operate, webhooks
from hybrid_jobs.jobctl.api.settings import ApiSettings
from hybrid_jobs.jobctl.api.waiters import Waiters
from hybrid_jobs.jobctl.dashboard import auth
from hybrid_jobs.jobctl.metrics import Collector
from hybrid_jobs.jobctl.service import Database
from hybrid_jobs.jobctl.service.health import ReadinessCache

log = logging.getLogger("jobctl")

DESCRIPTION = """\
Enqueue jobs, look at them, cancel and retry them, and see queues, schedules,
tenants and consumers. Errors are `application/problem+json` (RFC 9457) whose
`detail` names the field at fault.

Authentication: `Authorization: Bearer <token>`, the token `jobctl serve` was
given in `JOBCTL_API_TOKEN` (or `JOBCTL_API_TOKEN_FILE`). With a token, every read
needs it too, `/metrics` included (unless the server runs with `--open-metrics`);
a client that sends too many wrong tokens is refused for a while (429). The client
is the connection's peer, or the one named in `X-Forwarded-For` by a proxy that
`jobctl serve` trusts (`--forwarded-allow-ips`, none by default). A server
without a token refuses every change (403) and serves reads to anyone who can reach it
and names a host it serves. `/healthz`, `/readyz` (without the details a token
shows) and `/openapi.json` need no token.
"""


def create_app(settings: ApiSettings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        database = Database(settings.database, "jobctl-api", pool_size=settings.pool_size)
        collector = Collector.for_database(settings.database, settings.collector)
        app.state.database = database
        app.state.amqp = settings.amqp
        app.state.collector = collector
        app.state.readiness = ReadinessCache(database, settings.amqp, settings.readiness_seconds)
        if app.state.tokens is None:
            log.warning("api.read_only", extra={"detail": READ_ONLY})
        if settings.metrics:
            await collector.start()
        sessions = asyncio.create_task(auth.follow_token(app.state), name="dashboard-sessions")
        try:
            yield
        finally:
            sessions.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sessions
            await collector.stop()
            await database.dispose()

    app = FastAPI(
        title="hybrid-jobs",
        version=_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
        # The interactive pages load scripts from a CDN; the document is enough.
        docs_url=None,
        redoc_url=None,
    )
    # Known before the lifespan runs: a request may come first (in tests).
    app.state.tokens = settings.tokens
    # The token whose digest the dashboard's sessions were last held to: None until
    # the sessions of other tokens are ended (jobctl.dashboard.auth.current_digest).
    app.state.sessions_digest = None
    app.state.failures = FailureLimiter(
        settings.failures_allowed,
        settings.failure_window_seconds,
        proxy_allowed=settings.proxy_failures_allowed,
    )
    app.state.open_metrics = settings.open_metrics
    app.state.waiters = Waiters(settings.max_waiters, settings.max_waiters_per_client)
    app.state.public_url = settings.public_url
    problems.install(app)
    app.include_router(jobs.router)
    app.include_router(operate.router)
    app.include_router(inputs.router)
    app.include_router(webhooks.router)
    app.include_router(health.router)
    dashboard.install(app)
    # Added innermost first: the client's address is settled before anything (from
    # a trusted proxy's X-Forwarded-For, or the socket's peer), the access log sees
    # every request, and every answer gets the headers, 413s and refused hosts
    # included; the Host is checked before a body is read.
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(HostCheck, served=settings.served_hosts())
    app.add_middleware(ResponseHeaders, https=settings.public_https)
    app.add_middleware(AccessLog)
    app.add_middleware(ForwardedHeaders, proxies=settings.trusted_proxies)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hybrid-jobs")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0"


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with the problem responses under their own media type
    (FastAPI lists a response model under the route's, application/json)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    problem = {"$ref": "#/components/schemas/Problem"}
    for path in document.get("paths", {}).values():
        for operation in path.values():
            for response in operation.get("responses", {}).values():
                content = response.get("content", {})
                if content.get("application/json", {}).get("schema") == problem:
                    content[problems.MEDIA_TYPE] = content.pop("application/json")
    app.openapi_schema = document
    return document
