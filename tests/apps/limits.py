"""Handlers for `consumer --app tests.apps.limits`: each records when it started
(the database's clock_timestamp(), in a connection of its own that commits at once)
and the payload it saw, in ``starts``."""

from __future__ import annotations

import asyncio
import json

from hybrid_jobs import consumers

STARTS_TABLE = """
CREATE TABLE IF NOT EXISTS starts (
    job_id  uuid NOT NULL,
    worker  text NOT NULL,
    payload jsonb NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
_INSERT = "INSERT INTO starts (job_id, worker, payload) VALUES (%s, %s, %s::jsonb)"


async def _stamp(job: consumers.Job) -> None:
    async with job.connection() as conn:
        await conn.execute(_INSERT, [job.id, job.worker, json.dumps(job.payload)])
    await asyncio.sleep(
        float(job.payload.get("seconds", 0)) if isinstance(job.payload, dict) else 0
    )


@consumers.handler("stamp")
async def stamp(job: consumers.Job) -> None:
    await _stamp(job)


@consumers.handler("paced", rate_limit="paced")
async def paced(job: consumers.Job) -> None:
    """Under the rate limit "paced", set by its handler."""
    await _stamp(job)
