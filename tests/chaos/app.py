"""Handlers for fault and chaos runs: `consumer --app tests.chaos.app`.

``effect`` performs its effect the way the docs tell users to: under the job's
domain key, in the transaction that completes the job. It records which worker and
generation applied it, so the invariant checker can tell a stale write from a
current one. The effects table has no unique key on purpose: a duplicate effect
must be visible, not prevented by the table.
"""

from __future__ import annotations

import asyncio
import random

from hybrid_jobs import consumers

EFFECTS_TABLE = """
CREATE TABLE IF NOT EXISTS chaos_effects (
    key        text NOT NULL,
    job_id     uuid NOT NULL,
    generation bigint NOT NULL,
    worker     text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


@consumers.handler("effect", max_attempts=25, backoff=consumers.Backoff(base=0.2, cap=2))
async def effect(job: consumers.Job) -> None:
    payload = job.payload
    await asyncio.sleep(float(payload.get("seconds", random.uniform(0, 0.02))))
    if random.random() < float(payload.get("fail_rate", 0)):
        raise RuntimeError("an injected failure")
    async with job.transaction() as tx:
        if await tx.once(f"effect:{payload['key']}"):
            await tx.execute(
                "INSERT INTO chaos_effects (key, job_id, generation, worker)"
                " VALUES (%s, %s, %s, %s)",
                [payload["key"], job.id, job.generation, job.worker],
            )


@consumers.handler("always_fails", max_attempts=3, backoff=consumers.Backoff(base=0.1, cap=0.2))
async def always_fails(job: consumers.Job) -> None:
    raise RuntimeError(f"poison payload, attempt {job.attempt}")


@consumers.handler("crash", max_attempts=2)
async def crash(job: consumers.Job) -> None:
    """Kills its own worker process, the way an out-of-memory kill would."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


@consumers.handler("permanent")
async def permanent(job: consumers.Job) -> None:
    raise consumers.Permanent("bad input", code="BAD_INPUT")


@consumers.handler("cancellable")
async def cancellable(job: consumers.Job) -> None:
    """Runs until someone asks it to stop, then acknowledges the cancel."""
    while not job.cancel_requested:
        await asyncio.sleep(0.05)
    raise consumers.Cancel("stopped on request")
