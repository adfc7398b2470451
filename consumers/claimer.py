"""Wake-ups in, claims out.

Every id a delivery names waits here until a claim takes it or explains it. The
claimer takes as many as there are free slots, claims them in one statement, starts
the claimed jobs and settles each message once every id in it is accounted for:
from then on the table owns the job, so a long job never trips RabbitMQ's delivery
timeout, and a consumer that dies holding a half-claimed message loses nothing (its
redelivery is claimed or explained).

A delivery brings no more ids than there is room for soon (free slots plus the
prefetch); those beyond it are handed back for other consumers (consumers/intake.py).

What comes back unclaimed is handled by why:

- explained (running elsewhere, finished, not due, unknown, of a queue this
  consumer does not serve, or turned down and recorded on the row: paused queue,
  tenant cap, no handler here): done. A job of another queue is left exactly as it
  was, for a consumer of its queue: the wake-up that named it here was not the
  relay's (anyone with access to the broker can publish one), so it is dropped;
- locked by another transaction: tried again alone, after a short wait, then
  handed back to the outbox's backlog if that goes on;
- no free thread for a plain-function handler (every thread held by a handler
  past its time limit): its wake-up goes back to the outbox's backlog, due a little
  later, for this consumer or another with a free thread;
- a weighed job heavier than the free slots (``no_room``, a plain function's too):
  it waits here, and is tried again once more slots are free than when it was
  turned away. Meanwhile nothing else is claimed, so a stream of light jobs cannot
  starve it: the slots it needs are kept for it as they free. The lighter ids
  buffered here go back to the outbox's backlog, due now, and consuming pauses
  until it has started, so that other consumers run them meanwhile. One heavier
  than the whole concurrency is turned down and recorded
  (WEIGHT_OVER_CONCURRENCY), with a warning.

A database that cannot be reached pauses consuming (deliveries go back) until it
answers; a lock or statement timeout is contention, not an outage, and only defers
the ids it touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter

import psycopg.errors
from psycopg_pool import PoolTimeout
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from hybrid_jobs.consumers.executor import Executor, Threads
from hybrid_jobs.consumers.inbox import Delivery, Inbox, give_back, settle
from hybrid_jobs.consumers.intake import Intake
from hybrid_jobs.consumers.ledger import Ledger
from hybrid_jobs.consumers.reconcile import reconcile
from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.consumers.settings import ConsumerSettings
from hybrid_jobs.consumers.store import (
    HELD_HERE,
    LOCKED,
    NO_ROOM,
    NO_THREAD,
    OTHER_QUEUE,
    Claimed,
    ClaimResult,
    JobStore,
)
from hybrid_jobs.plumbing import tracing
from hybrid_jobs.plumbing.logfmt import describe_error
from hybrid_jobs.plumbing.transient import is_transient_db_error, retried, retry_forever
from hybrid_jobs.schema.states import DelayReason

log = logging.getLogger("consumer")

# A row another transaction holds is tried again after this long, doubling, up to
# the cap; after LOCKED_HOLD seconds its wake-up goes back to the outbox's backlog,
# due LOCKED_RETRY_CAP later (held here longer, its message would keep RabbitMQ,
# which sends two messages ahead, from sending this worker anything else).
LOCKED_RETRY = 0.05
LOCKED_RETRY_CAP = 2.0
LOCKED_HOLD = 5.0
# A plain-function job with no free thread (every thread is held by a handler past
# its time limit) goes back to the outbox's backlog, due this much later, for this
# consumer or one with a free thread.
NO_THREAD_WAIT = 2.0
# A weighed job that did not fit the free slots is tried again once more are free,
# and at the latest after this long (a batch's heavier jobs ahead of it may have
# been what left it no room).
NO_ROOM_RETRY = 1.0
# Jobs heavier than the whole concurrency are warned of at most this often: their
# wake-ups come back after the refusal backstop, each one turned down again.
HEAVY_WARNING_INTERVAL = 60.0


def _contention(exc: BaseException) -> bool:
    """Waiting on a lock or a slow statement: the database is up and busy."""
    return isinstance(
        exc,
        psycopg.errors.LockNotAvailable
        | psycopg.errors.QueryCanceled
        | psycopg.errors.TransactionRollback,
    )


def _claim_retry() -> AsyncRetrying:
    """A dropped connection is worth two quick retries on a fresh connection before
    consuming pauses; no connection to be had at all means the database is away:
    pause now."""
    return AsyncRetrying(
        retry=retry_if_exception(
            lambda e: (
                is_transient_db_error(e) and not isinstance(e, PoolTimeout) and not _contention(e)
            )
        ),
        stop=stop_after_attempt(3),
        wait=wait_exponential(multiplier=0.05, max=0.5),
        reraise=True,
    )


class _Waiting:
    """One id and the deliveries that name it (duplicated wake-ups share it)."""

    __slots__ = ("deliveries", "first_deferred", "retries", "retry_at", "room_at_refusal")

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.retry_at = 0.0
        self.retries = 0
        self.first_deferred = 0.0
        # The free slots when its weight did not fit them (None: it has not met that).
        self.room_at_refusal: int | None = None


class Claimer:
    def __init__(
        self,
        settings: ConsumerSettings,
        store: JobStore,
        registry: Registry,
        ledger: Ledger,
        threads: Threads,
        inbox: Inbox,
        intake: Intake,
        executor: Executor,
    ) -> None:
        self.settings = settings
        self.store = store
        self.registry = registry
        self.ledger = ledger
        self.threads = threads
        self.inbox = inbox
        self.intake = intake
        self.executor = executor
        self.waiting: dict[uuid.UUID, _Waiting] = {}
        self.wake = asyncio.Event()
        # Held while a claim is in flight; shutdown waits on it, so jobs a claim is
        # just starting are drained or given back with the rest.
        self.lock = asyncio.Lock()
        self.stopping = False
        self.paused = False
        self.failures = 0
        self.threads_exhausted = False
        # When jobs heavier than the whole concurrency were last warned of.
        self.warned_heavy_at: float | None = None
        self.counts: Counter[str] = Counter()
        # Reconcile hooks asked about uncertain resources, running beside the claims.
        self.reconciling: set[asyncio.Task[int]] = set()

    # ----------------------------------------------------------------- intake

    async def deliver(self, delivery: Delivery) -> None:
        """The inbox's callback: buffer the ids the message names that there is
        room for (consumers/intake.py), hand the rest back."""
        if self.stopping or self.paused:
            await give_back(delivery)
            return
        room = self.intake.room(self._intake_load())
        excess: dict[uuid.UUID, None] = {}
        for job_id in delivery.job_ids:
            waiting = self.waiting.get(job_id)
            if waiting is None:
                if room <= 0:
                    excess[job_id] = None
                    continue
                room -= 1
                waiting = self.waiting[job_id] = _Waiting()
            elif waiting.deliveries:
                self.counts["wakeup_duplicate"] += 1
            waiting.deliveries.append(delivery)
        self.counts["wakeups"] += len(delivery.job_ids)
        self.wake.set()
        if excess:
            await self._hand_back(delivery, list(excess))

    async def _hand_back(self, delivery: Delivery, job_ids: list[uuid.UUID]) -> None:
        self.counts["wakeup_handed_back"] += len(job_ids)
        if len(job_ids) == len(delivery.open):
            await self.intake.stop_while_full()  # none of it fitted
        if not await self.intake.hand_back(job_ids):
            delivery.declined = True
        for job_id in job_ids:
            delivery.open.discard(job_id)
        if not delivery.open:
            await settle(delivery)

    @property
    def held(self) -> int:
        """Job ids this worker holds: running, or waiting here for a slot."""
        return self.ledger.running + len(self.waiting)

    def _holding_room(self) -> bool:
        """A weighed job waits here for slots: nothing lighter is claimed meanwhile."""
        return any(w.room_at_refusal is not None for w in self.waiting.values())

    def _intake_load(self) -> int:
        """What the intake counts as held: while slots are held for a weighed job,
        all of its room, for the lighter wake-ups would only wait here behind it,
        unacknowledged and marked sent, while other consumers could run them."""
        return self.intake.capacity if self._holding_room() else self.held

    @property
    def buffered(self) -> int:
        return len(self.waiting)

    def held_ids(self) -> list[uuid.UUID]:
        """The ids delivered here and not claimed yet."""
        return list(self.waiting)

    async def give_back_all(self) -> None:
        """Hand every unsettled message back to the queue (pausing, or stopping)."""
        deliveries = {id(d): d for w in self.waiting.values() for d in w.deliveries}
        self.waiting.clear()
        for delivery in deliveries.values():
            await give_back(delivery)

    # ----------------------------------------------------------------- the loop

    async def run(self) -> None:
        while True:
            timeout = self._next_retry()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)
            self.wake.clear()
            while not self.stopping and not self.paused:
                batch = self._ready(min(self._free(), self.settings.claim_batch))
                if not batch:
                    break  # a finishing job, a new delivery or a due retry wakes us
                async with self.lock:
                    failure = await self._claim(batch)
                if failure is not None:
                    await self._pause_until_database_answers(failure)
            await self._shed_excess()
            await self.intake.resume_if_room(
                self._intake_load(), not self.stopping and not self.paused
            )

    async def _shed_excess(self) -> None:
        """The prefetch halved for a long run (consumers/prefetch.py): the ids held
        here beyond the room now go back to the outbox's backlog, due now, for a
        consumer with a free slot, rather than wait here behind long runs; and
        consuming pauses until there is room again."""
        prefetch = self.intake.prefetch
        if not prefetch.shed_due:
            return
        prefetch.shed_due = False
        async with self.lock:
            excess = self.held - self.intake.capacity
            if excess <= 0 or not self.waiting or self._holding_room():
                return
            if self.stopping or self.paused:
                return
            latest = list(self.waiting)[-excess:]
            self.counts["prefetch_shed"] += len(latest)
            await self._return_to_backlog(latest, 0.0)
            await self.intake.stop_while_full()

    def _next_retry(self) -> float | None:
        """How long to sleep before a waiting id can be tried: None (until woken)
        when none can, because none waits or no slot is free (a freeing slot, a new
        delivery or the stop wakes the loop)."""
        if not self.waiting or self.stopping or self.paused or self._free() <= 0:
            return None
        now = time.monotonic()
        # While weighed jobs wait here for room, only they can be tried (_ready):
        # a lighter id due now must not wake the loop round and round.
        waiting = [w for w in self.waiting.values() if w.room_at_refusal is not None]
        return max(0.0, min(w.retry_at for w in waiting or self.waiting.values()) - now)

    def _free(self) -> int:
        return self.settings.concurrency - self.ledger.running

    def _ready(self, limit: int) -> list[uuid.UUID]:
        if limit <= 0:
            return []
        now = time.monotonic()
        free = self._free()
        heavy = [job_id for job_id, w in self.waiting.items() if w.room_at_refusal is not None]
        if heavy:
            # The slots free up for the weighed jobs waiting here first: claiming a
            # lighter one now could keep them from ever having enough. One is tried
            # again when more are free than when it last was (noted, so that it is
            # not tried again for the same room), or its retry is due.
            ready = []
            for job_id in heavy[:limit]:
                waiting = self.waiting[job_id]
                if free > (waiting.room_at_refusal or 0) or waiting.retry_at <= now:
                    waiting.room_at_refusal = free
                    ready.append(job_id)
            return ready
        ready = []
        for job_id, waiting in self.waiting.items():
            if waiting.retry_at <= now:
                ready.append(job_id)
                if len(ready) >= limit:
                    break
        return ready

    # ----------------------------------------------------------------- one claim

    async def _claim(self, job_ids: list[uuid.UUID]) -> Exception | None:
        """Claim these ids and start what was claimed; the failure, if the database
        could not be reached (the deliveries went back)."""
        sent_at = time.monotonic()
        began = tracing.now_ns()

        async def claim() -> tuple[int, ClaimResult]:
            nonlocal sent_at
            sent_at = time.monotonic()
            free = self._free()
            return free, await self.store.claim(
                job_ids,
                self.registry.claim_terms(),
                queues=self.settings.queues,
                free_threads=self.threads.free,
                worker_ttl=self.settings.worker_ttl,
                free_slots=free,
                concurrency=self.settings.concurrency,
            )

        if log.isEnabledFor(logging.DEBUG):  # a trace, for latency work
            log.debug(
                "consumer.claiming",
                extra={"t": time.time(), "job_ids": [str(job_id) for job_id in job_ids]},
            )
        try:
            free_slots, result = await retried(claim, _claim_retry)
            claimed, missed = result.claimed, result.missed
            # A lease ours that does not run here comes from a claim that committed
            # though its answer was lost (a try whose connection dropped, or the
            # whole claim failing after the plain one): only we can start it.
            lost = [i for i, why in missed.items() if why == HELD_HERE and i not in self.ledger]
            if lost:
                mine = await self.store.held_by_me(lost)
                self.counts["claims_recovered"] += len(mine)
                claimed = claimed + mine
                for row in mine:
                    missed.pop(row.job_id, None)
        except Exception as exc:
            if _contention(exc):
                log.warning(
                    "consumer.claim_deferred",
                    extra={"jobs": len(job_ids), "error": describe_error(exc)},
                )
                for job_id in job_ids:
                    await self._defer(job_id)
                return None
            return exc
        self.failures = 0
        if claimed and tracing.recording():
            _claim_span(began, len(job_ids), claimed)
        if claimed and log.isEnabledFor(logging.DEBUG):  # a trace, for latency work
            log.debug(
                "consumer.claimed",
                extra={"t": time.time(), "job_ids": [str(row.job_id) for row in claimed]},
            )
        for row in claimed:
            reservation = None
            handler = self.registry.get(row.job_type)
            if handler is not None and not handler.is_async:
                reservation = self.threads.reserve()
            self.executor.start(row, sent_at, reservation)
            await self._done(row.job_id)
        self.counts["claimed"] += len(claimed)
        # The room a weighed job was turned away for: the slots the claim found free,
        # less what it took. Not the slots free once the claimed jobs are started:
        # short jobs may have ended by then (starting them awaits), and a job waiting
        # for more room than that would wait for its retry, not for the next slot.
        room_left = max(free_slots - sum(row.weight for row in claimed), 0)
        no_thread = []
        for job_id, why in missed.items():
            self.counts[f"wakeup_{why.lower()}"] += 1
            if why == LOCKED:
                await self._defer(job_id)
            elif why == NO_ROOM:
                self._wait_for_room(job_id, room_left)
            elif why == NO_THREAD:
                no_thread.append(job_id)
            else:
                await self._done(job_id)
        self._note_threads(bool(no_thread))
        if NO_ROOM in missed.values():
            await self._make_room_for_heavy()
        heavy = [i for i, why in missed.items() if why == DelayReason.WEIGHT_OVER_CONCURRENCY]
        if heavy:
            self._warn_heavy(len(heavy))
        uncertain = [i for i, why in missed.items() if why == DelayReason.RESOURCE_UNCERTAIN]
        if uncertain and self.registry.reconciles():
            # beside the claims: a hook looks at a target, which may take a while
            task = asyncio.create_task(reconcile(self.store, self.registry, uncertain))
            self.reconciling.add(task)
            task.add_done_callback(self._reconciled)
        if no_thread:
            # Held here, they would keep their messages unacknowledged and so stop
            # RabbitMQ from sending this worker anything else (it sends two messages
            # ahead): back to the outbox's backlog, due a little later, for this
            # worker or another with a free thread.
            await self._return_to_backlog(no_thread, NO_THREAD_WAIT)
        unknown = sum(1 for why in missed.values() if why == "missing")
        if unknown:
            log.warning(
                "consumer.wakeup_for_unknown_job",
                extra={"count": unknown, "action": "acked and ignored"},
            )
        strays = sum(1 for why in missed.values() if why == OTHER_QUEUE)
        if strays:
            log.warning(
                "consumer.wakeup_for_other_queue",
                extra={
                    "count": strays,
                    "queues": list(self.settings.queues),
                    "action": "acked and dropped; the jobs wait for a consumer of their queue",
                },
            )
        return None

    def _reconciled(self, task: asyncio.Task[int]) -> None:
        self.reconciling.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning(
                "consumer.reconcile_failed",
                extra={"error": describe_error(exc), "action": "the resources stay uncertain"},
            )

    async def _done(self, job_id: uuid.UUID) -> None:
        """The id is claimed or explained: settle every message now fully done."""
        waiting = self.waiting.pop(job_id, None)
        if waiting is None:
            return
        for delivery in waiting.deliveries:
            delivery.open.discard(job_id)
            if not delivery.open:
                await settle(delivery)

    async def _defer(self, job_id: uuid.UUID) -> None:
        """Its row was locked elsewhere (or the claim waited too long): try it again
        alone, after a short wait; hand it back to the backlog if that goes on."""
        waiting = self.waiting.get(job_id)
        if waiting is None:
            return
        if self._waited(waiting) > LOCKED_HOLD:
            log.warning(
                "consumer.wakeup_returned",
                extra={
                    "job_id": str(job_id),
                    "why": "its row stayed locked by another transaction",
                    "action": f"back to the outbox's backlog, due in {LOCKED_RETRY_CAP:g} s",
                },
            )
            self.counts["wakeup_returned"] += 1
            await self._return_to_backlog([job_id], LOCKED_RETRY_CAP)
            return
        waiting.retry_at = time.monotonic() + min(
            LOCKED_RETRY * 2**waiting.retries, LOCKED_RETRY_CAP
        )
        waiting.retries += 1

    def _wait_for_room(self, job_id: uuid.UUID, room: int) -> None:
        """A weighed job that did not fit the ``room`` free slots: try it again once
        more are free (or after NO_ROOM_RETRY), before anything else waiting here."""
        waiting = self.waiting.get(job_id)
        if waiting is None:
            return
        waiting.room_at_refusal = room
        waiting.retry_at = time.monotonic() + NO_ROOM_RETRY

    async def _make_room_for_heavy(self) -> None:
        """Slots are held for a weighed job: the lighter ids buffered here go back to
        the outbox's backlog, due now, for a consumer with room (held, they would
        wait here as long as the longest job running here), and consuming pauses
        until it has started, so that they are not sent here again meanwhile."""
        await self.intake.stop_while_full()
        lighter = [i for i, w in self.waiting.items() if w.room_at_refusal is None]
        if lighter:
            self.counts["wakeup_handed_back"] += len(lighter)
            await self._return_to_backlog(lighter, 0.0)

    def _warn_heavy(self, count: int) -> None:
        """Jobs heavier than this consumer's whole concurrency were turned down: say
        so (at most once a HEAVY_WARNING_INTERVAL), since nothing here will ever
        run them."""
        now = time.monotonic()
        if self.warned_heavy_at is not None and now - self.warned_heavy_at < HEAVY_WARNING_INTERVAL:
            return
        self.warned_heavy_at = now
        log.warning(
            "consumer.job_heavier_than_concurrency",
            extra={
                "count": count,
                "concurrency": self.settings.concurrency,
                "why": "a job's weight is above this consumer's --concurrency",
                "action": "turned down (WEIGHT_OVER_CONCURRENCY); run a consumer with a"
                " --concurrency of at least its weight, or cancel it",
            },
        )

    async def _return_to_backlog(self, job_ids: list[uuid.UUID], delay: float) -> None:
        """Hand these buffered ids back to the outbox (due in ``delay`` seconds)
        and settle their messages; if that fails, decline them (their messages go
        back to RabbitMQ)."""
        handed = await self.intake.hand_back(job_ids, delay)
        for job_id in job_ids:
            if handed:
                await self._done(job_id)
            else:
                await self._decline(job_id)

    @staticmethod
    def _waited(waiting: _Waiting) -> float:
        now = time.monotonic()
        if not waiting.first_deferred:
            waiting.first_deferred = now
        return now - waiting.first_deferred

    async def _decline(self, job_id: uuid.UUID) -> None:
        """Give up on the id here: its messages go back to the queue once the rest
        of their ids are accounted for."""
        waiting = self.waiting.pop(job_id, None)
        if waiting is None:
            return
        self.counts["wakeup_returned"] += 1
        for delivery in waiting.deliveries:
            delivery.declined = True
            delivery.open.discard(job_id)
            if not delivery.open:
                await settle(delivery)

    def _note_threads(self, declined: bool) -> None:
        if declined and not self.threads_exhausted:
            self.threads_exhausted = True
            log.warning(
                "consumer.threads_exhausted",
                extra={
                    "threads": self.threads.size,
                    "overdue": self.threads.overdue,
                    "action": "plain-function jobs are not claimed until a thread returns",
                },
            )
        elif self.threads_exhausted and self.threads.free > 0:
            self.threads_exhausted = False
            log.info("consumer.threads_available", extra={"free": self.threads.free})

    # ----------------------------------------------------------------- outages

    async def _pause_until_database_answers(self, exc: Exception) -> None:
        if self.stopping:
            return
        self.failures += 1
        log.warning(
            "consumer.database_unavailable",
            extra={"error": describe_error(exc), "action": "deliveries requeued, consuming paused"},
        )
        self.paused = True
        await self.inbox.pause()
        await self.give_back_all()
        # Wait a little longer after each consecutive failure, so a claim that fails
        # for a reason the probe cannot see does not churn the queue.
        await asyncio.sleep(min(5.0, 0.1 * 2 ** min(self.failures, 6)))
        async for attempt in retry_forever(log, "consumer.database_probe_failed"):
            with attempt:
                await self.store.ping()
        self.paused = False
        self.intake.full = False  # nothing is held any more
        if not self.stopping:
            await self.inbox.start()
            log.info("consumer.database_available", extra={"action": "consuming resumed"})


def _claim_span(began: int, asked: int, claimed: list[Claimed]) -> None:
    """The claim as a CLIENT span (the conventions' "receive"), linked to the trace
    of each job it claimed: one claim takes jobs enqueued in many traces. A claim of
    one job is in that job's trace too."""
    queues = {row.queue for row in claimed}
    queue = next(iter(queues)) if len(queues) == 1 else None
    tenants = {row.tenant for row in claimed}
    tracing.record(
        "claim" if queue is None else f"claim {queue}",
        "client",
        start_ns=began,
        attributes={
            tracing.MESSAGING_SYSTEM: tracing.SYSTEM,
            tracing.MESSAGING_DESTINATION_NAME: queue,
            tracing.MESSAGING_OPERATION_TYPE: "receive",
            tracing.MESSAGING_OPERATION_NAME: "claim",
            tracing.MESSAGING_BATCH_MESSAGE_COUNT: asked,
            tracing.CLAIMED: len(claimed),
            tracing.JOB_QUEUE: queue,
            tracing.JOB_TENANT: next(iter(tenants)) if len(tenants) == 1 else None,
        },
        links=[
            (row.trace_context, {tracing.JOB_ID: str(row.job_id), tracing.JOB_ATTEMPT: row.attempt})
            for row in claimed
        ],
        parent=claimed[0].trace_context if asked == 1 and len(claimed) == 1 else None,
    )
