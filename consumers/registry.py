"""Handlers, by job type: what a consumer process can run."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar

from hybrid_jobs.consumers.backoff import DEFAULT_BACKOFF, Backoff
from hybrid_jobs.consumers.errors import Permanent
from hybrid_jobs.consumers.payload import BAD_PAYLOAD, PayloadSpec
from hybrid_jobs.consumers.producer import HandlerFunction
from hybrid_jobs.outbox import known_types, policies
from hybrid_jobs.schema import names
from hybrid_jobs.schema.tables import DEFAULT_MAX_ATTEMPTS

if TYPE_CHECKING:
    from hybrid_jobs.consumers.job import Job
    from hybrid_jobs.consumers.reconcile import Uncertain
    from hybrid_jobs.outbox.policies import JobTypePolicy

P = ParamSpec("P")
R = TypeVar("R")
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
    # The function as written: fn(job), or fn(job, **fields) when it declares its
    # payload (``payload``); call() calls it either way.
    fn: Callable[..., Any]
    queue: str
    max_attempts: int | None
    timeout: float | None
    backoff: Backoff
    rate_limit: str | None = None
    reconcile: ReconcileFn | None = None
    payload: PayloadSpec | None = None
    policy: JobTypePolicy | None = None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def call(self, job: Job) -> Any:
        """Call the function on the job (an async one returns its coroutine). A
        payload that does not fit the fields it declares fails the job at once: no
        retry can change the payload."""
        if self.payload is None:
            return self.fn(job)
        try:
            fields = self.payload.check(job.payload)
        except TypeError as exc:
            raise Permanent(str(exc), code=BAD_PAYLOAD) from None
        return self.fn(job, **fields)

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
        replay: bool = True,
        cancel_running: bool = True,
        on_cancel: str | None = None,
    ) -> Callable[[Callable[P, R]], HandlerFunction[P, R]]:
        """Register the decorated function as the handler of ``job_type``.

        It returns a :class:`~hybrid_jobs.consumers.producer.HandlerFunction`: the
        function, still callable as before, that also enqueues jobs of this type on
        this queue (``fn.enqueue(session, ...)``, ``fn.with_options(...)``). The
        function takes the job; it may declare its payload as keyword-only
        parameters after it (``def send_receipt(job, *, order_id: int)``): it is then
        called with the payload's fields, checked at ``fn.enqueue`` (``TypeError``)
        and before each call (a payload that does not fit fails the job, code
        BAD_PAYLOAD).

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

        What the type allows (:mod:`outbox.policies`, recorded in the database when
        the consumer starts, the last consumer to start winning): ``replay=False``
        refuses an operator's replay of its FAILED and CANCELLED jobs;
        ``cancel_running=False`` refuses a cancel request for a running job (a
        waiting one can always be cancelled); ``on_cancel`` says in words what its
        cancellation promises ("compensate": the handler undoes what it did;
        "none"), shown to operators. Each is refused with ``outbox.NotAllowed``
        unless the caller overrides it, which is recorded. Retries within the
        attempt budget are the handler's own: ``max_attempts=1`` means none.
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
        policy = policies.declared(
            job_type, replay=replay, cancel_running=cancel_running, on_cancel=on_cancel
        )

        def register(fn: Callable[P, R]) -> HandlerFunction[P, R]:
            # Registered again (in another registry, say): the function it wraps.
            fn = fn.__wrapped__ if isinstance(fn, HandlerFunction) else fn
            signature = inspect.signature(fn)
            required = {
                p.name: None
                for p in signature.parameters.values()
                if p.kind is p.KEYWORD_ONLY and p.default is p.empty
            }
            try:
                signature.bind(object(), **required)
            except TypeError:
                raise TypeError(
                    f"handler for {job_type!r} must take exactly one argument, the job"
                    " (its payload's fields may follow as keyword-only parameters)"
                ) from None
            if job_type in self._handlers:
                raise ValueError(f"a handler for {job_type!r} is registered already")
            wrapper = HandlerFunction(fn, job_type, queue)
            self._handlers[job_type] = Handler(
                job_type,
                fn,
                queue,
                max_attempts,
                timeout,
                backoff or DEFAULT_BACKOFF,
                rate_limit,
                reconcile,
                wrapper.payload,
                policy,
            )
            return wrapper

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

    def policies(self) -> list[dict[str, Any]]:
        """What each job type allows, as JOB_TYPE_POLICY_RECORD_MANY takes it: every
        handler's, so a type that declares nothing any more loses its row."""
        return [
            (h.policy or policies.JobTypePolicy(h.job_type)).as_row()
            for h in sorted(self._handlers.values(), key=lambda h: h.job_type)
        ]

    def reconciles(self) -> bool:
        """Whether any handler has a reconcile hook."""
        return any(h.reconcile is not None for h in self._handlers.values())

    def __len__(self) -> int:
        return len(self._handlers)


# The registry `@consumers.handler` adds to and `consumer --app MODULE` runs.
default_registry = Registry()
handler = default_registry.handler
# What $STRICT_JOB_TYPES checks a producer's job types against.
known_types.use_handlers_registry(default_registry)
