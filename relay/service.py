"""The relay daemon: listens for NOTIFY, drains the outbox into RabbitMQ, prunes.

Tasks, all in one event loop:

- the listener holds a LISTEN connection and wakes a drainer on every commit that
  added wake-ups (and all of them after it reconnects, in case it missed some);
- ``publishers`` drainers each loop: claim a batch, publish it, commit. A
  notification wakes one idle drainer; one that finds a full batch goes again at
  once and wakes another to help, otherwise it waits for a notification or the
  poll interval, whichever comes first;
- the pruner deletes sent rows past their retention;
- the sweeper moves jobs whose lease expired without a report on (RETRY_WAIT,
  FAILED or CANCELLED), and the re-waker queues a new wake-up for due jobs whose
  wake-up was lost; these chores run in one relay at a time (an advisory lock);
- the scheduler fires due occurrences of recurring schedules (every relay does, the
  database arbitrates: relay/schedules.py);
- a stats line every ``stats_interval`` says how much went out and what is waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from plumbing.db import listen_connection, make_pool
from plumbing.transient import retry_forever, unless_stopped
from relay.broker import Publisher
from relay.drain import drain_batch
from relay.maintenance import prune_sent, rewake_stranded, sweep_expired
from relay.schedules import fire_due
from relay.settings import RelaySettings
from schema.tables import OUTBOX_CHANNEL

log = logging.getLogger("relay")

OUTBOX_BACKLOG = """
SELECT count(*), EXTRACT(EPOCH FROM now() - min(available_at))
FROM outbox WHERE sent_at IS NULL AND available_at <= now()
"""


class Relay:
    def __init__(self, settings: RelaySettings) -> None:
        self.settings = settings
        self.publisher = Publisher(settings.amqp, settings.topology)
        self.pool = make_pool(settings.database, "relay", max_size=settings.publishers + 2)
        self.wakes = [asyncio.Event() for _ in range(settings.publishers)]
        self.idle: list[asyncio.Event] = []
        # Set when work arrived while every drainer was busy.
        self.more = False
        self.stopping = False
        self.published = 0

    def nudge(self) -> None:
        """Wake one idle drainer: one commit's wake-ups rarely need two."""
        if self.idle:
            self.idle.pop().set()
        else:
            self.more = True

    def wake_all(self) -> None:
        for event in self.wakes:
            event.set()

    async def run(self, stop: asyncio.Event) -> None:
        log.info(
            "relay.starting",
            extra={
                "database": self.settings.database.redacted(),
                "amqp": self.settings.amqp.redacted(),
                "exchange": self.settings.topology.exchange_name,
                "publishers": self.settings.publishers,
                "batch_size": self.settings.batch_size,
            },
        )
        await self.pool.open(wait=False)
        if not await unless_stopped(stop, self._connect()):
            await self.publisher.close()
            await self.pool.close()
            log.info("relay.stopped", extra={"published": 0})
            return
        drainers = [asyncio.create_task(self._drainer(ev)) for ev in self.wakes]
        chores = [
            asyncio.create_task(self._listen()),
            asyncio.create_task(self._every(self.settings.prune_interval, self._prune)),
            asyncio.create_task(self._every(self.settings.sweep_interval, self._sweep)),
            asyncio.create_task(self._every(self.settings.rewake_interval, self._rewake)),
            asyncio.create_task(self._every(self.settings.schedule_interval, self._schedules)),
            asyncio.create_task(self._report()),
        ]
        log.info("relay.started")
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([stopped, *drainers], return_when=asyncio.FIRST_COMPLETED)
        await self._shutdown(drainers, chores)

    async def _connect(self) -> None:
        async for attempt in retry_forever(log, "relay.broker_connect_failed"):
            with attempt:
                await self.publisher.connect()

    async def _shutdown(
        self, drainers: list[asyncio.Task[None]], chores: list[asyncio.Task[None]]
    ) -> None:
        log.info("relay.stopping")
        self.stopping = True
        self.wake_all()
        # A drainer mid-batch finishes it (publish and commit); one stuck retrying an
        # outage is cancelled, and its uncommitted batch simply stays unsent.
        _, pending = await asyncio.wait(drainers, timeout=self.settings.publish_timeout + 2)
        for task in [*pending, *chores]:
            task.cancel()
        await asyncio.gather(*drainers, *chores, return_exceptions=True)
        await self.publisher.close()
        await self.pool.close()
        log.info("relay.stopped", extra={"published": self.published})

    async def _drainer(self, wake: asyncio.Event) -> None:
        s = self.settings
        retrying = retry_forever(log, "relay.drain_failed")
        while not self.stopping:
            async for attempt in retrying:
                with attempt:
                    sent = await drain_batch(
                        self.pool,
                        self.publisher,
                        limit=s.batch_size,
                        publish_timeout=s.publish_timeout,
                    )
            self.published += sent
            if sent == s.batch_size:
                self.nudge()  # a full batch: there is likely more, take a helper along
                continue
            if self.more:
                self.more = False
                continue
            wake.clear()
            self.idle.append(wake)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), s.poll_interval)
            finally:
                if wake in self.idle:
                    self.idle.remove(wake)

    async def _listen(self) -> None:
        async for attempt in retry_forever(log, "relay.listen_failed"):
            with attempt:
                async with await listen_connection(self.settings.database, "relay-listen") as conn:
                    await conn.execute(f"LISTEN {OUTBOX_CHANNEL}")
                    log.info("relay.listening", extra={"channel": OUTBOX_CHANNEL})
                    # Whatever was committed while we were not listening.
                    self.wake_all()
                    async for _ in conn.notifies():
                        self.nudge()

    async def _every(self, interval: float, chore: Callable[[], Awaitable[None]]) -> None:
        while True:
            async for attempt in retry_forever(log, "relay.chore_failed"):
                with attempt:
                    await chore()
            await asyncio.sleep(interval)

    async def _prune(self) -> None:
        await prune_sent(
            self.pool, retention=self.settings.retention, batch=self.settings.prune_batch
        )

    async def _sweep(self) -> None:
        await sweep_expired(self.pool, batch=self.settings.sweep_batch)

    async def _rewake(self) -> None:
        s = self.settings
        await rewake_stranded(
            self.pool, self.publisher, grace=s.rewake_interval, batch=s.rewake_batch
        )

    async def _schedules(self) -> None:
        await fire_due(self.pool)

    async def _report(self) -> None:
        while True:
            started, before = time.monotonic(), self.published
            await asyncio.sleep(self.settings.stats_interval)
            async for attempt in retry_forever(log, "relay.stats_failed"):
                with attempt:
                    async with self.pool.connection() as conn:
                        row = await (await conn.execute(OUTBOX_BACKLOG)).fetchone()
            due, oldest = row if row else (0, None)
            sent = self.published - before
            log.info(
                "relay.stats",
                extra={
                    "published": sent,
                    "per_second": round(sent / (time.monotonic() - started), 1),
                    "outbox_due": due,
                    "oldest_due_s": round(float(oldest), 1) if oldest is not None else None,
                },
            )
