"""plumbing.transient.retried: a step that succeeds at once runs without its retry
(tenacity's bookkeeping cost a consumer a hundred calls a batch); one that fails
runs under the retry exactly as it would have, its first failure the retry's first
attempt."""

from __future__ import annotations

import asyncio

import pytest
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_none,
)

from hybrid_jobs.plumbing.transient import retried


class Steps:
    """A step that fails with the given exceptions, one per call, then answers."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"


class Retry:
    """Makes the retry and notes what it saw: how often it was made, and the attempt
    number and error of every failed attempt before it slept."""

    def __init__(self, attempts: int = 3) -> None:
        self.attempts = attempts
        self.made = 0
        self.slept: list[tuple[int, str]] = []

    def __call__(self) -> AsyncRetrying:
        self.made += 1

        def before_sleep(state: RetryCallState) -> None:
            assert state.outcome is not None
            self.slept.append((state.attempt_number, repr(state.outcome.exception())))

        return AsyncRetrying(
            retry=retry_if_exception_type(ConnectionError),
            stop=stop_after_attempt(self.attempts),
            wait=wait_none(),
            before_sleep=before_sleep,
            reraise=True,
        )


def test_a_step_that_succeeds_at_once_never_makes_its_retry() -> None:
    step, retry = Steps(), Retry()
    assert asyncio.run(retried(step, retry)) == "done"
    assert (step.calls, retry.made) == (1, 0)


def test_the_first_failure_is_the_retrys_first_attempt() -> None:
    step, retry = Steps(ConnectionError("dropped"), ConnectionError("again")), Retry()
    assert asyncio.run(retried(step, retry)) == "done"
    assert (step.calls, retry.made) == (3, 1)
    assert retry.slept == [
        (1, "ConnectionError('dropped')"),
        (2, "ConnectionError('again')"),
    ]


def test_the_retrys_stop_counts_the_bare_try() -> None:
    step, retry = Steps(*(ConnectionError(str(n)) for n in range(5))), Retry(attempts=2)
    with pytest.raises(ConnectionError, match="1"):
        asyncio.run(retried(step, retry))
    assert (step.calls, retry.made) == (2, 1)


def test_a_failure_the_retry_does_not_take_is_raised_after_one_try() -> None:
    step, retry = Steps(ValueError("bad")), Retry()
    with pytest.raises(ValueError, match="bad"):
        asyncio.run(retried(step, retry))
    assert step.calls == 1


def test_a_cancellation_goes_straight_up() -> None:
    step, retry = Steps(asyncio.CancelledError()), Retry()
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(retried(step, retry))
    assert (step.calls, retry.made) == (1, 0)
