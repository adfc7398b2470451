"""Handlers for tests that cancel running jobs with force, in a real `consumer --app
tests.apps.forced` process.

Each writes what it got to in ``marks``, in a connection of its own that commits at
once, so a test sees what a handler did whatever became of its attempt.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from hybrid_jobs import consumers
from hybrid_jobs.consumers import Backoff

MARKS_TABLE = """
CREATE TABLE IF NOT EXISTS marks (
    job_id uuid NOT NULL,
    pid    int NOT NULL,
    what   text NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
_MARK = "INSERT INTO marks (job_id, pid, what) VALUES (%s, %s, %s)"
_SEEN = "SELECT count(*) FROM marks WHERE job_id = %s AND what = 'started'"
# Retries come back at once: a swept attempt is run again within the test.
QUICK = Backoff(base=0.1, cap=0.2, jitter=0)
# A plain function that ignores cancellation still stops some day.
PLAIN_AT_MOST_S = 120.0


async def _mark(job: consumers.Job, what: str) -> None:
    async with job.connection() as conn:
        await conn.execute(_MARK, [job.id, os.getpid(), what])


def _mark_plain(job: consumers.Job, what: str) -> int:
    """Marks it; returns how many times the job had started before."""
    with job.connection() as conn:
        row = conn.execute(_SEEN, [job.id]).fetchone()
        conn.execute(_MARK, [job.id, os.getpid(), what])
    return 0 if row is None else int(row[0])


@consumers.handler("stuck", backoff=QUICK)
async def stuck(job: consumers.Job) -> dict[str, Any]:
    """Sleeps ``seconds`` (an hour by default), ignoring a cooperative cancel; its
    ``finally`` marks that it ran."""
    await _mark(job, "started")
    try:
        await asyncio.sleep(float(job.payload.get("seconds", 3600)))
    finally:
        await _mark(job, "finally")
    return {"slept": True}


@consumers.handler("patient", backoff=QUICK)
async def patient(job: consumers.Job) -> None:
    """Sleeps ``seconds`` the first time it starts, then returns at once."""
    async with job.connection() as conn:
        cur = await conn.execute(_SEEN, [job.id])
        row = await cur.fetchone()
        await conn.execute(_MARK, [job.id, os.getpid(), "started"])
    if row is not None and row[0] == 0:
        await asyncio.sleep(float(job.payload.get("seconds", 3600)))


@consumers.handler("stuck_plain", queue="sync", backoff=QUICK)
def stuck_plain(job: consumers.Job) -> dict[str, Any]:
    """A plain function that ignores every cancel: busy for ``seconds`` (for ever,
    as far as a test goes, by default); marks that it returned."""
    _mark_plain(job, "started")
    deadline = time.monotonic() + float(job.payload.get("seconds", PLAIN_AT_MOST_S))
    while time.monotonic() < deadline:
        time.sleep(0.05)
    _mark_plain(job, "returned")
    return {"done": True}


@consumers.handler("patient_plain", queue="sync", backoff=QUICK)
def patient_plain(job: consumers.Job) -> None:
    """Busy for ``seconds`` the first time it starts, then returns at once."""
    if _mark_plain(job, "started") == 0:
        time.sleep(float(job.payload.get("seconds", 10)))
