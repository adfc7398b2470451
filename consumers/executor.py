"""Running one attempt: the handler in, one Outcome (or nothing to report) out.

The pipeline, in the manner of Oban's executor: resolve the handler, run it (async
in the loop, plain functions in a thread) under its timeout, and normalise however
it ended into the one result the reporter records.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from concurrent.futures import Executor

from consumers.backoff import DEFAULT_BACKOFF
from consumers.errors import Cancel, LeaseLost, Permanent, Retry
from consumers.job import Job
from consumers.outcome import TIMEOUT, UNKNOWN_JOB_TYPE, Outcome
from consumers.registry import Handler
from plumbing.logfmt import describe_error

log = logging.getLogger("consumer")


def error_code(exc: BaseException) -> str:
    """The code an exception carries (a str ``code`` attribute), else its class."""
    code = getattr(exc, "code", None)
    if isinstance(code, str) and code:
        return code
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


async def execute(job: Job, handler: Handler | None, threads: Executor) -> Outcome | None:
    """Run one attempt; None means there is nothing to report (the job's own
    transaction recorded it, or the lease was lost)."""
    if handler is None:
        return Outcome.retry(
            UNKNOWN_JOB_TYPE,
            f"no handler for job type {job.job_type!r} in this consumer",
            DEFAULT_BACKOFF.delay(job.attempt),
        )
    try:
        await _run_handler(job, handler, threads)
    except LeaseLost:
        log.warning("consumer.lease_lost", extra={"job_id": str(job.id), "where": "transaction"})
        return None
    except _TimedOut:
        # A plain handler's thread cannot be stopped; it runs on, and its own
        # transaction (if any) is fenced like every other write.
        return Outcome.retry(
            TIMEOUT,
            f"the attempt ran past the handler's {handler.timeout}s timeout",
            handler.backoff.delay(job.attempt),
        )
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the consumer cancelled it: lease lost, or shutting down
        # A cancellation from inside the handler (it awaited something that was
        # cancelled): a failed attempt like any other error.
        return _failure(job, handler, exc)
    except BaseException as exc:
        # Any exception, and SystemExit or KeyboardInterrupt raised by handler code:
        # the job's attempt failed, the worker goes on.
        return _failure(job, handler, exc)
    if job.recorded:
        return None
    return Outcome.succeeded()


class _TimedOut(Exception):
    """The attempt ran past the handler's timeout (not a TimeoutError of its own)."""


async def _run_handler(job: Job, handler: Handler, threads: Executor) -> None:
    if handler.is_async:
        await _bounded(handler.fn(job), handler.timeout)
        return
    # A plain handler runs in the pool, and its timeout starts when a thread takes it:
    # waiting for a thread (the pool may be busy with timed-out handlers that run
    # on) must not spend the attempt.
    loop = asyncio.get_running_loop()
    started = asyncio.Event()

    def call() -> object:
        loop.call_soon_threadsafe(started.set)
        return handler.fn(job)

    future = loop.run_in_executor(threads, call)
    try:
        await started.wait()
    except BaseException:
        future.cancel()  # not started yet: now it never will be
        raise
    await _bounded(future, handler.timeout)


async def _bounded(work: Awaitable[object], seconds: float | None) -> None:
    try:
        async with asyncio.timeout(seconds) as limit:
            await work
    except TimeoutError:
        if limit.expired():
            raise _TimedOut from None
        raise


def _failure(job: Job, handler: Handler, exc: BaseException) -> Outcome | None:
    if job.recorded:
        # The job's transaction committed SUCCEEDED, then the handler raised: the
        # recorded outcome stands.
        log.warning(
            "consumer.raised_after_commit",
            extra={"job_id": str(job.id), "error": describe_error(exc)},
        )
        return None
    if isinstance(exc, Retry):
        delay = exc.delay if exc.delay is not None else handler.backoff.delay(job.attempt)
        return Outcome.retry(exc.code, str(exc), delay)
    if isinstance(exc, Permanent):
        return Outcome.failed(exc.code, str(exc))
    if isinstance(exc, Cancel):
        return Outcome.cancelled(str(exc) or "cancelled by the handler")
    return Outcome.retry(error_code(exc), describe_error(exc), handler.backoff.delay(job.attempt))
