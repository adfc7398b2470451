"""Handlers of three resumable steps for `consumer --app tests.apps.steps`.

Each step writes a row to ``step_runs`` when it runs, in a connection of its own
that commits at once: a step that ran twice shows two rows, whatever became of its
record. Between steps 2 and 3 the handler writes the row ``after 2`` and, on its
first attempt, sleeps ``seconds``: the window a test kills the consumer in.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from hybrid_jobs import consumers

STEP_RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS step_runs (
    job_id  uuid NOT NULL,
    step    text NOT NULL,
    attempt int NOT NULL,
    pid     int NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
_RAN = "INSERT INTO step_runs (job_id, step, attempt, pid) VALUES (%s, %s, %s, %s)"
AFTER_TWO = "after 2"


async def _ran_async(job: consumers.Job, step: str) -> None:
    async with job.connection() as conn:
        await conn.execute(_RAN, [job.id, step, job.attempt, os.getpid()])


def _ran(job: consumers.Job, step: str) -> None:
    with job.connection() as conn:
        conn.execute(_RAN, [job.id, step, job.attempt, os.getpid()])


@consumers.handler("three_steps", max_attempts=3)
async def three_steps(job: consumers.Job) -> dict[str, Any]:
    async def charge(amount: int) -> dict[str, int]:
        await _ran_async(job, "charge")
        return {"charged": amount, "attempt": job.attempt}

    async def reserve() -> list[str]:
        await _ran_async(job, "reserve")
        return ["a", "b"]

    async def ship() -> str:
        await _ran_async(job, "ship")
        return f"shipped at attempt {job.attempt}"

    charged = await job.step_async("charge", charge, 100)
    reserved = await job.step_async("reserve", reserve)
    await _ran_async(job, AFTER_TWO)
    if job.attempt == 1:
        await asyncio.sleep(float(job.payload.get("seconds", 0)))
    shipped = await job.step_async("ship", ship)
    return {"charge": charged, "reserve": reserved, "ship": shipped}


@consumers.handler("three_steps_plain", queue="sync", max_attempts=3)
def three_steps_plain(job: consumers.Job) -> dict[str, Any]:
    def charge(amount: int) -> dict[str, int]:
        _ran(job, "charge")
        return {"charged": amount, "attempt": job.attempt}

    def reserve() -> list[str]:
        _ran(job, "reserve")
        return ["a", "b"]

    def ship() -> str:
        _ran(job, "ship")
        return f"shipped at attempt {job.attempt}"

    charged = job.step("charge", charge, 100)
    reserved = job.step("reserve", reserve)
    _ran(job, AFTER_TWO)
    if job.attempt == 1:
        time.sleep(float(job.payload.get("seconds", 0)))
    shipped = job.step("ship", ship)
    return {"charge": charged, "reserve": reserved, "ship": shipped}
