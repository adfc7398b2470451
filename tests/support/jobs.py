"""Looking at jobs in tests: wait for states, read history."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.sql
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.outbox import NewJob


def enqueue(engine: Engine, job_type: str, payload: Any = None, **kw: Any) -> uuid.UUID:
    with Session(engine) as session, session.begin():
        return outbox.enqueue(session, job_type, {} if payload is None else payload, **kw)


def enqueue_many(engine: Engine, jobs: list[NewJob]) -> list[uuid.UUID]:
    with Session(engine) as session, session.begin():
        return outbox.enqueue_many(session, jobs)


def job(pg: psycopg.Connection, job_id: uuid.UUID) -> dict[str, Any]:
    cur = pg.execute("SELECT * FROM jobs WHERE job_id = %s", [job_id])
    names = [d.name for d in cur.description or []]
    row = cur.fetchone()
    assert row is not None, f"no job {job_id}"
    return dict(zip(names, row, strict=True))


def wakeups(pg: psycopg.Connection, job_id: uuid.UUID) -> int:
    """The job's wake-ups in the outbox, sent or not."""
    row = pg.execute("SELECT count(*) FROM outbox WHERE job_id = %s", [job_id]).fetchone()
    return int(row[0]) if row else 0


def versions(pg: psycopg.Connection, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Each job's row version: xmin moves with every write of a row, so equal means
    untouched."""
    rows = pg.execute("SELECT job_id, xmin::text FROM jobs WHERE job_id = ANY(%s)", [ids])
    return dict(rows.fetchall())


def attempts(pg: psycopg.Connection, job_id: uuid.UUID) -> list[dict[str, Any]]:
    cur = pg.execute("SELECT * FROM job_attempts WHERE job_id = %s ORDER BY attempt", [job_id])
    names = [d.name for d in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def states(pg: psycopg.Connection) -> dict[str, int]:
    return dict(pg.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())


async def wait_for_state(
    pg: psycopg.Connection, job_id: uuid.UUID, *wanted: str, timeout: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        row = job(pg, job_id)
        if row["state"] in wanted:
            return row
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} is {row['state']}, not {wanted}: {row}")
        await asyncio.sleep(0.05)


async def wait_until_all(
    pg: psycopg.Connection, state: str, count: int, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = states(pg)
        if got.get(state, 0) >= count:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"wanted {count} {state}, have {got}")
        await asyncio.sleep(0.1)


async def until_started(
    pg: psycopg.Connection, table: str, job_ids: list[uuid.UUID], timeout: float = 60
) -> None:
    """Wait until each job's handler has recorded its start in ``table`` (a test
    app's runs table). A test that kills a consumer whose job runs with
    ``hang_once`` waits for this, not for the lease: killed between its claim and
    that record, the first run leaves no row, and the retry, taking itself for the
    first, hangs instead of finishing."""

    def started() -> bool:
        row = pg.execute(
            psycopg.sql.SQL("SELECT count(DISTINCT job_id) FROM {} WHERE job_id = ANY(%s)").format(
                psycopg.sql.Identifier(table)
            ),
            [job_ids],
        ).fetchone()
        return row is not None and row[0] == len(set(job_ids))

    await until(started, f"the handlers of {len(job_ids)} jobs recorded in {table}", timeout)


async def until(check: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    """Wait for the row or event that proves the point; fail saying which."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
