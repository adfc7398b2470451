"""A claimed job's life, from the claim to its outcome in the ledger.

:meth:`Executor.call` reads top to bottom the way Oban's executor's ``call/1``
does: resolve the handler, run it (async in the loop, plain functions in a thread)
under its time limit, normalise however it ended into one Outcome (or nothing to
report), and hand that to the ledger, where the reporter picks it up.
:meth:`Executor.start` is the step before, from claimed to running: the claimer
calls it for each job its claim took. :func:`execute` is the middle two steps
alone, which ``consumers.testing`` runs too.

A plain function cannot be stopped once it runs: a thread whose handler ran past its
time limit stays busy until the function returns. :class:`Threads` counts such a
thread as busy, and the claimer takes no more plain-function jobs than there are free
threads, so a claimed job never waits for a thread it may never get.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hybrid_jobs import defaults
from hybrid_jobs.consumers import hooks
from hybrid_jobs.consumers.batches import Batches
from hybrid_jobs.consumers.errors import Cancel, LeaseLost, Permanent, Retry, Snooze
from hybrid_jobs.consumers.job import Job, Resources
from hybrid_jobs.consumers.outcome import TIMEOUT, Outcome, encode_result
from hybrid_jobs.consumers.payload import INPUT_REDACTED
from hybrid_jobs.consumers.registry import Handler, Registry
from hybrid_jobs.consumers.time_limit import TimedOut as _TimedOut
from hybrid_jobs.consumers.time_limit import bounded as _bounded
from hybrid_jobs.plumbing import tracing
from hybrid_jobs.plumbing.logfmt import describe_error

if TYPE_CHECKING:  # the ledger records Reservations: it imports this module
    from hybrid_jobs.consumers.journal import Journal
    from hybrid_jobs.consumers.ledger import Ledger
    from hybrid_jobs.consumers.settings import ConsumerSettings
    from hybrid_jobs.consumers.store import Claimed

log = logging.getLogger("consumer")

# The claim takes only known types, so only a registry changed under it meets one.
UNKNOWN_TYPE_RETRY_SECONDS = defaults.UNKNOWN_TYPE_RETRY_SECONDS
# The messages of an attempt ended by a forced cancel (its history row's).
INTERRUPTED = "cancelled with force: the handler was interrupted"
FORCED_DISCARDED = "cancelled with force: what the handler did next was discarded"


class Executor:
    """Runs the jobs this worker claimed, each as its own task."""

    def __init__(
        self,
        settings: ConsumerSettings,
        registry: Registry,
        threads: Threads,
        ledger: Ledger,
        journal: Journal,
        slot_freed: Callable[[], None],
        ran: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        """``ran`` is told how long each handler ran (the prefetch follows it)."""
        self.settings = settings
        self.registry = registry
        self.threads = threads
        self.ledger = ledger
        self.journal = journal
        self.slot_freed = slot_freed
        self.ran = ran
        # What a job's handler reaches (connection pools, the loop); set when the
        # worker runs, before the first claim.
        self.resources: Resources | None = None
        # Jobs of batch handlers, gathered into one call (consumers/batches.py).
        self.batches = Batches(threads)

    def start(self, row: Claimed, claim_sent_at: float, reservation: Reservation | None) -> None:
        """Claimed to running: the job's task starts, and the ledger holds it from
        now on. ``reservation`` is the thread the claimer reserved for a plain
        function (None for an async handler)."""
        assert self.resources is not None
        job = Job.from_claim(row, self.resources, claim_sent_at, self.settings.lease_seconds)
        task = asyncio.create_task(self.call(job, reservation), name=f"job {job.id}")
        self.ledger.start(job, task, reservation)

    async def call(self, job: Job, reservation: Reservation | None) -> None:
        """One attempt of a claimed job, top to bottom."""
        # 1. resolve the handler
        handler = self.registry.get(job.job_type)
        try:
            if (refused := input_refusal(job)) is not None:
                outcome: Outcome | None = refused
            elif handler is None:
                outcome = Outcome.retry(
                    "UNKNOWN_JOB_TYPE",
                    f"no handler for {job.job_type!r}",
                    UNKNOWN_TYPE_RETRY_SECONDS,
                )
            else:
                # 2. run it under its time limit, 3. normalise how it ended
                outcome = await execute(
                    job,
                    handler,
                    self.threads,
                    reservation,
                    self.settings.default_timeout,
                    self.batches,
                )
        finally:
            # The slot is free whatever happened, and so is a thread the handler
            # never got; the claimer may take more.
            if reservation is not None:
                reservation.release_if_unused()
            self.slot_freed()
        if job.ran_seconds is not None and not job.interrupted:
            # (a run this worker stopped does not count; a weighed one counts as
            # long: twice the ids of weighed jobs would find no room to start)
            self.ran(job.ran_seconds if job.weight == 1 else math.inf)
        if outcome is None and job.recorded:
            self.journal.succeeded(job)  # its own transaction recorded it
        # 4. hand the outcome to the ledger, for the reporter to record
        self.ledger.handler_done(job, outcome)


class Threads:
    """The thread pool plain-function handlers run in, with an honest count of the
    threads that are busy, including those still running a handler that timed out."""

    def __init__(self, size: int, on_free: Callable[[], None] = lambda: None) -> None:
        self.size = size
        self.on_free = on_free
        self.busy = 0
        # Threads whose handler ran past its time limit and has not returned yet.
        self.overdue = 0
        # Set by a graceful stop: a handler that runs past its time limit now is
        # abandoned (its lease lapses) rather than reported as timed out.
        self.stopping = False
        self.executor = ThreadPoolExecutor(size, thread_name_prefix="handler")

    @property
    def free(self) -> int:
        return max(0, self.size - self.busy)

    def reserve(self) -> Reservation:
        """Count a thread busy from the moment its job is claimed."""
        self.busy += 1
        return Reservation(self)

    async def run(
        self, reservation: Reservation, handler: Handler, job: Job, limit: float | None
    ) -> Any:
        """Run the handler on its reserved thread; the thread counts as busy until
        the function returns, however long after the time limit that is."""
        loop = asyncio.get_running_loop()
        reservation.taken = True

        def call() -> Any:
            reservation.started = True
            try:
                return handler.call(job)
            finally:
                # the loop may be gone: the process is exiting
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(reservation.release)

        # In the caller's context: the handler's run span is current in its thread.
        future = loop.run_in_executor(self.executor, contextvars.copy_context().run, call)
        try:
            return await _bounded(future, limit)
        except _TimedOut:
            reservation.overdue = True
            self.overdue += 1
            raise
        finally:
            if future.cancelled() and not reservation.started:
                reservation.release()  # never ran, never will

    async def run_many(
        self, reservations: list[Reservation], fn: Callable[[], Any], limit: float | None
    ) -> Any:
        """Run ``fn`` (a batch handler's call) on one thread for the jobs these
        threads were reserved for: each counts as handed to it, and busy until ``fn``
        returns, so a stop waits for the thread rather than give any of its jobs back
        while it runs."""
        loop = asyncio.get_running_loop()
        for reservation in reservations:
            reservation.taken = True

        def call() -> Any:
            for reservation in reservations:
                reservation.started = True
            try:
                return fn()
            finally:
                with contextlib.suppress(RuntimeError):  # the loop may be gone
                    for reservation in reservations:
                        loop.call_soon_threadsafe(reservation.release)

        future = loop.run_in_executor(self.executor, contextvars.copy_context().run, call)
        try:
            return await _bounded(future, limit)
        except _TimedOut:
            for reservation in reservations:
                reservation.overdue = True
                self.overdue += 1
            raise
        finally:
            if future.cancelled():
                for reservation in reservations:
                    if not reservation.started:
                        reservation.release()

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class Reservation:
    """One thread, counted busy from claim until the handler's function returns."""

    def __init__(self, threads: Threads) -> None:
        self.threads = threads
        self.taken = False
        self.started = False
        self.overdue = False
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.threads.busy -= 1
        if self.overdue:
            self.threads.overdue -= 1
        self.threads.on_free()

    def release_if_unused(self) -> None:
        """The job ended before its handler was handed the thread."""
        if not self.taken:
            self.release()


def error_code(exc: BaseException) -> str:
    """The code an exception carries (a str ``code`` attribute), else its class."""
    code = getattr(exc, "code", None)
    if isinstance(code, str) and code:
        return code
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def input_refusal(job: Job) -> Outcome | None:
    """The outcome of a job whose stored input was redacted before it started: it
    fails at once, saying why, as no attempt can bring the content back."""
    if job.input_redacted is None:
        return None
    return Outcome.failed(INPUT_REDACTED, job.input_redacted)


async def execute(
    job: Job,
    handler: Handler,
    threads: Threads,
    reservation: Reservation | None,
    default_timeout: float | None,
    batches: Batches | None = None,
) -> Outcome | None:
    """Run one attempt bounded by its time limit and normalise how it ended into
    one Outcome; None means there is nothing to report (the job's own transaction
    recorded it, or the lease was lost). A plain-function handler runs on the
    thread ``reservation`` holds for it. A batch handler's job joins a batch of
    ``batches`` (None: it is a batch of its own, called at once)."""
    if (refused := input_refusal(job)) is not None:
        return refused  # the handler is never called on nothing
    began = job.run_began = time.monotonic()
    with tracing.running(
        f"process {job.queue}",
        parent=job.trace_context,
        attributes=lambda: _span_attributes(job),
    ) as span:
        try:
            outcome = await _attempt(
                job,
                handler,
                threads,
                reservation,
                default_timeout,
                batches or Batches(threads, gather=False),
            )
            if outcome is not None and job.cancel_forced and outcome.kind != "cancelled":
                # whatever the handler did after the worker learned of the force
                outcome = Outcome.cancelled(FORCED_DISCARDED)
        except asyncio.CancelledError:
            span.outcome("interrupted", ("interrupted", "the consumer stopped the attempt"))
            raise
        finally:
            job.ran_seconds = time.monotonic() - began
        _traced_outcome(span, job, outcome)
    if outcome is not None and job.unwritten_progress() is not None:
        outcome = replace(outcome, progress=job.unwritten_progress())
    return outcome


def _span_attributes(job: Job) -> dict[str, Any]:
    return {
        tracing.MESSAGING_SYSTEM: tracing.SYSTEM,
        tracing.MESSAGING_DESTINATION_NAME: job.queue,
        tracing.MESSAGING_OPERATION_TYPE: "process",
        tracing.MESSAGING_OPERATION_NAME: "process",
        tracing.MESSAGING_MESSAGE_ID: str(job.id),
        tracing.JOB_ID: str(job.id),
        tracing.JOB_TYPE: job.job_type,
        tracing.JOB_ATTEMPT: job.attempt,
        tracing.JOB_QUEUE: job.queue,
        tracing.JOB_TENANT: job.tenant,
    }


def _traced_outcome(span: tracing.Running, job: Job, outcome: Outcome | None) -> None:
    if outcome is None:
        # nothing to report: its own transaction recorded it, or the lease is gone
        span.outcome("succeeded" if job.recorded else "lease_lost")
    elif outcome.kind in ("succeeded", "snoozed"):
        span.outcome(outcome.kind)  # neither is an error
    else:
        error = (outcome.error_code or outcome.kind, outcome.error_message or "")
        kind: str = outcome.kind
        if kind == "retry" and job.max_attempts is not None and job.attempt >= job.max_attempts:
            kind = "failed"  # its budget is spent: the outcome's statement fails it
        span.outcome(kind, error)


async def _attempt(
    job: Job,
    handler: Handler,
    threads: Threads,
    reservation: Reservation | None,
    default_timeout: float | None,
    batches: Batches,
) -> Outcome | None:
    # 2. run: an async handler in the loop, a plain function on its reserved thread,
    # bounded by the time limit
    limit = handler.time_limit(default_timeout)

    async def bounded() -> Any:
        if handler.batch is not None:
            # its share of one call for many jobs: what the call said of this job
            return await batches.join(job, handler, reservation, limit)
        if reservation is None:
            return await _bounded(handler.call(job), limit)
        return await threads.run(reservation, handler, job, limit)

    try:
        # inside the run hooks, which answer with how the handler ended, whatever they do
        value = await hooks.around(job, bounded)
    # 3. normalise: however it ended, one Outcome, or None for nothing to report
    except LeaseLost:
        log.warning("consumer.lease_lost", extra={"job_id": str(job.id), "where": "transaction"})
        return None
    except _TimedOut:
        if reservation is not None and threads.stopping:
            # The stop waited for this thread up to the time limit. Reporting the
            # timeout would let another worker retry the job while the thread still
            # runs here; leave the lease to lapse instead (the process exits, and
            # the thread with it, well before the sweeper retries the job).
            log.warning(
                "consumer.thread_abandoned",
                extra={
                    "job_id": str(job.id),
                    "limit_s": limit,
                    "action": "the stop does not wait past the time limit: the lease "
                    "lapses and the sweeper retries the job",
                },
            )
            return None
        # A plain handler's thread cannot be stopped; it runs on, and its own
        # transaction (if any) is fenced like every other write.
        return Outcome.retry(
            TIMEOUT,
            f"the attempt ran past its {limit:g} s time limit",
            handler.backoff.delay(job.attempt),
        )
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # The consumer cancelled it: for a forced cancel (its cancel withdrawn,
            # none other left), or because the lease was lost or the worker stops.
            if not (job.interrupted and task.uncancel() == 0):
                raise
            return Outcome.cancelled(INTERRUPTED)
        # A cancellation from inside the handler (it awaited something that was
        # cancelled): a failed attempt like any other error.
        return _failure(job, handler, exc)
    except BaseException as exc:
        # Any exception, and SystemExit or KeyboardInterrupt raised by handler code:
        # the job's attempt failed, the worker goes on.
        return _failure(job, handler, exc)
    if job.recorded:
        if value is not None:
            _result_ignored(job)
        return None
    return Outcome.succeeded(_result(job, value))


_ignored_results: set[str] = set()


def _result_ignored(job: Job) -> None:
    """The handler returned a value after its job.transaction() had committed the
    job's SUCCEEDED: too late to store it (said once per job type and process)."""
    if job.job_type in _ignored_results:
        return
    _ignored_results.add(job.job_type)
    log.warning(
        "consumer.result_ignored",
        extra={
            "job_id": str(job.id),
            "job_type": job.job_type,
            "why": "the handler returned a value after job.transaction() had recorded "
            "the job as SUCCEEDED, so it is not stored (said once per job type)",
            "action": "call tx.set_result(value) inside the transaction block",
        },
    )


def _result(job: Job, value: Any) -> str | None:
    encoded, dropped = encode_result(value)
    if dropped is not None:
        log.warning("consumer.result_dropped", extra={"job_id": str(job.id), "why": dropped})
    return encoded


def _failure(job: Job, handler: Handler, exc: BaseException) -> Outcome | None:
    if job.recorded:
        # The job's transaction committed SUCCEEDED, then the handler raised: the
        # recorded outcome stands.
        log.warning(
            "consumer.raised_after_commit",
            extra={"job_id": str(job.id), "error": describe_error(exc)},
        )
        return None
    if isinstance(exc, Snooze):
        return Outcome.snoozed(exc.seconds)
    if isinstance(exc, Retry):
        delay = exc.delay if exc.delay is not None else handler.backoff.delay(job.attempt)
        return Outcome.retry(exc.code, str(exc), delay)
    if isinstance(exc, Cancel):
        return Outcome.cancelled(str(exc) or "cancelled by the handler")
    trace = "".join(traceback.format_exception(exc))
    if isinstance(exc, Permanent):
        return Outcome.failed(exc.code, str(exc), trace)
    return Outcome.retry(
        error_code(exc), describe_error(exc), handler.backoff.delay(job.attempt), trace
    )
