"""Who may look and who may act, for the dashboard's pages.

The rule is the API's: a server without a token (JOBCTL_API_TOKEN) serves every
page to anyone who can reach it and refuses every change; a server with one wants
it for everything, since pages show payloads and errors. A person proves they have
the token once, on the sign-in form, and gets a session cookie:

- ``jobctl_session`` = ``issued.nonce.mac``, where ``mac`` is an HMAC of issued
  and nonce under a key derived from the token. Stateless, so it survives a
  restart and works across several ``jobctl serve`` processes with one token;
  changing the token signs everyone out. The cookie never holds the token.
  HttpOnly (scripts cannot read it), SameSite=Strict (a request started by another
  site does not carry it), Secure over https, and good for ``SESSION_SECONDS``.
- Every POST carries a CSRF token, an HMAC of the session's nonce under the same
  key, in a hidden form field; and its Origin (or, without one, its Referer) must
  be this server's own. Either check failing refuses the request before anything
  is read from the database or written to it.

The token and the cookie are never logged: the access log records the method,
the path and the status only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from fastapi import Request
from starlette.responses import Response

COOKIE: Final = "jobctl_session"
SESSION_SECONDS: Final = 12 * 3600
CSRF_FIELD: Final = "csrf"
_KEY_CONTEXT: Final = b"hybrid-jobs dashboard session v1"


class SignInRequired(Exception):
    """A page was asked for without a session on a server that has a token."""


class Refused(Exception):
    """A change was refused before it ran; ``reason`` says why, for the person."""

    def __init__(self, reason: str, status: int = 403) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class Viewer:
    """Who is looking at a page."""

    read_only: bool
    """The server has no token: nobody can change anything here."""
    signed_in: bool
    csrf: str | None
    """The token every form of this session carries; None when it cannot act."""

    @property
    def may_act(self) -> bool:
        return self.csrf is not None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _key(token: str) -> bytes:
    return hmac.new(token.encode(), _KEY_CONTEXT, hashlib.sha256).digest()


def _mac(key: bytes, *parts: str) -> str:
    return _b64(hmac.new(key, ".".join(parts).encode(), hashlib.sha256).digest())


def _token(request: Request) -> str | None:
    token: str | None = request.app.state.token
    return token


def new_session(token: str, now: float | None = None) -> str:
    issued = str(int(time.time() if now is None else now))
    nonce = _b64(secrets.token_bytes(18))
    return f"{issued}.{nonce}.{_mac(_key(token), 'session', issued, nonce)}"


def session_nonce(token: str, cookie: str | None, now: float | None = None) -> str | None:
    """The session's nonce when the cookie is genuine and not expired, else None."""
    if not cookie or cookie.count(".") != 2:
        return None
    issued, nonce, mac = cookie.split(".")
    expected = _mac(_key(token), "session", issued, nonce)
    if not hmac.compare_digest(mac.encode(), expected.encode()) or not issued.isdigit():
        return None
    age = (time.time() if now is None else now) - int(issued)
    return nonce if 0 <= age <= SESSION_SECONDS else None


def csrf_for(token: str, nonce: str) -> str:
    return _mac(_key(token), "csrf", nonce)


def viewer(request: Request) -> Viewer:
    """The page's viewer; raises SignInRequired when the server wants the token."""
    token = _token(request)
    if token is None:
        return Viewer(read_only=True, signed_in=False, csrf=None)
    nonce = session_nonce(token, request.cookies.get(COOKIE))
    if nonce is None:
        raise SignInRequired
    return Viewer(read_only=False, signed_in=True, csrf=csrf_for(token, nonce))


def token_matches(request: Request, given: str) -> bool:
    token = _token(request)
    if token is None:
        return False
    # Constant time: a wrong token must not be found a character at a time.
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode())


def own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}"


def same_origin(request: Request) -> bool:
    """The request comes from a page of this server: its Origin says so, or, when a
    browser sent none, its Referer does. Neither: refused (every browser this
    dashboard supports sends Origin with a POST)."""
    own = own_origin(request)
    origin = request.headers.get("origin")
    if origin is not None:
        return hmac.compare_digest(origin.encode(), own.encode())
    referer = request.headers.get("referer")
    if not referer:
        return False
    parts = urlsplit(referer)
    return f"{parts.scheme}://{parts.netloc}" == own


async def may_act(request: Request) -> Viewer:
    """For every POST but sign-in: the server has a token, the session is genuine,
    the request comes from this site and carries the session's CSRF token."""
    token = _token(request)
    if token is None:
        raise Refused(
            "this dashboard is read-only: jobctl serve has no API token "
            "(set JOBCTL_API_TOKEN where it runs)"
        )
    if not same_origin(request):
        raise Refused("refused: the request did not come from this dashboard's own pages")
    nonce = session_nonce(token, request.cookies.get(COOKIE))
    if nonce is None:
        raise Refused("sign in first: your session is missing or has expired", 401)
    form = await request.form()
    given = form.get(CSRF_FIELD)
    expected = csrf_for(token, nonce)
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), expected.encode()):
        raise Refused("refused: the form's CSRF token is missing or wrong; reload the page")
    return Viewer(read_only=False, signed_in=True, csrf=expected)


def set_session(request: Request, response: Response, token: str) -> None:
    response.set_cookie(
        COOKIE,
        new_session(token),
        max_age=SESSION_SECONDS,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_session(request: Request, response: Response) -> None:
    response.delete_cookie(
        COOKIE,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def local_path(target: str | None, default: str = "/") -> str:
    """``target`` when it is a path on this server, else ``default``: a redirect
    after sign-in or an action never leads to another site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return default
    return target
