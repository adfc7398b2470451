"""The relay daemon: decides which wake-ups to send, sends them, keeps the record.

Tasks, all in one event loop:

- the listener holds a LISTEN connection and wakes a drainer on every commit that
  added due wake-ups or freed a tenant's slot (and all of them after it reconnects,
  in case it missed some);
- ``publishers`` drainers each loop over the queues with due wake-ups and wake each
  (relay/wake.py): within the queue's window, in priority and fair-share order,
  published and committed together; a queue whose own publishes fail (RabbitMQ
  refuses them, say) is backed off alone (relay/backoff.py). A queue one drainer
  is waking is left to it, and it goes again at once if the queue was asked for
  meanwhile. One that sent a full batch goes again at once and wakes another to
  help; one held back by a full window looks again soon (a consumer's claim frees
  room, and tells nobody);
  otherwise it waits for a notification or the poll interval. A pass takes the
  queues a notification named, else those that had more last time, and looks at
  every queue with due wake-ups when it knows of none, when asked, and at least
  once per poll interval;
- chores, each in one relay at a time (relay/maintenance.py): the sweeper moves
  jobs whose lease expired on, and ends waiting jobs past their deadline that
  nobody wakes (expires, code EXPIRED); the re-waker sends lost wake-ups again; the orphan
  walk gives a wake-up to any due job that has none, a slice of the jobs table at a
  time; wake-ups turned down for want of a handler are brought forward once a
  consumer with the handler has a free slot; the reconciler repairs tenants' slot
  counts; the usage counter counts waiting jobs for backpressure; stale consumers
  and relays are forgotten; retention deletes finished jobs older than
  --keep-finished (relay/retention.py);
- a heartbeat keeps this relay's row in ``relays`` fresh: live, connected to
  RabbitMQ or not, how much it published, which queues it cannot publish to
  (relay/presence.py);
- the scheduler fires due occurrences of recurring schedules (every relay does, the
  database arbitrates: relay/schedules.py), and sleeps until the next one is due;
- a stats line every ``stats_interval`` says how much went out and, per queue, what
  waits in the backlog and what is in flight;
- with a webhook secret, the deliverer calls the completion webhooks of jobs that
  ended, each call a task of its own holding no connection (relay/webhooks.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import psycopg
from psycopg import sql

from hybrid_jobs import defaults
from hybrid_jobs.plumbing.db import RELAY_OPTIONS, listen_connection, make_pool
from hybrid_jobs.plumbing.stopping import cancel_and_wait
from hybrid_jobs.plumbing.transient import retried, retry_forever, unless_stopped
from hybrid_jobs.relay.backoff import QueueBackoff
from hybrid_jobs.relay.broker import Publisher, QueueFailure
from hybrid_jobs.relay.maintenance import (
    OrphanWalk,
    expire_waiting,
    expire_workers,
    reconcile_tenant_slots,
    refresh_tenant_usage,
    rewake_lost,
    sweep_expired,
    wake_orphans,
    wake_refused,
)
from hybrid_jobs.relay.presence import announce, forget, make_relay_id
from hybrid_jobs.relay.retention import (
    delete_finished,
    delete_old_effects,
    delete_old_webhook_calls,
    delete_unreferenced_inputs,
)
from hybrid_jobs.relay.schedules import fire_due, seconds_until_due
from hybrid_jobs.relay.settings import RelaySettings
from hybrid_jobs.relay.wake import WakeLimits, due_queues, wake_queue
from hybrid_jobs.relay.webhooks import Deliverer
from hybrid_jobs.schema.queries import OUTBOX_BACKLOG, WEBHOOK_DELIVERY_OWED
from hybrid_jobs.schema.tables import (
    INSTANCE_SCHEMA_SQL,
    OUTBOX_CHANNEL,
    TENANT_SLOTS_FREED,
    channel,
)

log = logging.getLogger("relay")

# A relay without a webhook secret looks for calls owed this often, and warns of
# them at most this often.
_OWED_CHECK_SECONDS: Final = 60.0
_OWED_WARN_SECONDS: Final = 600.0


def nudged(payload: str, backlogged: set[str]) -> set[str] | None:
    """The queues a notification on the outbox channel sends a drainer to (none: no
    pass at all); None for every queue with wake-ups due (a scan for them). Its
    payload names queues (comma-separated), or none (any), or is TENANT_SLOTS_FREED:
    a tenant's slot freed, which matters only to the queues whose last pass held
    wake-ups back. Under tenant caps every end of a lease frees one: a scan each time
    cost more than the decisions it led to, and a pass each time, where this relay
    held nothing back, doubled the passes of a capped queue at low load for nothing
    (:meth:`Relay.nudge` scans at most every quarter poll interval for such a slot)."""
    if payload == TENANT_SLOTS_FREED:
        return set(backlogged)
    return set(payload.split(",")) if payload else None


@dataclass(frozen=True)
class _Pass:
    sent: int
    # Some queue sent a whole batch: there is likely more right now.
    full: bool
    # Some queue held due wake-ups back (or was being served by another drainer).
    held: bool
    # Some queue had room but too little to be worth a decision yet (it waits for
    # a quarter of its window): it will soon, so keep looking at the short interval.
    filling: bool = False
    # A queue of this pass was asked for again while it was being woken: go again.
    again: bool = False


class Relay:
    def __init__(self, settings: RelaySettings) -> None:
        s = settings
        self.settings = settings
        self.relay_id = make_relay_id()
        self.publisher = Publisher(s.amqp, s.topology)
        self.pool = make_pool(s.database, "relay", max_size=s.pool_size, options=RELAY_OPTIONS)
        self.limits = WakeLimits(
            batch=s.batch_size,
            window=s.window,
            min_window=s.min_window,
            pack=s.pack,
            publish_timeout=s.publish_timeout,
            worker_ttl=s.worker_ttl,
        )
        self.wakes = [asyncio.Event() for _ in range(s.publishers)]
        self.idle: list[asyncio.Event] = []
        # Set when work arrived while every drainer was busy.
        self.more = False
        # Queues a notification or the last pass named, to wake without looking for
        # them; a pass with none (a poll, a notification naming nothing) looks at
        # every queue with due wake-ups.
        self.hinted: set[str] = set()
        self.look_everywhere = True
        # Queues whose last pass left due wake-ups behind: a helper woken while
        # another drainer took the hints goes there. Looking everywhere costs a scan
        # of the outbox's unsent index (the relay's dearest statement under a
        # backlog), so it happens when asked for, when nothing is known, and at
        # least every poll interval (wake-ups of delayed jobs come due silently).
        self.backlogged: set[str] = set()
        self.scanned_at = 0.0
        # Queues a drainer of this relay is waking now, and those asked for again
        # meanwhile. Another drainer leaves such a queue to the one waking it, which
        # goes again as soon as it has committed: a second pass would only find the
        # queue's lock taken, and then wait out a refill interval before looking
        # again (at 200 jobs/s one queue, half the passes did, each a statement for
        # nothing and a wait of 5 ms or more for the jobs behind it).
        self.waking: set[str] = set()
        self.asked_again: set[str] = set()
        # Passes that found a queue's lock held by another relay.
        self.busy_passes = 0
        # Queues whose own failure (RabbitMQ refused them, their decision timed out)
        # keeps them backed off; every other queue carries on.
        self.backoff = QueueBackoff(s.queue_backoff, s.queue_backoff_cap)
        self.stopping = False
        # the drainers and chores, cancelled on the way out however the relay stops
        self.tasks: list[asyncio.Task[None]] = []
        self.published = 0
        self.turn = 0
        # The orphan backstop's place in its walk of the jobs table.
        self.orphans = OrphanWalk()
        # Rounds each chore completed, by name: a test waits on these, not on time.
        self.rounds: Counter[str] = Counter()
        # The webhook calls' deliverer, once started (it needs a secret).
        self.webhooks: Deliverer | None = None

    def nudge(self, queues: str = "") -> None:
        """Wake one idle drainer (one commit's wake-ups rarely need two) for the
        queues a notification names (:func:`nudged`)."""
        named = nudged(queues, self.backlogged)
        if named is None:
            self.look_everywhere = True
        elif not named:
            # A freed slot, and nothing this relay held back waits for it. Another
            # relay that held a queue back may be gone or stalled, or a wake-up may
            # have come due without a notification: a scan covers both, at most
            # every quarter poll interval, not one per end of a lease.
            if time.monotonic() - self.scanned_at < self.settings.poll_interval / 4:
                return
            self.look_everywhere = True
        else:
            self.hinted.update(named)
        self._wake_one()

    def _wake_one(self) -> None:
        if self.idle:
            self.idle.pop().set()
        else:
            self.more = True

    def wake_all(self) -> None:
        self.look_everywhere = True
        for event in self.wakes:
            event.set()

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self._run(stop)
        finally:
            # Also when a second signal cancels the relay mid-way: its tasks are
            # cancelled before the pool closes (else they retry against a closed
            # pool), and the pool is closed here, since a psycopg_pool worker
            # cancelled while it opens a connection swallows the cancel and waits
            # on its queue for ever: the event loop could not close.
            stuck = await cancel_and_wait(self.tasks, within=defaults.POOL_CLOSE_SECONDS)
            if stuck:
                log.error(
                    "relay.task_ignored_cancel", extra={"tasks": [t.get_name() for t in stuck]}
                )
            if not self.pool.closed:
                await self.pool.close(timeout=defaults.POOL_CLOSE_SECONDS)

    async def _run(self, stop: asyncio.Event) -> None:
        s = self.settings
        log.info(
            "relay.starting",
            extra={
                "relay": self.relay_id,
                "database": s.database.redacted(),
                "amqp": s.amqp.redacted(),
                "exchange": s.topology.exchange_name,
                "publishers": s.publishers,
                "batch_size": s.batch_size,
                "window": s.window or f"auto (at least {s.min_window})",
                "pack": s.pack,
            },
        )
        if s.database.pooled and not s.database.listen:
            log.warning(
                "relay.listen_through_pooler",
                extra={
                    "detail": "DATABASE_POOLER=transaction without DATABASE_LISTEN_URL: "
                    "notifications cannot reach the relay through a transaction pooler, "
                    "so it finds new work by polling (--poll-interval); set "
                    "DATABASE_LISTEN_URL to a direct connection"
                },
            )
        await self.pool.open(wait=False)
        if not await unless_stopped(stop, self._connect()):
            await self.publisher.close()
            await self.pool.close(timeout=defaults.POOL_CLOSE_SECONDS)
            log.info("relay.stopped", extra={"published": 0})
            return
        drainers = [asyncio.create_task(self._drainer(ev)) for ev in self.wakes]
        chores = [
            asyncio.create_task(self._listen()),
            asyncio.create_task(self._every("sweep", s.sweep_interval, self._sweep)),
            asyncio.create_task(self._every("rewake", s.rewake_interval, self._rewake)),
            asyncio.create_task(self._every("orphans", s.orphan_interval, self._orphans)),
            asyncio.create_task(self._refusals()),
            asyncio.create_task(self._every("reconcile", s.reconcile_interval, self._reconcile)),
            asyncio.create_task(self._every("usage", s.usage_interval, self._usage)),
            asyncio.create_task(self._every("workers", s.worker_ttl / 3, self._workers)),
            asyncio.create_task(self._every("heartbeat", s.heartbeat_interval, self._heartbeat)),
            asyncio.create_task(self._scheduler()),
            asyncio.create_task(self._every("retention", s.retention_interval, self._retention)),
            asyncio.create_task(self._report()),
            asyncio.create_task(self._webhooks()),
        ]
        self.tasks = [*drainers, *chores]
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
        # Cancelled again if need be: psycopg_pool can swallow a cancel, and a chore
        # would then sleep out its interval before the relay could stop.
        stuck = await cancel_and_wait([*pending, *chores])
        if stuck:
            log.error("relay.task_ignored_cancel", extra={"tasks": [t.get_name() for t in stuck]})
        try:
            async with asyncio.timeout(2):
                await forget(self.pool, self.relay_id)
        except Exception as exc:  # the row expires on its own
            log.warning("relay.forget_failed", extra={"error": str(exc)})
        await self.publisher.close()
        await self.pool.close(timeout=defaults.POOL_CLOSE_SECONDS)
        log.info(
            "relay.stopped", extra={"published": self.published, "busy_passes": self.busy_passes}
        )

    # ------------------------------------------------------------------ draining

    async def _drainer(self, wake: asyncio.Event) -> None:
        s = self.settings
        refill = s.refill_interval
        while not self.stopping:
            done = await retried(self._pass, lambda: retry_forever(log, "relay.drain_failed"))
            self.published += done.sent
            self.rounds["drain"] += 1
            if done.full:
                # A full batch: there is likely more (its queues are hinted), take a
                # helper along.
                self._wake_one()
                continue
            if done.again:
                continue
            if self.more:
                self.more = False
                continue
            polling = not done.held
            if done.held:
                # Room in the window appears when consumers claim, and nobody says
                # so: look again soon (at the queues that held back), less often
                # while none appears.
                wait = refill
                refill = (
                    s.refill_interval
                    if done.sent or done.filling
                    else min(refill * 2, s.refill_interval_cap)
                )
            else:
                wait, refill = s.poll_interval, s.refill_interval
            retry = self.backoff.next_retry()
            if retry is not None and retry < wait:
                # A failing queue's backoff ends first: look everywhere then.
                wait, polling = retry, True
            wake.clear()
            self.idle.append(wake)
            try:
                await asyncio.wait_for(wake.wait(), wait)
            except TimeoutError:
                if polling:  # delayed wake-ups may be due now, in any queue
                    self.look_everywhere = True
            finally:
                if wake in self.idle:
                    self.idle.remove(wake)

    async def _pass(self) -> _Pass:
        stale = time.monotonic() - self.scanned_at >= self.settings.poll_interval
        if self.look_everywhere or stale or not (self.hinted or self.backlogged):
            self.look_everywhere = False
            self.hinted.clear()
            self.scanned_at = time.monotonic()
            queues = await due_queues(self.pool)
            self.backoff.keep_only(set(queues))
        elif self.hinted:
            queues, self.hinted = sorted(self.hinted), set()
        else:
            queues = sorted(self.backlogged)
        # A queue backed off for its own failure waits its turn out.
        queues = [queue for queue in queues if self.backoff.ready(queue)]
        if not queues:
            return _Pass(0, False, False)
        # Drainers start at different queues, so each queue's turn comes round.
        self.turn += 1
        start = self.turn % len(queues)
        sent, full, held, filling, again = 0, False, False, False, False
        for queue in queues[start:] + queues[:start]:
            if queue in self.waking:
                self.asked_again.add(queue)  # its drainer goes again after this pass
                continue
            self.waking.add(queue)
            try:
                woken = await wake_queue(self.pool, self.publisher, queue, self.limits)
            except QueueFailure as failure:
                # Its batch rolled back; the rest of the pass goes on.
                self.backoff.failed(failure)
                self.backlogged.discard(queue)
                continue
            finally:
                self.waking.discard(queue)
                if queue in self.asked_again:
                    self.asked_again.discard(queue)
                    self.hinted.add(queue)
                    again = True
            if woken.busy:
                self.busy_passes += 1
            else:
                self.backoff.succeeded(queue)
            sent += woken.sent
            more = woken.sent >= self.settings.batch_size
            full = full or more
            held = held or woken.held or woken.busy
            filling = filling or (woken.held and not woken.sent and woken.room > 0)
            if more or woken.held or woken.busy:
                self.hinted.add(queue)  # the next pass comes back to it
                self.backlogged.add(queue)
            else:
                self.backlogged.discard(queue)
        return _Pass(sent, full, held, filling, again)

    async def _listen(self) -> None:
        async for attempt in retry_forever(log, "relay.listen_failed"):
            with attempt:
                async with await listen_connection(self.settings.database, "relay-listen") as conn:
                    # The instance's channel: its schema as this connection finds it.
                    row = await (await conn.execute(f"SELECT {INSTANCE_SCHEMA_SQL}")).fetchone()
                    listened = channel(row[0] if row else "", OUTBOX_CHANNEL)
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(listened)))
                    log.info("relay.listening", extra={"channel": listened})
                    # Whatever was committed while we were not listening.
                    self.wake_all()
                    async for notice in conn.notifies():
                        if log.isEnabledFor(logging.DEBUG):
                            log.debug("relay.notified", extra={"t": time.time()})
                        self.nudge(notice.payload)

    # ------------------------------------------------------------------ chores

    async def _every(
        self, name: str, interval: float, chore: Callable[[], Awaitable[None]]
    ) -> None:
        while True:
            async for attempt in retry_forever(log, "relay.chore_failed"):
                with attempt:
                    await chore()
            self.rounds[name] += 1
            await asyncio.sleep(interval)

    async def _sweep(self) -> None:
        s = self.settings
        await sweep_expired(self.pool, batch=s.sweep_batch, default_backoff=s.default_backoff)
        await expire_waiting(self.pool, batch=s.sweep_batch)

    async def _rewake(self) -> None:
        s = self.settings
        woken = await rewake_lost(
            self.pool, self.publisher, grace=s.rewake_interval, worker_ttl=s.worker_ttl
        )
        if woken:
            self.nudge()  # any queue

    async def _orphans(self) -> None:
        s = self.settings
        woken = await wake_orphans(
            self.pool,
            self.orphans,
            grace=s.rewake_interval,
            size=s.orphan_slice,
            worker_ttl=s.worker_ttl,
        )
        if woken:
            self.nudge(",".join(sorted({queue for _, queue in woken})))

    async def _refusals(self) -> None:
        """Wake-ups refused for want of a handler wait until a consumer with it has a
        free slot: looked for every refusal_interval while some wait (a job's start
        after the slot frees waits for it), every poll interval otherwise."""
        s = self.settings
        while True:
            waiting = False
            async for attempt in retry_forever(log, "relay.chore_failed"):
                with attempt:
                    queues, waiting = await wake_refused(self.pool, worker_ttl=s.worker_ttl)
                    if queues:
                        self.nudge(",".join(sorted(set(queues))))
            self.rounds["refused"] += 1
            await asyncio.sleep(s.refusal_interval if waiting else s.poll_interval)

    async def _reconcile(self) -> None:
        await reconcile_tenant_slots(self.pool)

    async def _usage(self) -> None:
        await refresh_tenant_usage(self.pool)

    async def _workers(self) -> None:
        await expire_workers(self.pool, ttl=self.settings.worker_ttl)

    async def _heartbeat(self) -> None:
        await announce(
            self.pool,
            self.relay_id,
            connected=self.publisher.connected,
            published=self.published,
            failing=self.backoff.snapshot(),
        )

    async def _scheduler(self) -> None:
        """Fire what is due, then sleep until the next occurrence is due, or for the
        schedule interval when that is sooner (a schedule created meanwhile is seen
        within it). One still due right after firing is another relay's, being
        fired, or one that failed: those wait the interval, not a busy loop."""
        interval = self.settings.schedule_interval
        while True:
            wait: float | None = None
            async for attempt in retry_forever(log, "relay.chore_failed"):
                with attempt:
                    await fire_due(self.pool)
                    wait = await seconds_until_due(self.pool)
            self.rounds["schedules"] += 1
            await asyncio.sleep(interval if wait is None or wait <= 0 else min(wait, interval))

    async def _retention(self) -> None:
        s = self.settings
        await delete_finished(self.pool, keep_seconds=s.keep_finished, batch=s.retention_batch)
        await delete_unreferenced_inputs(
            self.pool, keep_seconds=s.keep_finished, batch=s.retention_batch
        )
        await delete_old_webhook_calls(
            self.pool, keep_seconds=s.keep_finished, batch=s.retention_batch
        )
        if s.keep_effects is not None:
            await delete_old_effects(
                self.pool, keep_seconds=s.keep_effects, batch=s.retention_batch
            )

    async def _webhooks_off(self) -> None:
        """No secret, so no call: said quietly at start (most installations call no
        URL), and as a warning whenever calls are owed, at most every ten minutes."""
        detail = (
            "no WEBHOOK_SECRET (or WEBHOOK_SECRET_FILE): this relay makes no webhook call,"
            " and calls owed wait (jobctl webhooks list)"
        )
        log.info("relay.webhooks_off", extra={"detail": detail})
        while True:
            await asyncio.sleep(_OWED_CHECK_SECONDS)
            try:
                async with self.pool.connection() as conn:
                    row = await (await conn.execute(WEBHOOK_DELIVERY_OWED)).fetchone()
            except psycopg.Error:
                continue  # the database is away: the wake-ups' loops say so
            if row and row[0]:
                log.warning("relay.webhook_calls_owed", extra={"count": row[0], "detail": detail})
                await asyncio.sleep(_OWED_WARN_SECONDS - _OWED_CHECK_SECONDS)

    async def _webhooks(self) -> None:
        """Call the webhooks of jobs that ended (relay/webhooks.py), in tasks of
        their own: a slow endpoint holds none of the wake-ups' connections."""
        secret = self.settings.webhook_secret
        if secret is None:
            await self._webhooks_off()
            return
        self.webhooks = Deliverer(self.pool, self.settings, self.relay_id, secret)
        await self.webhooks.run()

    async def _report(self) -> None:
        while True:
            started, before = time.monotonic(), self.published
            await asyncio.sleep(self.settings.stats_interval)
            async for attempt in retry_forever(log, "relay.stats_failed"):
                with attempt:
                    async with self.pool.connection() as conn:
                        rows = await (await conn.execute(OUTBOX_BACKLOG)).fetchall()
            sent = self.published - before
            log.info(
                "relay.stats",
                extra={
                    "published": sent,
                    "per_second": round(sent / (time.monotonic() - started), 1),
                    "backlog": {
                        queue: {
                            "due": due,
                            "in_flight": in_flight,
                            "oldest_due_s": round(float(oldest), 1) if oldest is not None else None,
                        }
                        for queue, due, in_flight, oldest in rows
                    },
                },
            )
