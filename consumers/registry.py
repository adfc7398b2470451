"""Handlers, by job type: what a consumer process can run."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from hybrid_jobs.consumers.backoff import DEFAULT_BACKOFF, Backoff
from hybrid_jobs.schema import names
from hybrid_jobs.schema.tables import DEFAULT_MAX_ATTEMPTS

if TYPE_CHECKING:
    from hybrid_jobs.consumers.job import Job
    from hybrid_jobs.consumers.reconcile import Uncertain

HandlerFn = Callable[["Job"], Any]
# A handler's reconcile hook: given what an expired lease left uncertain, it looks at
# the target and returns what happened (text, recorded as the resolution's outcome),
# or None when it cannot tell (the resource stays uncertain). Sync or async.
ReconcileFn = Callable[["Uncertain"], Any]

# ``timeout=NO_TIMEOUT``: this handler may run as long as it likes (the consumer's
# --default-timeout does not apply to it).
NO_TIMEOUT: Final = math.inf


@dataclass(frozen=True)
class Handler:
    job_type: str
    fn: HandlerFn
    queue: str
    max_attempts: int | None
    timeout: float | None
    backoff: Backoff
    rate_limit: str | None = None
    reconcile: ReconcileFn | None = None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def time_limit(self, default: float | None) -> float | None:
        """Seconds one attempt may take: the handler's own, else the consumer's
        default; None for no limit."""
        limit = default if self.timeout is None else self.timeout
        return None if limit is None or math.isinf(limit) else limit


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
        rate_limit: str | None = None,
        reconcile: ReconcileFn | None = None,
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Register the decorated function as the handler of ``job_type``.

        ``max_attempts`` applies to jobs enqueued without their own; ``timeout`` (in
        seconds) bounds one attempt, which then fails with code TIMEOUT (default: the
        consumer's ``--default-timeout``; ``NO_TIMEOUT`` for none); ``backoff``
        spaces the retries (default: 5 s doubling up to 15 min, with jitter);
        ``rate_limit`` names the rate limit (:func:`outbox.set_rate_limit`) each of
        its jobs takes a token of when it starts, unless the job names its own.
        ``reconcile`` is called (outside any transaction) when a job of a resource
        (``enqueue(..., resource=)``) is turned down because a lease of this type's
        expired holding it: it looks at the target and returns what happened (text,
        recorded), so the resource is resolved as by :func:`outbox.resolve_resource`,
        or None to leave it uncertain for an operator. Its answer resolves the hold
        it was shown (that job's lease, :class:`consumers.Uncertain`) and no later
        one. Once retention has deleted the holder, the hook of the type turned down
        is asked instead, its hold's ``job_type`` and ``payload`` None.
        """
        names.job_type(job_type)
        names.queue(queue)
        if max_attempts is not None and (
            not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1
        ):
            raise ValueError("max_attempts must be a positive int")
        if timeout is not None and not timeout > 0:
            raise ValueError("timeout must be a positive number of seconds")
        if rate_limit is not None:
            names.rate_limit(rate_limit)
        if reconcile is not None and not callable(reconcile):
            raise TypeError("reconcile must be a function of the uncertain hold")

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
                job_type,
                fn,
                queue,
                max_attempts,
                timeout,
                backoff or DEFAULT_BACKOFF,
                rate_limit,
                reconcile,
            )
            return fn

        return register

    def get(self, job_type: str) -> Handler | None:
        return self._handlers.get(job_type)

    def queues(self) -> list[str]:
        return sorted({h.queue for h in self._handlers.values()})

    def job_types(self) -> list[str]:
        return sorted(self._handlers)

    def claim_terms(self) -> list[dict[str, Any]]:
        """What the claim needs per job type: the attempt budget for jobs enqueued
        without one, the backoff the sweeper applies if a lease expires, whether
        the handler needs a thread, and the rate limit its jobs take a token of."""
        return [
            {
                "job_type": h.job_type,
                "max_attempts": h.max_attempts or DEFAULT_MAX_ATTEMPTS,
                "backoff_base": h.backoff.base,
                "backoff_cap": h.backoff.cap,
                "backoff_jitter": h.backoff.jitter,
                "sync": not h.is_async,
                "rate_limit": h.rate_limit,
            }
            for h in self._handlers.values()
        ]

    def reconciles(self) -> bool:
        """Whether any handler has a reconcile hook."""
        return any(h.reconcile is not None for h in self._handlers.values())

    def __len__(self) -> int:
        return len(self._handlers)


# The registry `@consumers.handler` adds to and `consumer --app MODULE` runs.
default_registry = Registry()
handler = default_registry.handler
