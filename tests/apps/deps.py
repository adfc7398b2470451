"""Handlers for the dependency tests: `consumer --app tests.apps.deps`.

``step`` stamps a ``dep_runs`` row as it starts and as it ends (each in a
connection of its own that commits at once, so what ran when is known whatever
became of the attempt), keeps the parent results it read, and returns
``{"name": ...}``. ``payload.fail``: it fails for good; ``payload.seconds``: how
long it runs. ``sync_step`` is the same in a plain handler.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from hybrid_jobs import consumers

RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS dep_runs (
    job_id      uuid NOT NULL,
    name        text,
    worker      text NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at    timestamptz,
    parents     jsonb
)
"""


def _results(results: Any) -> str:
    return json.dumps([[str(k), v] for k, v in results.items()])


@consumers.handler("step", max_attempts=1)
async def step(job: consumers.Job) -> object:
    payload = job.payload or {}
    results = await job.parent_results()
    async with job.connection() as conn:
        await conn.execute(
            "INSERT INTO dep_runs (job_id, name, worker, parents) VALUES (%s, %s, %s, %s)",
            [job.id, payload.get("name"), job.worker, _results(results)],
        )
    await asyncio.sleep(float(payload.get("seconds", 0)))
    async with job.connection() as conn:
        await conn.execute(
            "UPDATE dep_runs SET ended_at = clock_timestamp() WHERE job_id = %s", [job.id]
        )
    if payload.get("fail"):
        raise consumers.Permanent("asked to fail", code="ASKED")
    return {"name": payload.get("name")}


@consumers.handler("sync_step", queue="sync", max_attempts=1)
def sync_step(job: consumers.Job) -> object:
    payload = job.payload or {}
    results = job.parent_results()
    with job.connection() as conn:
        conn.execute(
            "INSERT INTO dep_runs (job_id, name, worker, parents, ended_at)"
            " VALUES (%s, %s, %s, %s, clock_timestamp())",
            [job.id, payload.get("name"), job.worker, _results(results)],
        )
    time.sleep(float(payload.get("seconds", 0)))
    return {"name": payload.get("name"), "sync": True}
