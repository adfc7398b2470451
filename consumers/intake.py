"""How much this worker takes in.

It holds at most ``concurrency + prefetch`` job ids: running, or delivered and
waiting for a slot (the prefetch grows while the jobs are short:
consumers/prefetch.py). RabbitMQ pushes at most two messages ahead (its QoS counts
messages, not ids) and the relay packs at most half the smallest prefetch of a
queue's consumers into one message (WORKER_PACK_LIMIT), so that is normally all a
consumer is sent. A message that brings more (a relay run with a fixed --pack, a
small consumer beside large ones) is split: the ids there is room for are kept, and
the rest are handed back at once, for the other consumers.

A hand-back goes through the table (OUTBOX_HAND_BACK): each id's wake-up returns to
the outbox's backlog, due now, and the relay decides again what to send where. The
table decides what runs next (priority, fair share, the window); a message
republished by the consumer would skip that decision, and the window would count
its ids twice. A message cannot be partly acknowledged, so it is acked once every
id in it is claimed, explained or handed back. If the hand-back fails (the database
away), those ids are declined instead and their message goes back to RabbitMQ.

A message that finds no room at all means RabbitMQ keeps choosing this worker while
it is full: consuming pauses until there is room again, so the wake-ups go to the
others rather than round a loop through the relay.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence

from hybrid_jobs.consumers.inbox import Inbox
from hybrid_jobs.consumers.prefetch import Prefetch
from hybrid_jobs.consumers.settings import ConsumerSettings
from hybrid_jobs.consumers.store import JobStore
from hybrid_jobs.plumbing.logfmt import describe_error

log = logging.getLogger("consumer")

# A hand-back waits at most this long (it may wait for a relay's publish to commit).
HAND_BACK_TIMEOUT = 10.0


class Intake:
    def __init__(
        self, settings: ConsumerSettings, store: JobStore, inbox: Inbox, prefetch: Prefetch
    ) -> None:
        self.concurrency = settings.concurrency
        self.prefetch = prefetch
        self.store = store
        self.inbox = inbox
        # Consuming is paused for want of room (not for an outage, nor the stop).
        self.full = False
        self._lock = asyncio.Lock()

    @property
    def capacity(self) -> int:
        """The most ids this worker holds now: its slots and its prefetch."""
        return self.concurrency + self.prefetch.ids

    def room(self, held: int) -> int:
        """How many more ids this worker may take, holding ``held``."""
        return max(0, self.capacity - held)

    async def hand_back(self, job_ids: Sequence[uuid.UUID], delay: float = 0.0) -> bool:
        """Return these wake-ups to the outbox's backlog, due in ``delay`` seconds;
        False if that failed."""
        try:
            async with asyncio.timeout(HAND_BACK_TIMEOUT):
                await self.store.hand_back(job_ids, delay)
        except Exception as exc:
            log.warning(
                "consumer.hand_back_failed",
                extra={
                    "jobs": len(job_ids),
                    "error": describe_error(exc),
                    "action": "their message goes back to the queue instead",
                },
            )
            return False
        log.debug("consumer.handed_back", extra={"jobs": len(job_ids)})
        return True

    async def stop_while_full(self) -> None:
        """A message found no room: take no more until there is some."""
        async with self._lock:
            if not self.full:
                self.full = True
                await self.inbox.pause()
                log.debug("consumer.intake_paused", extra={"why": "no room for more job ids"})

    async def resume_if_room(self, held: int, may_consume: bool) -> None:
        """Consume again once there is room (and nothing else keeps consuming off)."""
        if not self.full or held >= self.capacity:
            return
        async with self._lock:
            if self.full and held < self.capacity:
                self.full = False
                if may_consume:
                    await self.inbox.start()
                log.debug("consumer.intake_resumed", extra={"held": held})
