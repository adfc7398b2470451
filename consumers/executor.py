"""Running one attempt: the handler in, one Outcome (or nothing to report) out.

The pipeline, in the manner of Oban's executor: resolve the handler, run it (async
in the loop, plain functions in a thread) under its timeout, and normalise however
it ended into the one result the reporter records.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

from consumers.backoff import DEFAULT_BACKOFF
from consumers.errors import Cancel, LeaseLost, Permanent, Retry
from consumers.job import Job
from consumers.outcome import TIMEOUT, UNKNOWN_JOB_TYPE, Outcome
from consumers.registry import Handler
from schema.logfmt import describe_error

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
    timeout = asyncio.timeout(handler.timeout)
    try:
        async with timeout:
            if handler.is_async:
                await handler.fn(job)
            else:
                await asyncio.get_running_loop().run_in_executor(threads, handler.fn, job)
    except LeaseLost:
        log.warning("consumer.lease_lost", extra={"job_id": str(job.id), "where": "transaction"})
        return None
    except TimeoutError as exc:
        if not timeout.expired():
            return _failure(job, handler, exc)
        # A plain handler's thread cannot be stopped; it runs on, and its own
        # transaction (if any) is fenced like every other write.
        return Outcome.retry(
            TIMEOUT,
            f"the attempt ran past the handler's {handler.timeout}s timeout",
            handler.backoff.delay(job.attempt),
        )
    except Exception as exc:
        return _failure(job, handler, exc)
    if job.recorded:
        return None
    return Outcome.succeeded()


def _failure(job: Job, handler: Handler, exc: Exception) -> Outcome | None:
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
