"""What the routes share: the database, and who is acting."""

from __future__ import annotations

from fastapi import Request

from jobctl.service import Database


def database(request: Request) -> Database:
    db: Database = request.app.state.database
    return db


def actor(request: Request) -> str:
    """Who asked, as recorded by a retry or a pause: the API and the client's
    address (one token is shared by every client)."""
    client = request.client
    return f"api ({client.host})" if client else "api"
