"""Handlers for tests that run a real `consumer --app tests.apps.basic` process."""

from __future__ import annotations

import asyncio
import os
import time

from harness.handlers import noop, sleep  # noqa: F401 - registered on import, run by this app
from hybrid_jobs import consumers


@consumers.handler("sync_sleep", queue="sync")
def sync_sleep(job: consumers.Job) -> None:
    time.sleep(float(job.payload.get("seconds", 1)))


@consumers.handler("record")
async def record(job: consumers.Job) -> None:
    """Writes its effect, once per key, in the transaction that completes the job."""
    await asyncio.sleep(float(job.payload.get("seconds", 0)))
    async with job.transaction() as tx:
        if await tx.once(f"record:{job.payload['key']}"):
            await tx.execute(
                "INSERT INTO effects (key, job_id, worker, pid) VALUES (%s, %s, %s, %s)",
                [job.payload["key"], job.id, job.worker, os.getpid()],
            )


@consumers.handler("crash")
async def crash(job: consumers.Job) -> None:
    """Kills its own worker process, the way an out-of-memory kill would."""
    os.kill(os.getpid(), 9)


@consumers.handler("always_fails", max_attempts=3, backoff=consumers.Backoff(base=0.1, cap=0.2))
async def always_fails(job: consumers.Job) -> None:
    raise RuntimeError(f"attempt {job.attempt} failed")


def _span(job: consumers.Job) -> None:
    """Marks its start and end in the test's `spans` table, sleeping in between: a
    test reads whether two attempts of one job ever ran at once."""
    with job.connection() as conn:
        conn.execute(
            "INSERT INTO spans (job_id, generation, pid) VALUES (%s, %s, %s)",
            [job.id, job.generation, os.getpid()],
        )
    time.sleep(float(job.payload.get("seconds", 1)))
    with job.connection() as conn:
        conn.execute(
            "UPDATE spans SET ended_at = clock_timestamp() WHERE job_id = %s AND generation = %s",
            [job.id, job.generation],
        )


_QUICK = consumers.Backoff(base=0.1, cap=0.2)
consumers.handler("span", queue="sync", backoff=_QUICK)(_span)
consumers.handler("span_limited", queue="sync", timeout=2, backoff=_QUICK)(_span)


@consumers.handler("stubborn")
async def stubborn(job: consumers.Job) -> None:
    """Ignores every cancellation: a handler no stop can interrupt."""
    while True:
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            continue


@consumers.handler("tx_returns")
async def tx_returns(job: consumers.Job) -> dict[str, str]:
    """Returns a value after its transaction committed: too late to store it."""
    async with job.transaction() as tx:
        tx.set_result({"stored": "yes"})
    return {"stored": "no"}


@consumers.handler("echo")
async def echo(job: consumers.Job) -> object:
    """Returns its payload as its result, after ``seconds``."""
    await asyncio.sleep(float(job.payload.get("seconds", 0)))
    return job.payload
