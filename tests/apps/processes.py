"""Handlers for `consumer --processes N --app tests.apps.processes`.

Each run writes one row to ``runs`` as it starts, in a connection of its own that
commits at once: a job whose handler ran twice (say, given back by a recycling
worker while still running, and claimed again) shows two rows, whatever became of
its outcome. ``hog`` keeps what it allocates, the way a leaking handler does.
"""

from __future__ import annotations

import asyncio
import os
import time

from hybrid_jobs import consumers

RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS runs (
    job_id uuid NOT NULL,
    worker text NOT NULL,
    pid    int NOT NULL,
    kind   text NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
_INSERT = "INSERT INTO runs (job_id, worker, pid, kind) VALUES (%s, %s, %s, %s)"

_kept: list[bytearray] = []


@consumers.handler("run_async")
async def run_async(job: consumers.Job) -> None:
    async with job.connection() as conn:
        await conn.execute(_INSERT, [job.id, job.worker, os.getpid(), "async"])
    await asyncio.sleep(float(job.payload.get("seconds", 0.05)))


@consumers.handler("run_plain", queue="sync")
def run_plain(job: consumers.Job) -> None:
    with job.connection() as conn:
        conn.execute(_INSERT, [job.id, job.worker, os.getpid(), "plain"])
    time.sleep(float(job.payload.get("seconds", 0.05)))


@consumers.handler("hog")
async def hog(job: consumers.Job) -> None:
    """Allocates ``mib`` MiB and keeps it for the life of the process."""
    async with job.connection() as conn:
        await conn.execute(_INSERT, [job.id, job.worker, os.getpid(), "hog"])
    chunk = bytearray(int(job.payload.get("mib", 16)) * 2**20)
    chunk[::4096] = b"x" * len(chunk[::4096])  # touch every page: resident, not reserved
    _kept.append(chunk)
    await asyncio.sleep(float(job.payload.get("seconds", 0)))


@consumers.handler("hog_plain", queue="sync")
def hog_plain(job: consumers.Job) -> None:
    with job.connection() as conn:
        conn.execute(_INSERT, [job.id, job.worker, os.getpid(), "hog"])
    chunk = bytearray(int(job.payload.get("mib", 16)) * 2**20)
    chunk[::4096] = b"x" * len(chunk[::4096])
    _kept.append(chunk)
    time.sleep(float(job.payload.get("seconds", 0)))
