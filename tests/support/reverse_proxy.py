"""A reverse proxy in front of `jobctl serve`, set up as nginx usually is, for the
tests of running behind one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support.dashboard import serving


@asynccontextmanager
async def reverse_proxy(
    backend: str, *, prefix: str = "", proto: str | None = None, port: int | None = None
) -> AsyncIterator[str]:
    """A reverse proxy as nginx is set up for it: ``prefix`` stripped, its own Host
    sent to the backend (proxy_set_header Host $proxy_host), X-Forwarded-For and,
    when given, X-Forwarded-Proto added."""
    client = httpx.AsyncClient(base_url=backend, timeout=30)

    async def forward(request: Request) -> Response:
        path = request.url.path
        if prefix:
            if not path.startswith(prefix):
                return Response("not here", status_code=404)
            path = path[len(prefix) :] or "/"
        headers = {k: v for k, v in request.headers.items() if k not in ("host", "content-length")}
        headers["x-forwarded-for"] = request.client.host if request.client else "127.0.0.1"
        if proto:
            headers["x-forwarded-proto"] = proto
        upstream = await client.request(
            request.method,
            path + (f"?{request.url.query}" if request.url.query else ""),
            content=await request.body(),
            headers=headers,
        )
        out = Response(upstream.content, status_code=upstream.status_code)
        for name, value in upstream.headers.multi_items():
            if name not in ("content-length", "content-encoding", "transfer-encoding"):
                out.headers.append(name, value)
        return out

    app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "PUT"])])
    try:
        async with serving(app, port) as listening:
            yield f"http://localhost:{listening}"
    finally:
        await client.aclose()
