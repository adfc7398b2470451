"""The consumer process: wires the worker's parts together and stops it cleanly.

- the inbox turns RabbitMQ deliveries into wake-ups (consumers/inbox.py);
- the claimer claims them as slots free up (claimer.py);
- the executor runs each claimed job as its own task, from the claim to one Outcome
  in the ledger (executor.py);
- the reporter records outcomes in batches, each row through its fence (reporter.py);
- the intake bounds what the worker holds, handing back what it has no room for
  (intake.py);
- the lease keeper extends every held lease, passes cancel requests on, gives up
  leases that are gone, and keeps the worker's row fresh (lease_keeper.py);
- a forced cancel interrupts an async handler, or has a plain function's process
  replaced under a supervisor (forced_cancel.py);
- the held wake-ups' marks are kept fresh, so the re-waker leaves them alone
  (held_wakeups.py);
- the ledger is the one record of which jobs this worker holds and what each is
  waiting for (ledger.py);
- the journal logs a line per job that succeeded (journal.py).

On SIGTERM (see ``Consumer._shutdown``): stop consuming (unclaimed wake-ups go back
to the queue), let running jobs finish for ``drain_seconds``, give back the claims of
async handlers still running (RUNNING to QUEUED, attempt refunded), wait for plain
functions on their threads (which cannot be stopped), record every outcome, leave.
A second signal means "stop now" (see ``Consumer._stop_now``): async handlers still
running are cancelled and their claims given back all the same, within a few seconds
at most; plain functions still on their threads are left to their leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
import uuid
from collections import Counter

from hybrid_jobs.consumers import prefetch as prefetch_rules
from hybrid_jobs.consumers.claimer import Claimer
from hybrid_jobs.consumers.executor import Executor, Threads
from hybrid_jobs.consumers.forced_cancel import ForcedCancels
from hybrid_jobs.consumers.held_wakeups import REFRESH_SECONDS, HeldWakeups
from hybrid_jobs.consumers.inbox import Delivery, Inbox
from hybrid_jobs.consumers.intake import Intake
from hybrid_jobs.consumers.job import HandlerPools, Job, Resources
from hybrid_jobs.consumers.journal import Journal
from hybrid_jobs.consumers.lease_keeper import LeaseKeeper
from hybrid_jobs.consumers.ledger import Held, Ledger, Phase
from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.consumers.reporter import Reporter
from hybrid_jobs.consumers.settings import OWN_POOL_SIZE, ConsumerSettings
from hybrid_jobs.consumers.store import JobStore
from hybrid_jobs.defaults import POOL_CLOSE_SECONDS
from hybrid_jobs.plumbing.db import DAEMON_OPTIONS, make_pool
from hybrid_jobs.plumbing.logfmt import describe_error
from hybrid_jobs.plumbing.stopping import FORCE_EXIT_SECONDS, cancel_and_wait
from hybrid_jobs.plumbing.transient import retry_forever, unless_stopped
from hybrid_jobs.schema.states import JobState

log = logging.getLogger("consumer")

# On shutdown, how long to keep trying to record finished outcomes.
OUTCOME_FLUSH_SECONDS = 10.0
# At a stop, how long a cancelled async handler may take to end.
CANCEL_GRACE_SECONDS = 5.0
# Claims given back at a stop, at most this many a statement.
GIVE_BACK_BATCH = 500
# A claim whose row another transaction held when it was given back (a heartbeat, an
# operator's cancel request, the relay's sweep: a moment, as a rule) is tried again
# this many times, after GIVE_BACK_LOCKED_PAUSE seconds, doubling: 1.55 s at most
# for the whole stop. Then it is left to lapse, and the sweeper retries its job.
GIVE_BACK_LOCKED_RETRIES = 5
GIVE_BACK_LOCKED_PAUSE = 0.05
# How long one give-back statement may take.
GIVE_BACK_STATEMENT_SECONDS = 10.0
# After a second signal ("stop now"), how long giving back claims and recording
# outcomes may take in all: the process exits FORCE_EXIT_SECONDS after that signal
# whatever still runs, and closing the event loop needs a moment of that too.
STOP_NOW_SECONDS = FORCE_EXIT_SECONDS - 2.0
# ... of which a cancelled async handler gets this long to end.
STOP_NOW_CANCEL_SECONDS = 1.0

# What became of a claim the stop did not give back (a given-back claim's entry is
# its new state: QUEUED, or CANCELLED if a cancel was requested).
LEFT_STALE = "no longer this worker's"
LEFT_LOCKED = "left to lapse: another transaction kept holding its row"
LEFT_FAILED = "left to lapse: the give-back failed or ran out of time"
LEFT_STUCK = "left to lapse: its handler ignored cancellation"
LEFT_THREAD = (
    "left to lapse: a plain function still runs on its thread, and another worker "
    "must not run the job while it does"
)
LEFT_WRITING = "left to its own ending write, which was in flight"


# The states a given-back claim's job is left in.
GIVEN_BACK = frozenset({str(JobState.QUEUED), str(JobState.CANCELLED)})


def _seconds_left(deadline: float | None, most: float = float("inf")) -> float:
    """Seconds until ``deadline`` (a ``time.monotonic()``; None: none), at most
    ``most``, never below zero."""
    if deadline is None:
        return most
    return max(0.0, min(most, deadline - time.monotonic()))


def make_worker_id() -> str:
    """Unique per process: host, pid, and a random part (pids get reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Consumer:
    def __init__(self, settings: ConsumerSettings, registry: Registry) -> None:
        self.settings = settings
        self.registry = registry
        self.worker = make_worker_id()
        self.pool = make_pool(
            settings.database, "consumer", max_size=OWN_POOL_SIZE, options=DAEMON_OPTIONS
        )
        self.handlers = HandlerPools(
            settings.database, ("consumer-handlers", "consumer-sync"), settings.concurrency
        )
        self.store = JobStore(self.pool, self.worker, settings.lease_seconds, settings.tenants)
        self.ledger = Ledger()
        self.inbox = Inbox(
            settings.amqp,
            settings.topology,
            settings.queues,
            settings.messages_ahead,
            self._deliver,
            self.worker,
        )
        self.threads = Threads(settings.concurrency, on_free=self._slot_freed)
        self.prefetch = prefetch_rules.Prefetch(
            settings.concurrency, settings.prefetch, on_change=self._prefetch_changed
        )
        self.intake = Intake(settings, self.store, self.inbox, self.prefetch)
        self.journal = Journal()
        self.executor = Executor(
            settings,
            registry,
            self.threads,
            self.ledger,
            self.journal,
            self._slot_freed,
            self.prefetch.ran,
        )
        self.claimer = Claimer(
            settings,
            self.store,
            registry,
            self.ledger,
            self.threads,
            self.inbox,
            self.intake,
            self.executor,
        )
        self.held_wakeups = HeldWakeups(
            self.store, self.claimer.held_ids, min(REFRESH_SECONDS, settings.effective_heartbeat)
        )
        self.reporter = Reporter(settings, self.store, self.ledger, self.journal)
        self.forced = ForcedCancels(self.ledger, settings.force_cancel_grace)
        self.lease_keeper = LeaseKeeper(
            settings,
            self.store,
            self.ledger,
            registry.job_types(),
            lambda: self.counts,
            self.forced.force,
            registry.policies(),
            registry.webhooks(),
            registry.limits(),
            prefetch=lambda: self.prefetch.ids,
        )
        # The side tasks (claimer, reporter, ...), once started.
        self.background: dict[str, asyncio.Task[None]] = {}
        # What a cancel of run() means, for consumer.stopped_now.
        self.stop_now_why = "a second signal asked to stop now"

    @property
    def counts(self) -> Counter[str]:
        """What this worker did since it started, by what happened."""
        return (
            self.ledger.counts
            + self.claimer.counts
            + self.reporter.counts
            + self.executor.batches.counts
        )

    # ------------------------------------------------------------------ lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then stop gracefully (:meth:`_shutdown`); a
        cancel (the daemon's "stop now", at a second signal) ends it sooner, giving
        back what can be given back in a moment on the way (:meth:`_stop_now`)."""
        try:
            await self._run(stop)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            # Withdrawn while the give-back runs (Python 3.11's asyncio.timeout turns
            # its expiry into TimeoutError only in a task with no cancel pending),
            # and re-raised after it.
            while task is not None and task.uncancel():
                pass
            await self._stop_now()
            raise
        finally:
            # However it stops: its side tasks end before the pools close (else they
            # retry against a closed pool), and the pools close here, since a
            # psycopg_pool worker cancelled while it opens a connection swallows the
            # cancel and waits on its queue for ever, keeping the event loop open.
            await cancel_and_wait(
                [*self.background.values(), *self.forced.waiting], within=POOL_CLOSE_SECONDS
            )
            for pool in (self.pool, self.handlers.pool):
                if not pool.closed:
                    await pool.close(timeout=POOL_CLOSE_SECONDS)

    async def _run(self, stop: asyncio.Event) -> None:
        s = self.settings
        log.info(
            "consumer.starting",
            extra={
                "worker": self.worker,
                "database": s.database.redacted(),
                "amqp": s.amqp.redacted(),
                "queues": list(s.queues),
                "tenants": list(s.tenants),
                "job_types": self.registry.job_types(),
                "concurrency": s.concurrency,
                "prefetch": s.prefetch or "auto",
                "holds_at_most": s.concurrency + self.prefetch.most,
                "lease_s": s.lease_seconds,
                "heartbeat_s": round(s.effective_heartbeat, 2),
                "default_timeout_s": s.default_timeout,
            },
        )
        self._warn_about_queues()
        self._warn_about_batches()
        self.executor.resources = Resources(
            self.worker, self.handlers.pool, self.handlers.sync, asyncio.get_running_loop()
        )
        await self.pool.open(wait=False)
        await self.handlers.pool.open(wait=False)
        if not await unless_stopped(stop, self._connect()):
            await self._close()
            log.info("consumer.stopped", extra={"worker": self.worker})
            return
        self.background = background = {
            name: asyncio.create_task(work, name=name)
            for name, work in [
                ("claimer", self.claimer.run()),
                ("reporter", self.reporter.run()),
                ("lease keeper", self.lease_keeper.run()),
                ("held wake-ups", self.held_wakeups.run()),
                ("stats", self._report_stats()),
            ]
            + ([("prefetch", self._watch_long_runs())] if self.prefetch.automatic else [])
        }
        await self.inbox.start()
        log.info("consumer.started", extra={"worker": self.worker})
        stopped = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait(
            [stopped, *background.values()], return_when=asyncio.FIRST_COMPLETED
        )
        for task in done:
            if task is not stopped and task.exception() is not None:
                log.error("consumer.task_crashed", exc_info=task.exception())
        stopped.cancel()
        await self._shutdown(background)

    def _warn_about_queues(self) -> None:
        """A queue no registered handler names is often a typo: say so (it is not
        an error, since a producer may put any job type on any queue)."""
        mine = set(self.registry.queues())
        unnamed = [q for q in self.settings.queues if q not in mine]
        if unnamed:
            log.warning(
                "consumer.queue_without_handlers",
                extra={
                    "queues": unnamed,
                    "handlers_queues": sorted(mine),
                    "not_consumed": sorted(mine - set(self.settings.queues)),
                    "why": "no registered handler names these queues (a typo?); this "
                    "consumer claims only jobs of its handlers' types from them",
                },
            )

    def _warn_about_batches(self) -> None:
        """Each job of a batch takes a slot, so a batch never holds more jobs than
        --concurrency: a batch size above it is never reached."""
        over = {t: n for t, n in self.registry.batched().items() if n > self.settings.concurrency}
        if over:
            log.warning(
                "consumer.batch_above_concurrency",
                extra={
                    "batches": over,
                    "concurrency": self.settings.concurrency,
                    "why": "each job of a batch holds a slot of its own, so a batch holds "
                    "at most --concurrency jobs",
                    "action": "raise --concurrency to the batch size (or a multiple of it) "
                    "to fill whole batches",
                },
            )

    async def _connect(self) -> None:
        async for attempt in retry_forever(log, "consumer.broker_connect_failed"):
            with attempt:
                await self.inbox.connect()
        async for attempt in retry_forever(log, "consumer.announce_failed"):
            with attempt:
                await self.lease_keeper.announce()

    async def _shutdown(self, background: dict[str, asyncio.Task[None]]) -> None:
        """Stop taking work, let running jobs end, record every outcome, leave.

        1. consuming stops; unclaimed wake-ups go back to the queue;
        2. running jobs get ``drain_seconds`` to finish;
        3. async handlers still running are cancelled and their claims given back
           (QUEUED, attempt refunded); plain functions cannot be stopped, so the stop
           waits for their threads instead, keeping their leases alive, up to each
           handler's time limit (past it, the lease is left to lapse);
        4. the reporter records every outcome, including one it is writing now;
        5. the side tasks stop, and the worker's row goes.
        """
        s = self.settings
        self.claimer.stopping = self.lease_keeper.stopping = self.threads.stopping = True
        log.info("consumer.stopping", extra={"running": self.ledger.running})
        await self.inbox.pause()
        await self.claimer.give_back_all()
        async with self.claimer.lock:
            pass  # a claim in flight finishes, and its jobs join the ones below
        await cancel_and_wait([background["claimer"]])
        # jobs gathered for a batch whose call has not started: back at once
        await self._give_back_async(self._batched_not_started())
        # a reconcile hook cut short leaves its resource uncertain, as it was
        await cancel_and_wait(list(self.claimer.reconciling))
        tasks = self.ledger.tasks()
        if tasks:
            log.info("consumer.draining", extra={"running": len(tasks), "drain_s": s.drain_seconds})
            await asyncio.wait(tasks, timeout=s.drain_seconds)
        running = [h for h in self.ledger.leases() if h.phase is Phase.RUNNING and h.task]
        # A plain function on its thread cannot be stopped, and a job committing its
        # own transaction is about to know its fate: both are waited for.
        waited = [h for h in running if h.writing or (h.thread is not None and h.thread.taken)]
        await self._give_back_async([h for h in running if h not in waited])
        await self._wait_for(waited)
        self.reporter.close()
        await asyncio.wait([background["reporter"]], timeout=OUTCOME_FLUSH_SECONDS)
        left = self.ledger.pending_outcomes()
        if left:
            # Their leases run out and the sweeper retries them: nothing is lost.
            log.error("consumer.outcomes_unrecorded", extra={"jobs": left})
        stuck = await cancel_and_wait(background.values())
        if stuck:
            log.error(
                "consumer.task_ignored_cancel", extra={"tasks": [t.get_name() for t in stuck]}
            )
        try:
            async with asyncio.timeout(5):
                await self.store.gone()
        except Exception as exc:  # the relay expires the row in time
            log.debug("consumer.worker_row_left", extra={"error": describe_error(exc)})
        await self._close()
        self.journal.tell_untold()
        log.info("consumer.stopped", extra={"worker": self.worker, **self.counts})

    async def _give_back_async(
        self,
        running: list[Held],
        grace: float = CANCEL_GRACE_SECONDS,
        deadline: float | None = None,
    ) -> dict[uuid.UUID, str]:
        """Cancel these async handlers; give back the claims of those that did not
        end meanwhile with an outcome of their own. What became of each of those
        claims: its new state if given back, else why not (``LEFT_*``).
        ``deadline`` (a ``time.monotonic()``) bounds the give-back."""
        fates: dict[uuid.UUID, str] = {}
        tasks = [h.task for h in running if h.task]
        if tasks:
            stuck = await cancel_and_wait(tasks, within=grace)
            if stuck:
                # Still running: never give such a claim back. Its lease lapses once
                # the process is gone, and the sweeper retries the job.
                ids = [str(h.job.id) for h in running if h.task in stuck]
                log.error(
                    "consumer.handler_ignored_cancel",
                    extra={"jobs": ids, "action": "left to lapse; the sweeper retries them"},
                )
                for held in running:
                    if held.task in stuck:
                        self.ledger.forget(held.job)
                        fates[held.job.id] = LEFT_STUCK
        unfinished = [
            h.job
            for h in running
            if self.ledger.held.get(h.job.id) is h and h.phase is Phase.RUNNING and not h.writing
        ]
        fates.update(await self._give_back(unfinished, deadline))
        return fates

    async def _stop_now(self) -> None:
        """A second signal: the process exits within seconds. First, for at most
        STOP_NOW_SECONDS: cancel the async handlers still running and give their
        claims back (QUEUED, attempt refunded, a fresh wake-up), as the end of a
        drain does, rather than leave them RUNNING until their leases run out and
        the sweeper spends an attempt; and give the reporter what time is left for
        the outcomes waiting. A plain function on its thread cannot be stopped, so
        its claim is left to its lease (giving it back would let another worker run
        the job while the thread still does), as is a claim whose handler ignored
        its cancellation. ``consumer.stopped_now`` says which went which way."""
        deadline = time.monotonic() + STOP_NOW_SECONDS
        self.claimer.stopping = self.lease_keeper.stopping = self.threads.stopping = True
        if not len(self.ledger):
            return
        # a claim in flight finishes, and its jobs join the ones below
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_seconds_left(deadline, STOP_NOW_CANCEL_SECONDS)):
                async with self.claimer.lock:
                    pass
        self.executor.batches.hold()
        running = [h for h in self.ledger.leases() if h.phase is Phase.RUNNING and h.task]
        left = {h.job.id: LEFT_THREAD for h in running if h.thread is not None and h.thread.taken}
        left.update((h.job.id, LEFT_WRITING) for h in running if h.writing and h.job.id not in left)
        fates: dict[uuid.UUID, str] = {}
        try:
            fates = await self._give_back_async(
                [h for h in running if h.job.id not in left],
                _seconds_left(deadline, STOP_NOW_CANCEL_SECONDS),
                deadline,
            )
            reporter = self.background.get("reporter")
            if reporter is not None and self.ledger.pending_outcomes():
                self.reporter.close()
                await asyncio.wait([reporter], timeout=_seconds_left(deadline))
        except Exception as exc:  # the process is leaving: say so, and leave
            log.error("consumer.stop_now_failed", extra={"error": describe_error(exc)})
        given = {str(i): fate for i, fate in fates.items() if fate in GIVEN_BACK}
        left.update((i, fate) for i, fate in fates.items() if fate not in GIVEN_BACK)
        said: dict[str, object] = {
            "given_back": given,
            "left": {str(i): why for i, why in left.items()},
            "outcomes_unrecorded": self.ledger.pending_outcomes(),
            "why": self.stop_now_why,
        }
        if said["outcomes_unrecorded"] or any(why != LEFT_STALE for why in left.values()):
            said["action"] = (
                "what was left lapses with its lease, and the sweeper retries those "
                "jobs (spending an attempt)"
            )
        log.warning("consumer.stopped_now", extra=said)

    def _batched_not_started(self) -> list[Held]:
        """Start no more batches; the running jobs of batch handlers whose call has
        not started (gathered, or about to join a gathering): never handed to their
        handler, they can be given back at once."""
        batches = self.executor.batches
        batches.hold()
        batched = self.registry.batched()
        return [
            h
            for h in self.ledger.leases()
            if h.phase is Phase.RUNNING
            and h.task
            and h.job.job_type in batched
            and not batches.has_started(h.job.id)
        ]

    async def _wait_for(self, waited: list[Held]) -> None:
        """Wait for handlers the stop cannot interrupt: their leases stay alive
        meanwhile, and their outcomes are recorded as usual."""
        tasks = [h.task for h in waited if h.task]
        if not tasks:
            return
        threads = {str(h.job.id): self._time_limit(h.job) for h in waited if h.thread}
        if threads:
            log.warning(
                "consumer.waiting_for_threads",
                extra={
                    "jobs": threads,
                    "why": "a plain function cannot be stopped; giving its claim back "
                    "would let another worker run the job while this thread still does",
                    "action": "waiting for each, up to its time limit in seconds (null: "
                    "none); a second signal exits at once and lets their leases lapse",
                },
            )
        await asyncio.wait(tasks)

    def _time_limit(self, job: Job) -> float | None:
        handler = self.registry.get(job.job_type)
        return None if handler is None else handler.time_limit(self.settings.default_timeout)

    async def _close(self) -> None:
        await self.inbox.close()
        await self.pool.close()
        await self.handlers.pool.close()
        self.handlers.close_sync()
        self.threads.shutdown()

    async def _give_back(
        self, jobs: list[Job], deadline: float | None = None
    ) -> dict[uuid.UUID, str]:
        """Give back claims, in bounded statements: a failure costs only its batch
        (whose leases lapse: the sweeper retries those jobs, spending an attempt).
        What became of each: its new state if given back, else why not (``LEFT_*``).

        A claim whose row another transaction holds is skipped by the statement,
        not waited for: those few are tried again, briefly (GIVE_BACK_LOCKED_*), and
        only then left to lapse, named in ``consumer.give_back_left``. With a
        ``deadline`` (a ``time.monotonic()``), no statement or retry runs past it."""
        fates: dict[uuid.UUID, str] = {}
        locked = await self._give_back_once(jobs, fates, deadline)
        pause = GIVE_BACK_LOCKED_PAUSE
        for _ in range(GIVE_BACK_LOCKED_RETRIES):
            if not locked or _seconds_left(deadline, pause) < pause:
                break
            await asyncio.sleep(pause)
            pause *= 2
            locked = await self._give_back_once(locked, fates, deadline)
        if locked:
            log.warning(
                "consumer.give_back_left",
                extra={
                    "jobs": [str(job.id) for job in locked],
                    "why": "another transaction kept holding their rows",
                    "action": "left to lapse; the sweeper retries them",
                },
            )
            for job in locked:
                self.ledger.forget(job)
                fates[job.id] = LEFT_LOCKED
        return fates

    async def _give_back_once(
        self, jobs: list[Job], fates: dict[uuid.UUID, str], deadline: float | None
    ) -> list[Job]:
        """One try at giving back these claims, noting in ``fates`` what became of
        each; returns the ones whose row another transaction held (still ours and
        still held here, to be tried again)."""
        locked: list[Job] = []
        for start in range(0, len(jobs), GIVE_BACK_BATCH):
            batch = jobs[start : start + GIVE_BACK_BATCH]
            try:
                seconds = _seconds_left(deadline, GIVE_BACK_STATEMENT_SECONDS)
                if seconds <= 0:
                    raise TimeoutError("no time left to give them back")
                async with asyncio.timeout(seconds):
                    given = await self.store.give_back([j.fence for j in batch])
            except Exception as exc:
                log.error(
                    "consumer.give_back_failed",
                    extra={"jobs": len(batch), "error": describe_error(exc)},
                )
                fates.update((job.id, LEFT_FAILED) for job in batch)
                continue
            for job in batch:
                if job.id in given.locked:
                    locked.append(job)
                    continue
                # given back, or no longer ours
                self.ledger.forget(job)
                state = given.returned.get(job.id)
                fates[job.id] = LEFT_STALE if state is None else str(state)
            states = Counter(str(state) for state in given.returned.values())
            log.info(
                "consumer.gave_back",
                extra={
                    "jobs": len(given.returned),
                    "states": dict(states),
                    "locked": len(given.locked),
                    "stale": len(batch) - len(given.returned) - len(given.locked),
                },
            )
        return locked

    # ------------------------------------------------------------------ jobs

    async def _deliver(self, delivery: Delivery) -> None:
        await self.claimer.deliver(delivery)

    def _slot_freed(self) -> None:
        self.claimer.wake.set()

    async def _watch_long_runs(self) -> None:
        """A run that reaches SHORT_RUN, still going, halves a doubled prefetch and
        starts the streak of short runs again (consumers/prefetch.py): looked for
        every SHORT_RUN, since the end of a long run comes too late."""
        while True:
            await asyncio.sleep(prefetch_rules.SHORT_RUN)
            since = time.monotonic() - prefetch_rules.SHORT_RUN
            if any(
                h.job.run_began is not None and h.job.run_began <= since
                for h in self.ledger.held.values()
                if h.phase is Phase.RUNNING
            ):
                self.prefetch.running_long()

    def _prefetch_changed(self) -> None:
        log.debug("consumer.prefetch_changed", extra={"prefetch": self.prefetch.ids})
        self.lease_keeper.prefetch_changed()
        # more room: consuming may resume; less: what it holds beyond goes back
        self.claimer.wake.set()

    async def _report_stats(self) -> None:
        last: Counter[str] = Counter()
        while True:
            await asyncio.sleep(self.settings.stats_interval)
            now = self.counts
            now["garbage"] = self.inbox.garbage
            delta = now - last
            last = now
            log.info(
                "consumer.stats",
                extra={
                    **{str(k): v for k, v in delta.items()},
                    "running": self.ledger.running,
                    "held": len(self.ledger),
                    "buffered": self.claimer.buffered,
                    "paused": self.claimer.paused,
                    "threads_busy": self.threads.busy,
                    "threads_overdue": self.threads.overdue,
                },
            )
