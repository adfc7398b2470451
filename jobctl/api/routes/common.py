"""What the routes share: the database, and who is acting."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request

from hybrid_jobs.jobctl.api.guards import client_of
from hybrid_jobs.jobctl.api.proxies import UNKNOWN
from hybrid_jobs.jobctl.service import Database

# A route function, as a route decorator takes and gives it back.
F = TypeVar("F", bound=Callable[..., Any])


def database(request: Request) -> Database:
    db: Database = request.app.state.database
    return db


def actor(request: Request) -> str:
    """Who asked, as recorded by a retry or a pause: the API and the client's
    address (one token is shared by every client): a validated IP address, never a
    header's text (:func:`client_of`)."""
    client = client_of(request)
    return "api" if client == UNKNOWN else f"api ({client})"


def url(request: Request, path: str) -> str:
    """``path`` as a client reaches it: under the mount point a proxy strips
    (--public-url's path, the ASGI root_path)."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/") + path
