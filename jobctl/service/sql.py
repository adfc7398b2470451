"""Running a named statement through the caller's session, rows as plain tuples."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from hybrid_jobs.outbox.enqueue import check_driver


async def fetch_all(
    session: AsyncSession, statement: str, params: Mapping[str, Any] | None = None
) -> list[tuple[Any, ...]]:
    conn = await session.connection()
    # The statements are psycopg-style SQL, as the producer API's are.
    check_driver(conn)
    result = await conn.exec_driver_sql(statement, dict(params or {}))
    return [tuple(row) for row in result.all()]


async def fetch_one(
    session: AsyncSession, statement: str, params: Mapping[str, Any] | None = None
) -> tuple[Any, ...] | None:
    rows = await fetch_all(session, statement, params)
    return rows[0] if rows else None
