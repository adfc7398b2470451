"""Which failures are worth retrying, and how long to wait between tries.

A transient failure is one where the same statement, run again, can succeed: the
connection dropped or the server restarted, a serialization failure, a deadlock, a
pool with no connection to give. Every statement this project retries is safe to
repeat: a claim or an outcome that did not commit changed nothing, and one that did
commit makes its repeat match zero rows (its fence or state predicate no longer
holds).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiormq.exceptions
import psycopg
import psycopg.errors
import psycopg_pool
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    retry_if_exception_type,
    wait_exponential,
    wait_random,
)

from hybrid_jobs.plumbing.logfmt import describe_error

# Seconds between reconnect attempts: 0.1, 0.2, 0.4 ... capped at 5, with jitter so a
# fleet of workers does not return in lockstep after an outage.
reconnect_wait = wait_exponential(multiplier=0.1, max=5.0) + wait_random(0, 0.2)

_DB_TRANSIENT = (
    psycopg.OperationalError,  # connection lost, admin shutdown, server starting up
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
    psycopg_pool.PoolTimeout,
    psycopg.errors.QueryCanceled,
)

_BROKER_TRANSIENT = (
    ConnectionError,
    aiormq.exceptions.AMQPConnectionError,
    aiormq.exceptions.ChannelInvalidStateError,
    aiormq.exceptions.ChannelClosed,
    asyncio.TimeoutError,
)


def is_transient_db_error(exc: BaseException) -> bool:
    return isinstance(exc, _DB_TRANSIENT)


def is_transient_broker_error(exc: BaseException) -> bool:
    return isinstance(exc, _BROKER_TRANSIENT)


def is_transient(exc: BaseException) -> bool:
    return is_transient_db_error(exc) or is_transient_broker_error(exc)


def retry_forever(
    log: logging.Logger, event: str, *, only_transient: bool = False
) -> AsyncRetrying:
    """Retry a step of a daemon loop until it succeeds, backing off between tries.

    Transient failures log a warning; anything else logs an error with its traceback
    (it is a bug or a misconfiguration, and the operator needs to see it), and is
    retried too, so one bad moment never stops the daemon; with ``only_transient``
    it is raised instead, for a caller that can do something else with it.
    """

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if exc is None:
            return
        fields = {
            "attempt": state.attempt_number,
            "retry_in_s": round(state.upcoming_sleep, 2),
            "error": describe_error(exc),
        }
        if is_transient(exc):
            log.warning(event, extra=fields)
        else:
            log.error(event, extra=fields, exc_info=exc)

    return AsyncRetrying(
        retry=retry_if_exception(is_transient)
        if only_transient
        else retry_if_exception_type(Exception),
        wait=reconnect_wait,
        before_sleep=before_sleep,
        reraise=True,
    )


T = TypeVar("T")


async def retried(step: Callable[[], Awaitable[T]], retrying: Callable[[], AsyncRetrying]) -> T:
    """``await step()`` under the retry ``retrying()`` makes, made and run only once
    a try has failed.

    A claim and an outcome run under a retry for every batch, thousands a second,
    and tenacity's bookkeeping of one successful try cost a consumer about a
    hundred function calls. The first try runs bare; should it fail, its exception
    is ``retrying``'s first attempt, raised inside it, so the retry, its waits, its
    logging and its stop are what they would have been. (A BaseException that is
    not an Exception, a cancellation, goes straight up: no retry here takes it.)
    """
    try:
        return await step()
    except Exception as exc:
        failed: Exception | None = exc
    async for attempt in retrying():
        with attempt:
            if failed is not None:
                first, failed = failed, None
                raise first
            return await step()
    raise AssertionError("tenacity ends by returning or raising")  # pragma: no cover


async def unless_stopped(stop: asyncio.Event, work: Awaitable[None]) -> bool:
    """Run ``work`` until it finishes (True) or ``stop`` is set first (False, and the
    work is cancelled): a daemon still waiting for its services at startup must
    still stop on SIGTERM."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        stopped.cancel()
        task.result()
        return True
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return False
