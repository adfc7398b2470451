"""A handler only some consumers have, for the tests of refused wake-ups
(tests/test_refusals.py): `consumer --app tests.apps.refusals` knows "rare",
`consumer --app tests.apps.basic` does not."""

from __future__ import annotations

import asyncio

from hybrid_jobs import consumers


@consumers.handler("rare")
async def rare(job: consumers.Job) -> None:
    await asyncio.sleep(float(job.payload.get("seconds", 0)))
