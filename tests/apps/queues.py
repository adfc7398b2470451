"""Handlers on three queues, for `consumer --app tests.apps.queues` in the tests of
a queue that fails while the others carry on (tests/test_queue_failures.py)."""

from __future__ import annotations

from hybrid_jobs import consumers


@consumers.handler("healthy_noop", queue="healthy")
async def healthy_noop(job: consumers.Job) -> None:
    return None


@consumers.handler("refused_noop", queue="refused")
async def refused_noop(job: consumers.Job) -> None:
    return None


@consumers.handler("stuck_noop", queue="stuck")
async def stuck_noop(job: consumers.Job) -> None:
    return None
