"""The consumer process: deliveries in, fenced claims, handlers, fenced outcomes out.

Tasks in one event loop (handlers in it too; plain-function handlers in a thread
pool):

- the inbox turns deliveries into a buffer of job ids;
- the claimer takes as many buffered deliveries as there are free slots and claims
  them in one statement, then acks them: from then on the table owns the job, so a
  long job never trips RabbitMQ's delivery timeout. If the database cannot be
  reached, the deliveries go back to the queue and consuming pauses until it answers;
- each claimed job runs as its own task and ends in one Outcome;
- the reporter records finished outcomes in batches, each row through its fence;
- the heartbeater extends every held lease in one statement per interval, sees
  cancel requests, and cancels handlers whose lease is gone;
- on SIGTERM: stop consuming, let running jobs finish for ``drain_seconds``, then
  give the rest back (RUNNING to QUEUED, attempt returned).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import threading
import time
import uuid
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor

from psycopg import Connection
from psycopg_pool import ConnectionPool, PoolTimeout
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from consumers.deliveries import Delivery, Inbox, ack_in_order, settle
from consumers.executor import execute
from consumers.job import Job, Resources
from consumers.outcome import Outcome
from consumers.registry import Registry
from consumers.settings import ConsumerSettings
from consumers.store import Claimed, JobStore
from plumbing.db import connection_kwargs, make_pool
from plumbing.logfmt import describe_error
from plumbing.transient import is_transient_db_error, retry_forever, unless_stopped
from schema.states import JobState

log = logging.getLogger("consumer")

# On shutdown, how long to keep trying to record finished outcomes.
OUTCOME_FLUSH_SECONDS = 10.0


def make_worker_id() -> str:
    """Unique per process: host, pid, and a random part (pids get reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Consumer:
    def __init__(self, settings: ConsumerSettings, registry: Registry) -> None:
        self.settings = settings
        self.registry = registry
        self.worker = make_worker_id()
        # The consumer's own statements (claims, heartbeats, outcomes) get a small pool
        # of their own, so handlers holding connections can never starve a heartbeat.
        self.pool = make_pool(settings.database, "consumer", max_size=4)
        self.handler_pool = make_pool(
            settings.database, "consumer-handlers", max_size=settings.concurrency, options=None
        )
        self.store = JobStore(self.pool, self.worker, settings.lease_seconds)
        self._sync_pool: ConnectionPool[Connection] | None = None
        self._sync_pool_lock = threading.Lock()
        self.resources = Resources(self.worker, self.handler_pool, self._get_sync_pool)
        self.threads = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="handler")
        self.inbox = Inbox(
            settings.amqp,
            settings.topology,
            settings.queues,
            settings.effective_prefetch,
            self._on_delivery,
            self.worker,
        )
        self.buffer: deque[Delivery] = deque()
        self.running: dict[uuid.UUID, asyncio.Task[None]] = {}
        # Jobs whose lease this worker holds: running, or finished with the outcome
        # not yet recorded.
        self.held: dict[uuid.UUID, Job] = {}
        self.pending: dict[uuid.UUID, tuple[Job, Outcome]] = {}
        self.claim_wake = asyncio.Event()
        self.report_wake = asyncio.Event()
        self.reported = asyncio.Event()
        # Heartbeats and outcome batches lock this worker's rows; one at a time, so
        # they never wait on each other inside PostgreSQL.
        self.write_lock = asyncio.Lock()
        # Held while a claim is in flight; shutdown waits on it, so jobs a claim is
        # just starting are drained or given back with the rest.
        self.claim_lock = asyncio.Lock()
        self.stopping = False
        self.paused = False
        self.claim_failures = 0
        self.counts: Counter[str] = Counter()

    # ------------------------------------------------------------------ lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        log.info(
            "consumer.starting",
            extra={
                "worker": self.worker,
                "database": s.database.redacted(),
                "amqp": s.amqp.redacted(),
                "queues": list(s.queues),
                "job_types": sorted(h["job_type"] for h in self.registry.budgets()),
                "concurrency": s.concurrency,
                "prefetch": s.effective_prefetch,
                "lease_s": s.lease_seconds,
                "heartbeat_s": round(s.effective_heartbeat, 2),
            },
        )
        await self.pool.open(wait=False)
        await self.handler_pool.open(wait=False)
        if not await unless_stopped(stop, self._connect()):
            await self.inbox.close()
            await self.pool.close()
            await self.handler_pool.close()
            log.info("consumer.stopped", extra={"worker": self.worker})
            return
        background = [
            asyncio.create_task(self._claimer(), name="claimer"),
            asyncio.create_task(self._reporter(), name="reporter"),
            asyncio.create_task(self._heartbeater(), name="heartbeater"),
            asyncio.create_task(self._report_stats(), name="stats"),
        ]
        await self.inbox.start()
        log.info("consumer.started", extra={"worker": self.worker})
        stopped = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopped, *background], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopped and task.exception() is not None:
                log.error("consumer.task_crashed", exc_info=task.exception())
        await self._shutdown(background)

    async def _connect(self) -> None:
        async for attempt in retry_forever(log, "consumer.broker_connect_failed"):
            with attempt:
                await self.inbox.connect()

    async def _shutdown(self, background: list[asyncio.Task[None]]) -> None:
        s = self.settings
        self.stopping = True
        log.info("consumer.stopping", extra={"running": len(self.running)})
        await self.inbox.pause()
        await self._return_buffered()
        async with self.claim_lock:
            pass  # a claim in flight finishes, and its jobs join the ones below
        if self.running:
            log.info(
                "consumer.draining",
                extra={"running": len(self.running), "drain_s": s.drain_seconds},
            )
            await asyncio.wait(list(self.running.values()), timeout=s.drain_seconds)
        unfinished = [self.held[i] for i in self.running if i in self.held]
        for task in self.running.values():
            task.cancel()
        await asyncio.gather(*self.running.values(), return_exceptions=True)
        await self._give_back(unfinished)
        await self._flush_outcomes()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await self.inbox.close()
        await self.pool.close()
        await self.handler_pool.close()
        if self._sync_pool is not None:
            self._sync_pool.close()
        self.threads.shutdown(wait=False, cancel_futures=True)
        log.info("consumer.stopped", extra={"worker": self.worker, **self.counts})

    async def _give_back(self, jobs: list[Job]) -> None:
        # A job whose own transaction is committing right now is left to that commit.
        jobs = [j for j in jobs if not j.committing and not j.recorded]
        fences = [j.fence for j in jobs]
        if not fences:
            return
        try:
            async with asyncio.timeout(10), self.write_lock:
                returned = await self.store.give_back(fences)
        except Exception as exc:
            # The sweeper will find these leases expired; nothing is lost, an attempt is.
            log.error(
                "consumer.give_back_failed",
                extra={"jobs": len(fences), "error": describe_error(exc)},
            )
            return
        for job in jobs:
            self.held.pop(job.id, None)
            self.pending.pop(job.id, None)
        states = Counter(str(state) for state in returned.values())
        log.info("consumer.gave_back", extra={"jobs": len(fences), "states": dict(states)})

    async def _flush_outcomes(self) -> None:
        try:
            async with asyncio.timeout(OUTCOME_FLUSH_SECONDS):
                while self.pending:
                    self.reported.clear()
                    self.report_wake.set()
                    await self.reported.wait()
        except TimeoutError:
            # Their leases run out and the sweeper retries them: nothing is lost.
            log.error("consumer.outcomes_unrecorded", extra={"jobs": len(self.pending)})

    # ------------------------------------------------------------------ deliveries

    async def _on_delivery(self, delivery: Delivery) -> None:
        if self.stopping or self.paused:
            await settle(delivery.message, ack=False)
            return
        self.buffer.append(delivery)
        self.claim_wake.set()

    async def _return_buffered(self) -> None:
        while self.buffer:
            await settle(self.buffer.popleft().message, ack=False)

    async def _claimer(self) -> None:
        s = self.settings
        while True:
            await self.claim_wake.wait()
            self.claim_wake.clear()
            while self.buffer and not self.stopping:
                free = s.concurrency - len(self.running)
                if free <= 0:
                    break  # a finishing job sets claim_wake again
                size = min(free, s.claim_batch, len(self.buffer))
                async with self.claim_lock:
                    failure = await self._claim([self.buffer.popleft() for _ in range(size)])
                if failure is not None:
                    await self._pause_until_database_answers(failure)

    async def _claim(self, batch: list[Delivery]) -> Exception | None:
        """Claim the jobs a batch of deliveries names and start them; the failure,
        if the database could not be reached (the deliveries went back)."""
        job_ids = [d.job_id for d in batch]
        sent_at = time.monotonic()
        ambiguous = False
        try:
            # A dropped connection or a deadlock is worth two quick retries on a fresh
            # connection before the deliveries go back and consuming pauses; no
            # connection to be had at all means the database is away: pause now.
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(
                    lambda e: is_transient_db_error(e) and not isinstance(e, PoolTimeout)
                ),
                stop=stop_after_attempt(3),
                wait=wait_exponential(multiplier=0.05, max=0.5),
                reraise=True,
            ):
                with attempt:
                    ambiguous = attempt.retry_state.attempt_number > 1
                    sent_at = time.monotonic()
                    claimed = await self.store.claim(job_ids, self.registry.budgets())
            if ambiguous:
                # The failed try may have committed before its connection dropped:
                # those jobs are ours, and only we can start them.
                got = {row.job_id for row in claimed}
                mine = await self.store.held_by_me([i for i in job_ids if i not in got])
                claimed += [row for row in mine if row.job_id not in self.held]
        except Exception as exc:
            for delivery in batch:
                await settle(delivery.message, ack=False)
            return exc
        self.claim_failures = 0
        await ack_in_order(batch)
        for row in claimed:
            self._start(row, sent_at)
        self.counts["claimed"] += len(claimed)
        unique = set(job_ids)
        if len(unique) < len(job_ids):
            self.counts["wakeup_duplicate"] += len(job_ids) - len(unique)
        if len(claimed) < len(unique):
            got = {row.job_id for row in claimed}
            await self._explain([i for i in unique if i not in got])
        return None

    async def _explain(self, missed: list[uuid.UUID]) -> None:
        try:
            reasons = await self.store.explain_misses(missed)
        except Exception:
            reasons = Counter({"unexplained": len(missed)})
        for reason, n in reasons.items():
            self.counts[f"wakeup_{reason}"] += n
        if reasons.get("missing"):
            log.warning(
                "consumer.wakeup_for_unknown_job",
                extra={"count": reasons["missing"], "action": "acked and ignored"},
            )

    async def _pause_until_database_answers(self, exc: Exception) -> None:
        if self.stopping:
            return
        self.claim_failures += 1
        log.warning(
            "consumer.database_unavailable",
            extra={"error": describe_error(exc), "action": "deliveries requeued, consuming paused"},
        )
        self.paused = True
        await self.inbox.pause()
        await self._return_buffered()
        # Wait a little longer after each consecutive failure, so a claim that fails
        # for a reason the probe cannot see does not churn the queue.
        await asyncio.sleep(min(5.0, 0.1 * 2 ** min(self.claim_failures, 6)))
        async for attempt in retry_forever(log, "consumer.database_probe_failed"):
            with attempt:
                await self.store.ping()
        self.paused = False
        if not self.stopping:
            await self.inbox.start()
            log.info("consumer.database_available", extra={"action": "consuming resumed"})

    # ------------------------------------------------------------------ jobs

    def _start(self, row: Claimed, claim_sent_at: float) -> None:
        job = Job.from_claim(row, self.resources, claim_sent_at, self.settings.lease_seconds)
        self.held[job.id] = job
        self.running[job.id] = asyncio.create_task(self._run(job), name=f"job {job.id}")

    async def _run(self, job: Job) -> None:
        handler = self.registry.get(job.job_type)
        try:
            outcome = await execute(job, handler, self.threads)
        finally:
            self.running.pop(job.id, None)
            self.claim_wake.set()
        if outcome is None:
            if job.recorded:
                self.counts[JobState.SUCCEEDED] += 1
            self.held.pop(job.id, None)
        elif job.id in self.held:  # not lost meanwhile
            self.pending[job.id] = (job, outcome)
            self.report_wake.set()

    async def _reporter(self) -> None:
        while True:
            await self.report_wake.wait()
            self.report_wake.clear()
            while self.pending:
                batch = [
                    self.pending.pop(i) for i in list(self.pending)[: self.settings.report_batch]
                ]
                for job, _ in batch:
                    job.committing = True
                await self._record(batch)
            self.reported.set()

    async def _record(self, batch: list[tuple[Job, Outcome]]) -> None:
        """Record a batch of outcomes, retrying through outages. An outcome the
        database refuses for good is isolated and dropped: its lease lapses and the
        sweeper retries the job, while every other outcome is still recorded."""
        triples = [(job.id, job.generation, outcome) for job, outcome in batch]
        try:
            async for attempt in retry_forever(log, "consumer.report_failed", only_transient=True):
                with attempt:
                    async with self.write_lock:
                        applied, stale = await self.store.finish(triples)
        except Exception as exc:
            if len(batch) > 1:
                for item in batch:
                    await self._record([item])
                return
            job, outcome = batch[0]
            self.held.pop(job.id, None)
            log.error(
                "consumer.outcome_unrecordable",
                extra={
                    "job_id": str(job.id),
                    "outcome": outcome.kind,
                    "error": describe_error(exc),
                    "action": "dropped; the lease lapses and the sweeper retries the job",
                },
            )
            return
        for job, outcome in batch:
            self.held.pop(job.id, None)
            if job.id in stale:
                self.counts["stale_outcome"] += 1
                log.warning(
                    "consumer.stale_outcome",
                    extra={
                        "job_id": str(job.id),
                        "generation": job.generation,
                        "outcome": outcome.kind,
                        "action": "rejected by the fence; the job moved on without us",
                    },
                )
            elif job.id in applied:
                state = applied[job.id]
                self.counts[state] += 1
                if outcome.kind != "succeeded":
                    log.info(
                        "consumer.attempt_failed",
                        extra={
                            "job_id": str(job.id),
                            "job_type": job.job_type,
                            "attempt": job.attempt,
                            "state": state,
                            "error_code": outcome.error_code,
                            "error": outcome.error_message,
                            "retry_in_s": round(outcome.delay_seconds or 0, 1)
                            if state == JobState.RETRY_WAIT
                            else None,
                        },
                    )

    async def _heartbeater(self) -> None:
        s = self.settings
        while True:
            await asyncio.sleep(s.effective_heartbeat)
            jobs = [j for j in self.held.values() if not j.committing]
            if not jobs:
                continue
            sent_at = time.monotonic()
            try:
                async with self.write_lock:
                    alive = await self.store.heartbeat([j.fence for j in jobs])
            except Exception as exc:
                log.warning("consumer.heartbeat_failed", extra={"error": describe_error(exc)})
                for job in jobs:
                    if job.lease_surely_expired():
                        self._lose(job, "the lease ran out while heartbeats failed")
                continue
            for job in jobs:
                if job.committing or job.id not in self.held:
                    continue
                state = alive.get(job.id)
                if state is None:
                    self._lose(job, "the heartbeat was rejected by the fence")
                else:
                    job.lease_deadline = sent_at + s.lease_seconds
                    if state == JobState.CANCEL_REQUESTED and not job.cancel_requested:
                        job.cancel_requested = True
                        log.info("consumer.cancel_requested", extra={"job_id": str(job.id)})

    def _lose(self, job: Job, why: str) -> None:
        self.held.pop(job.id, None)
        self.pending.pop(job.id, None)
        task = self.running.get(job.id)
        if task is not None:
            task.cancel()
        self.counts["lease_lost"] += 1
        log.warning(
            "consumer.lease_lost",
            extra={
                "job_id": str(job.id),
                "generation": job.generation,
                "why": why,
                "action": "handler cancelled, nothing reported" if task else "nothing reported",
            },
        )

    async def _report_stats(self) -> None:
        last: Counter[str] = Counter()
        while True:
            await asyncio.sleep(self.settings.stats_interval)
            now = Counter(self.counts)
            now["garbage"] = self.inbox.garbage
            delta = now - last
            last = now
            log.info(
                "consumer.stats",
                extra={
                    **{str(k): v for k, v in delta.items()},
                    "running": len(self.running),
                    "held": len(self.held),
                    "buffered": len(self.buffer),
                    "paused": self.paused,
                },
            )

    def _get_sync_pool(self) -> ConnectionPool[Connection]:
        with self._sync_pool_lock:
            if self._sync_pool is None:
                self._sync_pool = ConnectionPool(
                    self.settings.database.conninfo,
                    min_size=1,
                    max_size=self.settings.concurrency,
                    kwargs=connection_kwargs("consumer-sync") | {"autocommit": True},
                    name="consumer-sync",
                    open=True,
                )
            return self._sync_pool
