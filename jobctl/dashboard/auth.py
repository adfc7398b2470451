"""Who may look and who may act, for the dashboard's pages.

The rule is the API's: a server without a token (JOBCTL_API_TOKEN) serves every
page to anyone who can reach it and refuses every change; a server with one wants
it for everything, since pages show payloads and errors. A person proves they have
the token once, on the sign-in form, and gets a session cookie:

- ``jobctl_session`` holds a random secret (256 bits). The database keeps only its
  hash, with the session's expiry and a digest of the token it was opened with
  (``dashboard_sessions``): signing out deletes the row, so a copied cookie stops
  working at once; several ``jobctl serve`` processes share the sessions, and a
  restart keeps them. Nothing in the cookie is derived from the token, so a stolen
  cookie gives no way to guess the token offline. HttpOnly (scripts cannot read
  it), SameSite=Strict (a request started by another site does not carry it),
  Secure over https (or when the public URL is https), and good for
  ``SESSION_SECONDS``.
- Changing the token (its file is read again when it changes, or a restart with
  another one) ends every session opened with another token: their rows are
  deleted, so putting an old token back does not bring its sessions back. Each
  process does it when it starts, within ``WATCH_SECONDS`` of its token file
  changing (requests or not), before it checks a session against a token it has
  not done it for, and at every sign-in.
- Every POST carries a CSRF token, an HMAC of the session's secret, in a hidden form
  field; and its Origin (or, without one, its Referer) must be this server's own:
  the origin the request reached, or the public URL's (behind a proxy). Either check
  failing refuses the request before anything is read from the database or
  written to it.
- The one-time message an action leaves for the page it redirects to (its
  ``jobctl_flash`` cookie) is signed with a key derived from the session's secret
  (:func:`flash_key`): nobody without the session can plant one, and several
  processes sharing the sessions read each other's.
- Wrong tokens on the sign-in form count against the client, as on the API: past
  the limit, the client is refused for a while whatever it sends.

The token and the cookie are never logged: the access log records the method,
the path and the status only.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from fastapi import Request
from starlette.datastructures import State
from starlette.responses import Response

from hybrid_jobs.jobctl.api.settings import PublicUrl
from hybrid_jobs.jobctl.api.tokens import Tokens
from hybrid_jobs.jobctl.service import Database
from hybrid_jobs.jobctl.service.sql import fetch_one
from hybrid_jobs.plumbing.logfmt import describe_error
from hybrid_jobs.schema.queries import (
    DASHBOARD_SESSION_CREATE,
    DASHBOARD_SESSION_END,
    DASHBOARD_SESSION_EXPIRE,
    DASHBOARD_SESSION_VALID,
)

COOKIE: Final = "jobctl_session"
SESSION_SECONDS: Final = 12 * 3600
CSRF_FIELD: Final = "csrf"
_DIGEST_CONTEXT: Final = b"hybrid-jobs dashboard session v2\x00"
# How often a token file is looked at for a change when no request comes: a stat.
WATCH_SECONDS: Final = 1.0
# DASHBOARD_SESSION_EXPIRE deletes at most this many rows a statement.
_EXPIRE_BATCH: Final = 1000

log = logging.getLogger("jobctl")


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
    flash_key: bytes | None = field(default=None, repr=False)
    """What signs and checks this session's one-time messages; None without one."""

    @property
    def may_act(self) -> bool:
        return self.csrf is not None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def token_digest(token: str) -> str:
    """What a session remembers of the token it was opened with: a hash, so that a
    changed token ends it."""
    return hashlib.sha256(_DIGEST_CONTEXT + token.encode()).hexdigest()


def csrf_for(secret: str) -> str:
    return _b64(hmac.new(secret.encode(), b"csrf", hashlib.sha256).digest())


def flash_key(secret: str) -> bytes:
    """The key of the session's flash messages: derived from its secret, like the
    CSRF token, but another one (the CSRF token is on every page)."""
    return hmac.new(secret.encode(), b"flash", hashlib.sha256).digest()


def _tokens(request: Request) -> Tokens | None:
    tokens: Tokens | None = request.app.state.tokens
    return tokens


def _database(request: Request) -> Database:
    db: Database = request.app.state.database
    return db


def root(request: Request) -> str:
    """Where the dashboard is mounted, as clients see it ("" at the top)."""
    found: str = request.scope.get("root_path", "")
    return found.rstrip("/")


async def _end_other_sessions(database: Database, digest: str) -> int:
    """Delete every session not opened with the token of ``digest`` (and every
    expired one), in bounded batches; how many went."""
    ended = 0
    while True:
        async with database.writing() as session:
            found = await fetch_one(session, DASHBOARD_SESSION_EXPIRE, {"digest": digest})
        batch = 0 if found is None else int(found[0])
        ended += batch
        if batch < _EXPIRE_BATCH:
            return ended


async def current_digest(state: State) -> str | None:
    """The digest of the token to compare with now; None while there is none. The
    first time this process sees a token (at start, after each change), every
    session opened with another one ends first: a session of an old token must be
    gone, not merely refused, or putting that token back would revive it."""
    tokens: Tokens | None = state.tokens
    token = None if tokens is None else tokens.current()
    if token is None:
        return None
    digest = token_digest(token)
    if state.sessions_digest != digest:
        ended = await _end_other_sessions(state.database, digest)
        # Not when this process first looks: that is a start, not a change.
        if ended and state.sessions_digest is not None:
            log.info(
                "dashboard.sessions_ended",
                extra={"sessions": ended, "reason": "the API token changed"},
            )
        state.sessions_digest = digest
    return digest


async def follow_token(state: State, every: float = WATCH_SECONDS) -> None:
    """Run by ``jobctl serve`` while it serves: end the sessions of other tokens at
    start, then within ``every`` seconds of a change to the token file, whether a
    request comes or not (a token changed and changed back between two requests
    would otherwise leave the old sessions in place). A fixed token is done once."""
    tokens: Tokens | None = state.tokens
    if tokens is None:
        return
    failing = False
    while True:
        try:
            await current_digest(state)
        except Exception as exc:
            # Logged when it starts failing, not every round; a request that needs
            # a session checks again before it is let in.
            if not failing:
                log.warning(
                    "dashboard.sessions_unchecked",
                    extra={"error": describe_error(exc), "action": "retrying"},
                )
            failing = True
        else:
            failing = False
            if tokens.path is None and state.sessions_digest is not None:
                return
        await asyncio.sleep(every)


async def _session(request: Request) -> str | None:
    """The cookie's secret when it names a live session opened with the current
    token, else None."""
    secret = request.cookies.get(COOKIE)
    if not secret or len(secret) > 100:
        return None
    digest = await current_digest(request.app.state)
    if digest is None:
        return None
    params = {"hash": _hash(secret), "digest": digest}
    async with _database(request).reading() as session:
        found = await fetch_one(session, DASHBOARD_SESSION_VALID, params)
    return secret if found is not None else None


async def viewer(request: Request) -> Viewer:
    """The page's viewer; raises SignInRequired when the server wants the token."""
    if _tokens(request) is None:
        return Viewer(read_only=True, signed_in=False, csrf=None)
    secret = await _session(request)
    if secret is None:
        raise SignInRequired
    return Viewer(
        read_only=False, signed_in=True, csrf=csrf_for(secret), flash_key=flash_key(secret)
    )


def own_origins(request: Request) -> set[str]:
    """The origins a page of this server has: the one the request reached (its
    scheme as a trusted proxy says, its Host), and the public URL's."""
    found = {f"{request.url.scheme}://{request.url.netloc}"}
    public: PublicUrl | None = request.app.state.public_url
    if public is not None:
        found.add(public.origin)
    return found


def same_origin(request: Request) -> bool:
    """The request comes from a page of this server: its Origin says so, or, when a
    browser sent none, its Referer does. Neither: refused (every browser this
    dashboard supports sends Origin with a POST)."""
    own = own_origins(request)
    origin = request.headers.get("origin")
    if origin is None:
        referer = request.headers.get("referer")
        if not referer:
            return False
        parts = urlsplit(referer)
        origin = f"{parts.scheme}://{parts.netloc}"
    return any(hmac.compare_digest(origin.encode(), o.encode()) for o in own)


async def may_act(request: Request) -> Viewer:
    """For every POST but sign-in: the server has a token, the request comes from
    this site, the session is live and the form carries its CSRF token."""
    if _tokens(request) is None:
        raise Refused(
            "this dashboard is read-only: jobctl serve has no API token "
            "(set JOBCTL_API_TOKEN where it runs)"
        )
    if not same_origin(request):
        raise Refused("refused: the request did not come from this dashboard's own pages")
    secret = await _session(request)
    if secret is None:
        raise Refused("sign in first: your session is missing, has ended or has expired", 401)
    form = await request.form()
    given = form.get(CSRF_FIELD)
    expected = csrf_for(secret)
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), expected.encode()):
        raise Refused("refused: the form's CSRF token is missing or wrong; reload the page")
    return Viewer(read_only=False, signed_in=True, csrf=expected, flash_key=flash_key(secret))


def _secure(request: Request) -> bool:
    public: PublicUrl | None = request.app.state.public_url
    return request.url.scheme == "https" or (public is not None and public.scheme == "https")


async def open_session(request: Request, response: Response, token: str) -> None:
    """A new session for the token just shown, its cookie on ``response``; sessions
    that expired, or were opened with another token, go at the same time (no other
    chore needed)."""
    secret = secrets.token_urlsafe(32)
    digest = token_digest(token)
    params = {"hash": _hash(secret), "digest": digest, "session_seconds": SESSION_SECONDS}
    async with _database(request).writing() as session:
        await fetch_one(session, DASHBOARD_SESSION_EXPIRE, {"digest": digest})
        await fetch_one(session, DASHBOARD_SESSION_CREATE, params)
    response.set_cookie(
        COOKIE,
        secret,
        max_age=SESSION_SECONDS,
        path=root(request) or "/",
        httponly=True,
        samesite="strict",
        secure=_secure(request),
    )


async def end_session(request: Request, response: Response) -> None:
    """The session is gone for good (its cookie, copied or not, no longer works)."""
    secret = request.cookies.get(COOKIE)
    if secret:
        async with _database(request).writing() as session:
            await fetch_one(session, DASHBOARD_SESSION_END, {"hash": _hash(secret)})
    response.delete_cookie(
        COOKIE,
        path=root(request) or "/",
        httponly=True,
        samesite="strict",
        secure=_secure(request),
    )


def local_path(target: str | None, default: str = "/", root: str = "") -> str:
    """``target`` when it is a path on this server, else ``default``: a redirect
    after sign-in or an action never leads to another site. Under a mount point
    (``root``), a path outside it is taken as relative to it."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return default
    if root and target != root and not target.startswith(root + "/"):
        return root + target
    return target
