"""What an action did, shown once on the page it redirects to (post/redirect/get,
so reloading that page does not repeat the action). Carried in a short-lived
cookie; the text is the server's own and is escaped when rendered.

The cookie is signed with the session's flash key (``auth.flash_key``): one that
was not made by this server for this session (planted by another site, a sibling
subdomain, a proxy) is ignored, as is anything that does not decode, however it
fails. A page never answers 500 for a cookie. Its link must be a path on this
site, and is checked again when read."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response

COOKIE: Final = "jobctl_flash"
MAX_AGE: Final = 60
# A browser keeps a cookie of at most 4 KiB; a longer one was not set by this server.
MAX_COOKIE: Final = 4096
MAX_TEXT: Final = 500
MAX_LINK_TEXT: Final = 100
MAX_LINK: Final = 300
_CONTEXT: Final = b"hybrid-jobs dashboard flash v1\x00"
# Not in a link of ours: a backslash (browsers read it as a slash, so "/\\evil.com"
# is "//evil.com", another site), and controls and spaces (browsers drop tabs and
# newlines from a URL: "/\t/evil.com" is "//evil.com" too).
_NOT_IN_LINK: Final = re.compile(r"[\\\x00-\x20\x7f-\x9f]")


def own_path(link: object) -> bool:
    """A path on this site: one leading slash, not two (another host), nothing a
    browser reads as one."""
    return (
        isinstance(link, str)
        and 0 < len(link) <= MAX_LINK
        and link.startswith("/")
        and not link.startswith("//")
        and _NOT_IN_LINK.search(link) is None
    )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(key: bytes, body: str) -> str:
    return _b64(hmac.new(key, _CONTEXT + body.encode(), hashlib.sha256).digest())


def signed(key: bytes, data: bytes) -> str:
    """A cookie value: ``data`` in base64, a dot, its signature with ``key``."""
    body = _b64(data)
    return f"{body}.{_signature(key, body)}"


@dataclass(frozen=True)
class Flash:
    level: str
    """ok or error."""
    text: str
    link: str | None = None
    """A path on this server the message points at (a job it made)."""
    link_text: str | None = None

    def value(self, key: bytes) -> str:
        """The cookie's value: the message as JSON, and its signature with ``key``."""
        document = {
            "level": self.level,
            "text": self.text[:MAX_TEXT],
            "link": self.link,
            "link_text": None if self.link_text is None else self.link_text[:MAX_LINK_TEXT],
        }
        return signed(key, json.dumps(document, ensure_ascii=False).encode())

    def set(self, response: Response, key: bytes | None, root: str = "") -> None:
        """On ``response``, signed with the session's ``key``; without one (no
        session) there is nobody to show it to, and nothing is set."""
        if key is None:
            return
        response.set_cookie(
            COOKIE,
            self.value(key),
            max_age=MAX_AGE,
            path=root or "/",
            httponly=True,
            samesite="strict",
        )

    @staticmethod
    def clear(response: Response, root: str = "") -> None:
        response.delete_cookie(COOKIE, path=root or "/", httponly=True, samesite="strict")


def take_flash(request: Request, key: bytes | None) -> Flash | None:
    """The message the request's cookie carries, if this session's ``key`` signed
    it and it reads as one; else None."""
    value = request.cookies.get(COOKIE)
    if not value or key is None or len(value) > MAX_COOKIE:
        return None
    body, _, signature = value.rpartition(".")
    if not body or not hmac.compare_digest(signature.encode(), _signature(key, body).encode()):
        return None
    try:
        document: Any = json.loads(_unb64(body))
    # RecursionError: nested past what the decoder can follow. Signed, it is ours,
    # but a page must not fail for a cookie whatever it holds.
    except (ValueError, RecursionError, binascii.Error):
        return None
    return _read(document)


def _read(document: Any) -> Flash | None:
    """The message in a decoded cookie: each field of the type it must be."""
    if not isinstance(document, dict):
        return None
    level, text = document.get("level"), document.get("text")
    link, link_text = document.get("link"), document.get("link_text")
    if level not in ("ok", "error") or not isinstance(text, str):
        return None
    # Only a path on this server becomes a link.
    if not own_path(link) or not isinstance(link_text, str | None):
        link, link_text = None, None
    return Flash(
        level,
        text[:MAX_TEXT],
        link,
        None if link_text is None else link_text[:MAX_LINK_TEXT],
    )
