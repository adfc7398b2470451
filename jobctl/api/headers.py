"""What every answer carries: security headers, ``Cache-Control: no-store`` on
everything but static files, HSTS over https, and a ``WWW-Authenticate`` challenge
on every 401."""

from __future__ import annotations

from typing import Final

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REALM: Final = 'Bearer realm="hybrid-jobs"'

# Every answer: no sniffing a JSON body into HTML, no framing, no referrer leaving
# with a job id in it, no other site embedding a response.
COMMON_HEADERS: Final = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
# What a page may load: everything from this server, no inline script or style,
# forms post only here, no framing.
HTML_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
# Anything else is data, never a document that runs something.
DATA_POLICY: Final = "default-src 'none'; frame-ancestors 'none'"
# Static files may be cached; every other answer holds the system's data (payloads,
# errors, who did what) and must not be kept by a browser or a proxy.
CACHEABLE_PREFIX: Final = "/static/"
HSTS: Final = "max-age=31536000"


def security_headers(scheme: str, path: str, content_type: str) -> dict[str, str]:
    """The headers an answer to ``path`` with ``content_type`` carries."""
    found = dict(COMMON_HEADERS)
    found["Content-Security-Policy"] = (
        HTML_POLICY if content_type.startswith("text/html") else DATA_POLICY
    )
    if not path.startswith(CACHEABLE_PREFIX):
        found["Cache-Control"] = "no-store"
    if scheme == "https":
        found["Strict-Transport-Security"] = HSTS
    return found


class HttpMiddleware:
    """An ASGI middleware of HTTP requests (:meth:`http`); any other scope (lifespan,
    websocket) goes to ``app`` untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class ResponseHeaders(HttpMiddleware):
    """Adds :func:`security_headers` to every answer (those a route set win), and a
    ``WWW-Authenticate`` challenge to any 401 without one (RFC 9110 asks for it).
    ``https``: people reach the server over https (its public URL says so), so HSTS
    goes on every answer (a browser ignores it over plain http)."""

    def __init__(self, app: ASGIApp, https: bool = False) -> None:
        super().__init__(app)
        self.https = https

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        scheme = "https" if self.https else scope.get("scheme", "http")

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                wanted = security_headers(scheme, path, headers.get("content-type", ""))
                for name, value in wanted.items():
                    if name not in headers:
                        headers[name] = value
                if message["status"] == 401 and "www-authenticate" not in headers:
                    headers["WWW-Authenticate"] = REALM
            await send(message)

        await self.app(scope, receive, sending)
