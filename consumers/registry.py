"""Handlers, by job type: what a consumer process can run."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar

from hybrid_jobs.consumers.backoff import DEFAULT_BACKOFF, Backoff
from hybrid_jobs.consumers.errors import Permanent
from hybrid_jobs.consumers.payload import BAD_PAYLOAD, PayloadSpec
from hybrid_jobs.consumers.producer import HandlerFunction
from hybrid_jobs.outbox import known_types, policies, webhooks
from hybrid_jobs.schema import names
from hybrid_jobs.schema.tables import DEFAULT_MAX_ATTEMPTS, MAX_WEIGHT

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

# The largest global_limit a handler may declare (far past any fleet).
MAX_GLOBAL_LIMIT: Final = 1_000_000
# A batch handler's wait for its batch to fill, by default (seconds).
DEFAULT_BATCH_WAIT: Final = 0.2
# A batch holds no more jobs than this (each is a lease of its own, and the batch
# never holds more than the consumer's --concurrency anyway).
MAX_BATCH: Final = 10_000


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
    # A batch handler's most jobs a call, and how long a batch waits to fill
    # (consumers/batches.py); None for a handler of one job.
    batch: int | None = None
    batch_wait: float = DEFAULT_BATCH_WAIT
    # The URL called when a job of the type without one of its own ends (recorded
    # in job_type_webhooks at start-up); None: none.
    webhook: str | None = None
    # At most this many of its jobs run at once, across every consumer (recorded
    # in concurrency_limits at start-up); None: no limit.
    global_limit: int | None = None
    # The slots a job of the type enqueued without a weight of its own takes.
    weight: int = 1

    @functools.cached_property
    def is_async(self) -> bool:
        # (asked for every job the claim takes)
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
        # claim_terms(), made again only after a handler is registered: every claim
        # asks for it, and an app may register dozens of types
        self._claim_terms: list[dict[str, Any]] | None = None

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
        batch: int | None = None,
        batch_wait: float | None = None,
        webhook: str | None = None,
        global_limit: int | None = None,
        weight: int = 1,
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

        ``batch=N`` makes it a batch handler: it takes a list of up to N jobs of
        this type (claimed by this consumer, gathered for up to ``batch_wait``
        seconds, default 0.2) and returns None (all succeeded) or a mapping of job
        (or job id) to that job's outcome: an exception to raise for that job alone,
        or its result. An exception it raises is raised for every job of the batch;
        ``timeout`` bounds the whole call. Each job keeps its own lease, heartbeat
        and fenced outcome (:mod:`consumers.batches`).

        ``webhook``: an http(s) URL the relay calls, signed, when a job of this type
        ends (SUCCEEDED, FAILED or CANCELLED), unless the job was enqueued with its
        own ``on_complete_url`` (docs/guides/webhooks.md). Recorded in the database
        when the consumer starts (the last consumer to start wins; a handler
        without it removes its type's), so jobs that end without ever reaching a
        consumer (cancelled, expired while waiting) are called about too.

        ``global_limit``: at most that many jobs of this type run at once, across
        every consumer (``--concurrency`` bounds one consumer only). Recorded in
        the database when the consumer starts (the last to start wins); a job past
        it waits (``explain``: CONCURRENCY_LIMIT) until the end of a running one
        wakes it (docs/guides/concurrency-limits.md).

        ``weight``: the slots a job of this type takes (of its consumer's
        ``--concurrency``, its tenant's cap and its type's concurrency limit) when
        it was enqueued without a weight of its own (above 1): fixed on the job at
        its first claim, as its attempt budget is (docs/guides/tenants.md).
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
        if global_limit is not None and (
            not isinstance(global_limit, int)
            or isinstance(global_limit, bool)
            or not 1 <= global_limit <= MAX_GLOBAL_LIMIT
        ):
            raise ValueError(f"global_limit must be an int from 1 to {MAX_GLOBAL_LIMIT}")
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= MAX_WEIGHT:
            raise ValueError(f"weight must be an int from 1 to {MAX_WEIGHT}")
        if global_limit is not None and weight > global_limit:
            # its jobs could never start: no lease ends to make room that is not there
            raise ValueError(
                f"weight {weight} is more than global_limit {global_limit}: no job of"
                f" {job_type!r} could ever start"
            )
        if reconcile is not None and not callable(reconcile):
            raise TypeError("reconcile must be a function of the uncertain hold")
        if batch is not None and (
            not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= MAX_BATCH
        ):
            raise ValueError(f"batch must be an int from 1 to {MAX_BATCH}")
        if batch_wait is not None and (batch is None or not 0 <= batch_wait <= 60):
            raise ValueError(
                "batch_wait needs batch=N, and is a number of seconds from 0 to 60"
                if batch is not None
                else "batch_wait applies to a batch handler: give batch=N too"
            )
        policy = policies.declared(
            job_type, replay=replay, cancel_running=cancel_running, on_cancel=on_cancel
        )
        url = None if webhook is None else webhooks.webhook_url(webhook, "webhook")

        def register(fn: Callable[P, R]) -> HandlerFunction[P, R]:
            # Registered again (in another registry, say): the function it wraps.
            fn = fn.__wrapped__ if isinstance(fn, HandlerFunction) else fn
            signature = inspect.signature(fn)
            required = {
                p.name: None
                for p in signature.parameters.values()
                if p.kind is p.KEYWORD_ONLY and p.default is p.empty
            }
            if batch is not None:
                try:
                    signature.bind(object())
                except TypeError:
                    raise TypeError(
                        f"batch handler for {job_type!r} must take exactly one argument, the"
                        " list of jobs (each job's payload is job.payload)"
                    ) from None
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
            self._claim_terms = None
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
                batch=batch,
                batch_wait=DEFAULT_BATCH_WAIT if batch_wait is None else float(batch_wait),
                webhook=url,
                global_limit=global_limit,
                weight=weight,
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
        the handler needs a thread, the rate limit its jobs take a token of, its
        concurrency limit, and the weight of its jobs enqueued without one (None
        for one). The same list each time until a handler is registered: read it,
        never change it."""
        if self._claim_terms is None:
            self._claim_terms = self._make_claim_terms()
        return self._claim_terms

    def _make_claim_terms(self) -> list[dict[str, Any]]:
        return [
            {
                "job_type": h.job_type,
                "max_attempts": h.max_attempts or DEFAULT_MAX_ATTEMPTS,
                "backoff_base": h.backoff.base,
                "backoff_cap": h.backoff.cap,
                "backoff_jitter": h.backoff.jitter,
                "sync": not h.is_async,
                "rate_limit": h.rate_limit,
                "global_limit": h.global_limit,
                "weight": h.weight if h.weight > 1 else None,
            }
            for h in self._handlers.values()
        ]

    def limits(self) -> list[dict[str, Any]]:
        """The handlers' concurrency limits, as CONCURRENCY_LIMIT_RECORD_MANY takes
        them: one per type that declares one."""
        return [
            {"job_type": h.job_type, "global_limit": h.global_limit}
            for h in sorted(self._handlers.values(), key=lambda h: h.job_type)
            if h.global_limit is not None
        ]

    def policies(self) -> list[dict[str, Any]]:
        """What each job type allows, as JOB_TYPE_POLICY_RECORD_MANY takes it: every
        handler's, so a type that declares nothing any more loses its row."""
        return [
            (h.policy or policies.JobTypePolicy(h.job_type)).as_row()
            for h in sorted(self._handlers.values(), key=lambda h: h.job_type)
        ]

    def batched(self) -> dict[str, int]:
        """The batch handlers' job types, with their batch sizes."""
        return {h.job_type: h.batch for h in self._handlers.values() if h.batch is not None}

    def webhooks(self) -> list[dict[str, Any]]:
        """Each handler's webhook URL, as JOB_TYPE_WEBHOOK_RECORD_MANY takes it:
        every handler's (None for none), so a type that declares none any more loses
        its row."""
        return [
            {"job_type": h.job_type, "url": h.webhook}
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
