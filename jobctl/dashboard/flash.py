"""What an action did, shown once on the page it redirects to (post/redirect/get,
so reloading that page does not repeat the action). Carried in a short-lived
cookie; the text is the server's own and is escaped when rendered."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Final

from starlette.requests import Request
from starlette.responses import Response

COOKIE: Final = "jobctl_flash"
MAX_AGE: Final = 60


@dataclass(frozen=True)
class Flash:
    level: str
    """ok or error."""
    text: str
    link: str | None = None
    """A path on this server the message points at (a job it made)."""
    link_text: str | None = None

    def set(self, response: Response, root: str = "") -> None:
        document = {"level": self.level, "text": self.text, "link": self.link}
        document["link_text"] = self.link_text
        value = base64.urlsafe_b64encode(json.dumps(document).encode()).decode()
        response.set_cookie(
            COOKIE, value, max_age=MAX_AGE, path=root or "/", httponly=True, samesite="strict"
        )

    @staticmethod
    def clear(response: Response, root: str = "") -> None:
        response.delete_cookie(COOKIE, path=root or "/", httponly=True, samesite="strict")


def take_flash(request: Request) -> Flash | None:
    value = request.cookies.get(COOKIE)
    if not value:
        return None
    try:
        document = json.loads(base64.urlsafe_b64decode(value.encode()))
        level, text = str(document["level"]), str(document["text"])
        link = document.get("link")
        link_text = document.get("link_text")
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None
    if level not in ("ok", "error"):
        return None
    # Only a path on this server becomes a link.
    if not (isinstance(link, str) and link.startswith("/") and not link.startswith("//")):
        link, link_text = None, None
    return Flash(level, text[:500], link, None if link_text is None else str(link_text)[:100])
