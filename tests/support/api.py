"""The HTTP API for tests: in-process (httpx on the ASGI app, its lifespan run), or
served by a real `jobctl serve` process on a free port."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx

from hybrid_jobs.jobctl.api import ApiSettings, create_app
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from tests.support.processes import Daemon, service_env
from tests.support.services import AMQP_URL

# As secrets.token_urlsafe(32) makes them: jobctl serve refuses weak ones.
TOKEN = "t3st-Zq8vN1xWc4Lr7Kp0Hs2Gd5Fy9Bj6Mu3Ae8Xo1Ri4Tw"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@asynccontextmanager
async def api_client(
    db: DatabaseUrl,
    amqp: AmqpUrl | None = None,
    *,
    token: str | None = TOKEN,
    headers: dict[str, str] | None = None,
    **settings: Any,
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app in this process, against the real database; with the
    token's header unless ``headers`` says otherwise."""
    app = create_app(
        ApiSettings(db, amqp or AmqpUrl.parse(AMQP_URL), token, **({"metrics": False} | settings))
    )
    transport = httpx.ASGITransport(app=app)
    sent = BEARER if headers is None and token is not None else (headers or {})
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://localhost", headers=sent) as client,
    ):
        yield client


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def served(
    db: DatabaseUrl,
    *,
    token: str | None = TOKEN,
    args: tuple[str, ...] = (),
    amqp: str = AMQP_URL,
    **env: str,
) -> Iterator[tuple[str, Daemon]]:
    """`jobctl serve` on a free port (with ``args`` too); yields its base URL once
    /healthz answers, and stops it (SIGTERM) afterwards. ``token=None`` and no
    JOBCTL_API_TOKEN_FILE in ``env``: a server without a token."""
    from hybrid_jobs.schema.topology import Topology

    port = free_port()
    environment = service_env(db, amqp, Topology(prefix="unused"), **env)
    environment.pop("JOBCTL_API_TOKEN", None)
    if "JOBCTL_API_TOKEN_FILE" not in env:
        environment.pop("JOBCTL_API_TOKEN_FILE", None)
    if token is not None:
        environment["JOBCTL_API_TOKEN"] = token
    daemon = Daemon(
        "jobctl", ["serve", "--host", "127.0.0.1", "--port", str(port), *args], environment
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if daemon.proc.poll() is not None:
                raise AssertionError(
                    f"jobctl serve exited {daemon.proc.returncode}:\n{daemon.text()}"
                )
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"jobctl serve did not answer:\n{daemon.text()}")
            time.sleep(0.05)
        yield base, daemon
    finally:
        if daemon.proc.poll() is None:
            daemon.stop(20)
