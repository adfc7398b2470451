"""The handlers both a test's and a benchmark's consumer run, registered on import:
`tests.apps.basic` and `bench.apps` re-export them, so a job type means the same in
either."""

from __future__ import annotations

import asyncio

from hybrid_jobs import consumers


@consumers.handler("noop")
async def noop(job: consumers.Job) -> None:
    return None


@consumers.handler("sleep")
async def sleep(job: consumers.Job) -> None:
    """Waits, using no CPU (bench.spread: how a burst spreads over consumers)."""
    await asyncio.sleep(float(job.payload.get("seconds", 1)))
