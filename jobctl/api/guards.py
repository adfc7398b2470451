"""What every request passes before a route: the body's size, the bearer token;
and the access log after."""

from __future__ import annotations

import hmac
import json
import logging
import time
from typing import Annotated, Final

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jobctl.api.problems import MEDIA_TYPE, Problem

log = logging.getLogger("jobctl")

READ_ONLY: Final = (
    "this server is read-only: it has no API token (set JOBCTL_API_TOKEN or "
    "JOBCTL_API_TOKEN_FILE where `jobctl serve` runs), so it refuses every change"
)
_bearer = HTTPBearer(auto_error=False, description="The token `jobctl serve` was given.")


def _token_of(request: Request) -> str | None:
    token: str | None = request.app.state.token
    return token


def _check(request: Request, credentials: HTTPAuthorizationCredentials | None) -> None:
    token = _token_of(request)
    if token is None:
        return
    given = "" if credentials is None else credentials.credentials
    # Constant time: a wrong token must not be found a character at a time.
    if not hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode()):
        raise HTTPException(
            401,
            "a bearer token is required (Authorization: Bearer <token>)"
            if credentials is None
            else "the bearer token is wrong",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def may_read(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Reads need the token when the server has one; without one they are open
    (the server listens on 127.0.0.1 unless told otherwise)."""
    _check(request, credentials)


async def may_write(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Changes need the token; a server without one refuses them all."""
    if _token_of(request) is None:
        raise HTTPException(403, READ_ONLY)
    _check(request, credentials)


class BodyLimit:
    """Refuses a body larger than ``max_bytes`` with 413, before any route sees it
    (so a refused request writes nothing), whether its Content-Length says so or
    it streams past the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await self._refuse(send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        detail = f"the body is larger than this server accepts ({self.max_bytes} bytes)"
        body = Problem(title="Content Too Large", status=413, detail=detail)
        payload = json.dumps(body.model_dump(exclude_none=True)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", MEDIA_TYPE.encode()),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


class AccessLog:
    """One JSON line per request: method, path, status, time taken. Never a
    header (the token travels in one) nor a query string's values."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            client = scope.get("client")
            log.info(
                "api.request",
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "ms": round((time.perf_counter() - started) * 1000, 1),
                    "client": client[0] if client else None,
                },
            )
