"""Handlers for the queue limit tests: `consumer --app tests.apps.queue_limit
--queue-limit reports=3`.

``report`` and ``chart``, two types of queue ``reports``, record their runs in
``queue_limit_runs`` (tests/apps/recorded.py), so the most runs of the queue at once
can be read from the handlers' own clock. ``unlimited`` is of queue ``default``.
"""

from __future__ import annotations

import asyncio

from hybrid_jobs import consumers
from tests.apps.recorded import most_at_once, recorded_run, runs_table

QUEUE = "reports"
LIMIT = 3

RUNS_TABLE = runs_table("queue_limit_runs")
MOST_AT_ONCE = most_at_once("queue_limit_runs")


@consumers.handler("report", queue=QUEUE, max_attempts=3)
async def report(job: consumers.Job) -> None:
    await recorded_run(job, "queue_limit_runs")


@consumers.handler("chart", queue=QUEUE, max_attempts=3)
async def chart(job: consumers.Job) -> None:
    await recorded_run(job, "queue_limit_runs")


@consumers.handler("unlimited")
async def unlimited(job: consumers.Job) -> None:
    await asyncio.sleep(float((job.payload or {}).get("seconds", 0.01)))
