"""A handler only some consumers have, for the tests of refused wake-ups
(tests/test_refusals.py): `consumer --app tests.apps.refusals` knows "rare",
`consumer --app tests.apps.basic` does not."""

from __future__ import annotations

import asyncio

from hybrid_jobs import consumers


@consumers.handler("rare")
async def rare(job: consumers.Job) -> None:
    """Sleeps ``seconds``; from its second attempt on, ``then`` if given (a job
    whose consumer was killed runs quickly when it runs again)."""
    then = job.payload.get("then") if job.attempt > 1 else None
    await asyncio.sleep(float(then if then is not None else job.payload.get("seconds", 0)))
