"""Run hooks: async functions around every attempt a consumer makes of a job.

::

    from hybrid_jobs import consumers

    @consumers.hooks.add
    async def with_request_id(job, call_next):
        token = REQUEST_ID.set(job.meta.get("request_id"))
        try:
            return await call_next()
        finally:
            REQUEST_ID.reset(token)

A hook is an ``async def`` of the job and ``call_next``. ``await call_next()`` runs
the hooks added after it, then the handler, and returns what the handler returned or
raises what it raised (a run past the time limit raises ``TimeoutError``). Hooks run
in the order they were added on the way in, and in reverse on the way out.

Where they run: in the consumer's event loop, in the job's own task, inside the
attempt's trace span, around an async handler and a plain one alike. An async
handler runs in that same task; a plain one on its thread, which starts with a copy
of the context the hooks made, so a ``ContextVar`` a hook sets is what either kind
of handler reads. The handler's time limit bounds the handler, not the hooks: keep
them short.

The job's outcome is its handler's, whatever the hooks do: what a hook returns is
ignored, and an exception it catches is recorded all the same. A hook that raises
stops nothing but its own call: it is logged (``consumer.hook_failed``, naming the
hook and the job), and the attempt goes on as if that hook were absent (raised
before ``call_next``: the rest of the chain and the handler run without it). A hook
that returns without calling ``call_next`` is skipped the same way. Cancellation
(a stop, a lost lease, a forced cancel) passes through the hooks as
``CancelledError``: a hook's ``finally`` runs, and the attempt ends as it would
without hooks.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from hybrid_jobs.outbox.hooks import name
from hybrid_jobs.plumbing.logfmt import describe_error

if TYPE_CHECKING:
    from hybrid_jobs.consumers.job import Job

log = logging.getLogger("consumer")

CallNext = Callable[[], Awaitable[Any]]
RunHook = Callable[["Job", CallNext], Awaitable[Any]]
H = TypeVar("H", bound=RunHook)

_hooks: list[RunHook] = []


def add(hook: H) -> H:
    """Run ``hook`` around every attempt this process makes, inside the hooks added
    before it. Returns the hook, so it can be used as a decorator."""
    if not (inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(type(hook).__call__)):
        raise TypeError(f"a run hook is an async function of (job, call_next), not {hook!r}")
    _hooks.append(hook)
    return hook


def remove(hook: RunHook) -> None:
    """Stop running ``hook`` (ValueError if it was not added)."""
    _hooks.remove(hook)


def registered() -> tuple[RunHook, ...]:
    """The hooks, outermost first."""
    return tuple(_hooks)


async def around(job: Job, attempt: CallNext) -> Any:
    """``attempt()`` (the handler, bounded by its time limit) inside every hook:
    its value, or its exception raised, whatever the hooks did."""
    hooks = tuple(_hooks)
    if not hooks:
        return await attempt()
    return await _Chain(job, hooks, attempt).step(0)


class _Chain:
    """One attempt's way through the hooks. It keeps what the attempt itself ended
    with, and every level answers with that: no hook can change the outcome the
    fenced statement records."""

    def __init__(self, job: Job, hooks: tuple[RunHook, ...], attempt: CallNext) -> None:
        self.job = job
        self.hooks = hooks
        self.attempt = attempt
        self.value: Any = None
        self.error: BaseException | None = None
        self.traceback: TracebackType | None = None

    async def step(self, index: int) -> Any:
        if index == len(self.hooks):
            return await self._attempt()
        hook = self.hooks[index]
        entered = False

        async def call_next() -> Any:
            nonlocal entered
            if entered:
                raise RuntimeError("call_next runs the rest of the attempt once")
            entered = True
            return await self.step(index + 1)

        try:
            await hook(self.job, call_next)
        except BaseException as exc:
            if exc is not self.error:
                if isinstance(exc, asyncio.CancelledError) and _cancelling():
                    raise  # the consumer is cancelling the attempt, not the hook failing
                self._failed(hook, exc, entered)
        else:
            if not entered:
                self._failed(hook, RuntimeError("it returned without calling call_next"), False)
        if not entered:
            return await self.step(index + 1)
        return self._outcome()

    async def _attempt(self) -> Any:
        try:
            self.value = await self.attempt()
        except BaseException as exc:
            self.error, self.traceback = exc, exc.__traceback__
            raise
        return self.value

    def _outcome(self) -> Any:
        if self.error is not None:
            # the handler's own traceback, not one grown by every hook it passed
            raise self.error.with_traceback(self.traceback)
        return self.value

    def _failed(self, hook: RunHook, exc: BaseException, entered: bool) -> None:
        log.warning(
            "consumer.hook_failed",
            exc_info=exc,
            extra={
                "hook": name(hook),
                "job_id": str(self.job.id),
                "job_type": self.job.job_type,
                "attempt": self.job.attempt,
                "when": "after the handler" if entered else "before the handler",
                "error": describe_error(exc),
                "action": "the attempt went on as if this hook were absent; its outcome"
                " is the handler's",
            },
        )


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
