"""Batch handlers for tests that run a real `consumer --app tests.apps.batches`
process: each call records its batch in ``batch_calls`` (BATCH_CALLS_TABLE), so the
test sees which jobs ran together, in which process."""

from __future__ import annotations

import asyncio
import os

from hybrid_jobs import consumers

BATCH_CALLS_TABLE = """
CREATE TABLE IF NOT EXISTS batch_calls (
    pid int NOT NULL,
    job_ids uuid[] NOT NULL,
    attempts int[] NOT NULL
)"""
_RECORD = "INSERT INTO batch_calls (pid, job_ids, attempts) VALUES (%s, %s, %s)"


@consumers.handler("batch_plain", batch=50, batch_wait=0.3)
def batch_plain(jobs: list[consumers.Job]) -> None:
    """Records its batch, and succeeds for every job."""
    with jobs[0].connection() as conn:
        conn.execute(_RECORD, [os.getpid(), [j.id for j in jobs], [j.attempt for j in jobs]])


@consumers.handler("batch_hang", batch=10, batch_wait=0.5)
async def batch_hang(jobs: list[consumers.Job]) -> None:
    """Records its batch; at a first attempt it then hangs (to be killed there)."""
    async with jobs[0].connection() as conn:
        await conn.execute(_RECORD, [os.getpid(), [j.id for j in jobs], [j.attempt for j in jobs]])
    if any(j.attempt == 1 for j in jobs):
        await asyncio.sleep(600)
