"""Handlers, by job type: what a consumer process can run."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from consumers.backoff import DEFAULT_BACKOFF, Backoff
from schema import names
from schema.tables import DEFAULT_MAX_ATTEMPTS

if TYPE_CHECKING:
    from consumers.job import Job

HandlerFn = Callable[["Job"], Any]


@dataclass(frozen=True)
class Handler:
    job_type: str
    fn: HandlerFn
    queue: str
    max_attempts: int | None
    timeout: float | None
    backoff: Backoff

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)


class Registry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def handler(
        self,
        job_type: str,
        *,
        queue: str = "default",
        max_attempts: int | None = None,
        timeout: float | None = None,
        backoff: Backoff | None = None,
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Register the decorated function as the handler of ``job_type``.

        ``max_attempts`` applies to jobs enqueued without their own; ``timeout`` (in
        seconds) bounds one attempt, which then fails with code TIMEOUT; ``backoff``
        spaces the retries (default: 5 s doubling up to 15 min, with jitter).
        """
        names.job_type(job_type)
        names.queue(queue)
        if max_attempts is not None and (
            not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1
        ):
            raise ValueError("max_attempts must be a positive int")
        if timeout is not None and not timeout > 0:
            raise ValueError("timeout must be a positive number of seconds")

        def register(fn: HandlerFn) -> HandlerFn:
            try:
                inspect.signature(fn).bind(object())
            except TypeError:
                raise TypeError(
                    f"handler for {job_type!r} must take exactly one argument, the job"
                ) from None
            if job_type in self._handlers:
                raise ValueError(f"a handler for {job_type!r} is registered already")
            self._handlers[job_type] = Handler(
                job_type, fn, queue, max_attempts, timeout, backoff or DEFAULT_BACKOFF
            )
            return fn

        return register

    def get(self, job_type: str) -> Handler | None:
        return self._handlers.get(job_type)

    def queues(self) -> list[str]:
        return sorted({h.queue for h in self._handlers.values()})

    def budgets(self) -> list[dict[str, Any]]:
        """Each job type's attempt budget, for jobs enqueued without one."""
        return [
            {"job_type": h.job_type, "max_attempts": h.max_attempts or DEFAULT_MAX_ATTEMPTS}
            for h in self._handlers.values()
        ]

    def __len__(self) -> int:
        return len(self._handlers)


# The registry `@consumers.handler` adds to and `consumer --app MODULE` runs.
default_registry = Registry()
handler = default_registry.handler
