"""Handlers for the concurrency limit tests: `consumer --app tests.apps.concurrency`.

``capped`` (``global_limit=3``) records its runs in ``limit_runs``
(tests/apps/recorded.py), so the most runs at once can be read from the handlers'
own clock.
"""

from __future__ import annotations

import asyncio

from hybrid_jobs import consumers
from tests.apps.recorded import most_at_once, recorded_run, runs_table

LIMIT = 3

RUNS_TABLE = runs_table("limit_runs")
MOST_AT_ONCE = most_at_once("limit_runs")


@consumers.handler("capped", global_limit=LIMIT, max_attempts=3)
async def capped(job: consumers.Job) -> None:
    await recorded_run(job, "limit_runs")


@consumers.handler("free")
async def free(job: consumers.Job) -> None:
    await asyncio.sleep(float((job.payload or {}).get("seconds", 0.01)))
