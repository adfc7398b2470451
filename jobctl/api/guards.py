"""What every request passes before a route: the Host it names, the body's size,
the bearer token (with a limit on wrong ones per client and per peer), a JSON body
that parses; and the access log.

Order matters and is set in :func:`jobctl.api.app.create_app`: the access log and
the response headers (:mod:`jobctl.api.headers`) see every answer, a 413 and a
refused Host too; the Host is checked before the body is read; the token before the
body is parsed (so a client without the token learns nothing from a 422), by
:class:`GuardedRoute`.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Final

from fastapi import Depends, Request
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hybrid_jobs.jobctl.api.headers import REALM, HttpMiddleware
from hybrid_jobs.jobctl.api.problems import MEDIA_TYPE, Problem
from hybrid_jobs.jobctl.api.proxies import Caller, caller_of, client_address
from hybrid_jobs.jobctl.api.tokens import Tokens
from hybrid_jobs.jobctl.service.errors import Invalid
from hybrid_jobs.outbox.validation import MAX_PAYLOAD_DEPTH

log = logging.getLogger("jobctl")

READ_ONLY: Final = (
    "this server is read-only: it has no API token (set JOBCTL_API_TOKEN or "
    "JOBCTL_API_TOKEN_FILE where `jobctl serve` runs), so it refuses every change"
)
_bearer = HTTPBearer(auto_error=False, description="The token `jobctl serve` was given.")

# Paths a load balancer or an orchestrator probes by address, whatever Host it
# sends; they reveal nothing to a caller without the token.
PROBES: Final = frozenset({"/healthz", "/readyz"})


async def _problem(send: Send, status: int, detail: str, *, close: bool = False) -> None:
    body = Problem(title=_TITLE[status], status=status, detail=detail)
    payload = json.dumps(body.model_dump(exclude_none=True)).encode()
    headers = [
        (b"content-type", MEDIA_TYPE.encode()),
        (b"content-length", str(len(payload)).encode()),
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


_TITLE: Final = {400: "Bad Request", 413: "Content Too Large"}


def host_allowed(host_header: str, served: frozenset[str] | None) -> bool:
    """Whether a Host header (with or without its port) names a host in ``served``
    (None: any). ``.example.com`` in ``served`` stands for the domain and every
    subdomain."""
    if served is None:
        return True
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    host = host.rstrip(".")
    if not host:
        return False
    if host in served:
        return True
    return any(d.startswith(".") and (host == d[1:] or host.endswith(d)) for d in served)


class HostCheck:
    """Refuses (400) a request whose Host the server does not serve, before anything
    else runs. A page whose name was made to resolve to this server (DNS rebinding)
    still names itself in Host, so its requests stop here. Probes are exempt."""

    def __init__(self, app: ASGIApp, served: frozenset[str] | None) -> None:
        self.app = app
        self.served = served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.served is None:
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        host = Headers(scope=scope).get("host", "")
        if path in PROBES or host_allowed(host, self.served):
            await self.app(scope, receive, send)
            return
        shown = host[:100].encode("ascii", "backslashreplace").decode()
        await _problem(
            send,
            400,
            f"this server does not serve the host {shown!r}: add it with --allowed-host"
            " (JOBCTL_ALLOWED_HOSTS) or --public-url where `jobctl serve` runs",
        )


class BodyLimit(HttpMiddleware):
    """Refuses a body larger than ``max_bytes`` with 413, before any route sees it
    (so a refused request writes nothing), whether its Content-Length says so or
    it streams past the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
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
        await _problem(send, 413, detail, close=True)


class FailureLimiter:
    """Wrong tokens, counted per address within ``window`` seconds; a request is
    refused (429) while a count it answers to is full, whatever it sends, so a guess
    that happens to be right is refused too.

    Each wrong token counts against the socket's peer (the address that opened the
    connection) and, when a trusted proxy named the client (:mod:`.proxies`), against
    that client as well. A request answers to:

    - a peer that is no trusted proxy: its own count, ``allowed``. Its
      ``X-Forwarded-For`` is ignored, so naming another address each time dodges
      nothing, and naming someone else's locks out nobody but the sender;
    - through a trusted proxy: the count of the client the proxy names, ``allowed``,
      and the proxy's, ``proxy_allowed``: every client behind it together. The client
      is the right-most address the proxy did not vouch for, the one it added itself:
      a client that writes someone else's address into its own header is still
      counted as itself, and locks out nobody else. The proxy's count bounds the
      guesses of whoever varies the address it is counted by (a proxy that passes
      a client's header on, a process that connects from the proxy's address, many
      real addresses); at ``proxy_allowed`` in a window, everyone through that
      proxy is refused until the oldest leaves it. A trusted proxy's own requests
      without a usable header answer to the proxy's count alone.

    Remembers at most ``max_clients`` addresses (those heard from longest ago are
    forgotten first), so a flood of addresses costs bounded memory. Per process."""

    def __init__(
        self,
        allowed: int,
        window: float,
        proxy_allowed: int | None = None,
        max_clients: int = 10_000,
    ) -> None:
        self.allowed = allowed
        self.window = window
        self.proxy_allowed = max(allowed, proxy_allowed or allowed)
        self.max_clients = max_clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str, now: float) -> deque[float]:
        found = self._failures.get(address)
        if found is None:
            return deque()
        while found and found[0] <= now - self.window:
            found.popleft()
        if not found:
            del self._failures[address]
        return found

    def _counts(self, caller: Caller) -> list[tuple[str, int]]:
        """The addresses ``caller`` answers to, each with its allowance."""
        counts = [(caller.peer, self.proxy_allowed if caller.peer_is_proxy else self.allowed)]
        if caller.forwarded:
            counts.append((caller.client, self.allowed))
        return counts

    def wait(self, caller: Caller) -> tuple[int, str]:
        """Seconds until ``caller`` may try again (0: now), and the address whose
        count holds it back."""
        now = time.monotonic()
        longest, by = 0, caller.client
        for address, allowed in self._counts(caller):
            recent = self._recent(address, now)
            if len(recent) >= allowed:
                seconds = max(1, math.ceil(recent[-allowed] + self.window - now))
                if seconds > longest:
                    longest, by = seconds, address
        return longest, by

    def failed(self, caller: Caller) -> None:
        now = time.monotonic()
        for address, _ in self._counts(caller):
            recent = self._recent(address, now)
            recent.append(now)
            self._failures[address] = recent
            self._failures.move_to_end(address)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)


def caller(request: Request) -> Caller:
    """Who is asking: the socket's peer and the client (the peer, or whom a trusted
    proxy names: --forwarded-allow-ips)."""
    return caller_of(request.scope)


def client_of(request: Request) -> str:
    """Who is asking, as the records say: the client's address (validated; the
    client a trusted proxy names, --forwarded-allow-ips, or else the socket's
    peer), never header text."""
    return client_address(request.scope)


def _tokens(request: Request) -> Tokens | None:
    tokens: Tokens | None = request.app.state.tokens
    return tokens


def too_many(request: Request) -> HTTPException | None:
    """The refusal for a client past its limit of wrong tokens, if it is."""
    limiter: FailureLimiter = request.app.state.failures
    asking = caller(request)
    wait, by = limiter.wait(asking)
    if not wait:
        return None
    whom = by
    if by == asking.peer and asking.peer_is_proxy:
        whom = f"{by}, a trusted proxy (every client behind it together)"
    return HTTPException(
        429,
        f"too many wrong tokens from {whom}: try again in {wait} s",
        headers={"Retry-After": str(wait)},
    )


def token_matches(request: Request, given: str) -> bool:
    """Whether ``given`` is the server's token now, in constant time (a wrong token
    must not be found a character at a time); a wrong one counts against the client."""
    tokens = _tokens(request)
    token = None if tokens is None else tokens.current()
    if token is None:
        return False
    if hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode()):
        return True
    asking = caller(request)
    request.app.state.failures.failed(asking)
    log.warning(
        "api.wrong_token",
        extra={"client": asking.client, "peer": asking.peer, "path": request.url.path},
    )
    return False


def check_bearer(request: Request, *, write: bool) -> None:
    """Raises the refusal for a request that may not read (or, ``write``, change):
    403 on a server without a token for a change; 429 for a client past its limit of
    wrong tokens; 401 without the token or with a wrong one."""
    tokens = _tokens(request)
    if tokens is None:
        if write:
            raise HTTPException(403, READ_ONLY)
        return
    refused = too_many(request)
    if refused is not None:
        raise refused
    header = request.headers.get("authorization")
    if header is None:
        raise HTTPException(
            401,
            "a bearer token is required (Authorization: Bearer <token>)",
            headers={"WWW-Authenticate": REALM},
        )
    if tokens.current() is None:
        raise HTTPException(
            401,
            "this server's token file holds no usable token now; see the server's log",
            headers={"WWW-Authenticate": REALM},
        )
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not token_matches(request, given.strip()):
        raise HTTPException(
            401,
            "the bearer token is wrong",
            headers={"WWW-Authenticate": f'{REALM}, error="invalid_token"'},
        )


def has_valid_bearer(request: Request) -> bool:
    """A request that carries the right token (for answers that say more to it)."""
    if _tokens(request) is None or "authorization" not in request.headers:
        return False
    check_bearer(request, write=False)
    return True


async def may_read(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Reads need the token when the server has one; without one they are open
    (to whoever can reach the port and names a host it serves)."""
    check_bearer(request, write=False)


async def may_write(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Changes need the token; a server without one refuses them all."""
    check_bearer(request, write=True)


async def may_scrape(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """/metrics: like a read, unless the server serves metrics openly (--open-metrics)."""
    if not request.app.state.open_metrics:
        check_bearer(request, write=False)


def _json_media(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


async def parsed_json(request: Request) -> None:
    """The body of a route that takes one, checked before FastAPI reads it: JSON
    (415 otherwise), well formed (400 otherwise), and not nested past what any
    reader of the system can take (422, naming the payload). Parsed once: FastAPI
    reads the same Request's cached parse."""
    body = await request.body()
    if not body:
        return  # FastAPI says which field is missing (422)
    if not _json_media(request.headers.get("content-type", "")):
        raise HTTPException(415, "the body must be JSON, sent with Content-Type: application/json")
    try:
        await request.json()
    except UnicodeDecodeError:
        raise HTTPException(400, "the body is not UTF-8 JSON") from None
    except json.JSONDecodeError as exc:
        raise HTTPException(
            400, f"the body is not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise Invalid(
            f"payload nests objects and arrays more than {MAX_PAYLOAD_DEPTH} levels deep"
            " (MAX_PAYLOAD_DEPTH)",
            "body.payload",
        ) from None
    except ValueError as exc:
        # What the parser refuses beyond the grammar: an integer of more digits than
        # Python converts (sys.get_int_max_str_digits, 4,300 by default).
        raise HTTPException(400, f"the body is not valid JSON: {exc}") from None


class GuardedRoute(APIRoute):
    """A route that checks its caller's token (its ``may_read``/``may_write``/
    ``may_scrape`` dependency) and then its JSON body before FastAPI parses and
    validates anything: 401 comes before 422, and 415/400 say what is wrong with the
    body itself."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        needs = {d.dependency for d in self.dependencies}
        takes_body = self.body_field is not None

        async def guarded(request: Request) -> Response:
            if may_write in needs:
                check_bearer(request, write=True)
            elif may_read in needs or (may_scrape in needs and not request.app.state.open_metrics):
                check_bearer(request, write=False)
            if takes_body:
                await parsed_json(request)
            return await handler(request)

        return guarded


class AccessLog(HttpMiddleware):
    """One JSON line per request: method, path, status, time taken. Never a
    header (the token travels in one) nor a query string's values."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
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
            asking = caller_of(scope)
            extra = {
                "method": scope["method"],
                "path": scope["path"],
                "status": status,
                "ms": round((time.perf_counter() - started) * 1000, 1),
                "client": asking.client,
            }
            if asking.forwarded:
                extra["peer"] = asking.peer
            log.info("api.request", extra=extra)
