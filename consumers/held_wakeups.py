"""Keeping the marks of the wake-ups this worker holds fresh.

A wake-up delivered here and not claimed yet (every slot is busy) looks, to the
relay's re-waker, like one sent long ago and never taken up: past its grace (relay
--rewake-interval) the re-waker would take it for lost and send it again. So every
few seconds one statement marks every wake-up held here as sent now
(OUTBOX_HELD_REFRESH). When this worker dies, its marks stop moving and RabbitMQ
hands its messages to another consumer; the re-waker stays the backstop.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from hybrid_jobs.consumers.store import JobStore
from hybrid_jobs.plumbing.logfmt import describe_error

log = logging.getLogger("consumer")

# At most this long between two refreshes (less if the heartbeat is shorter): well
# inside the relay's default grace of 30 s.
REFRESH_SECONDS = 5.0


class HeldWakeups:
    def __init__(self, store: JobStore, held: Callable[[], list[uuid.UUID]], every: float) -> None:
        self.store = store
        self.held = held
        self.every = every

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            job_ids = self.held()
            if not job_ids:
                continue
            try:
                await self.store.refresh_held(job_ids)
            except Exception as exc:  # the next round tries again; the re-waker is safe
                log.warning("consumer.held_refresh_failed", extra={"error": describe_error(exc)})
