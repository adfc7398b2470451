"""The worker runtime: register handlers, run them with `consumer --app MODULE`.

::

    from hybrid_jobs import consumers

    @consumers.handler("send_receipt", queue="mail", max_attempts=8, timeout=30)
    async def send_receipt(job):
        async with job.transaction() as tx:          # commits with SUCCEEDED
            if await tx.once(f"receipt:{job.payload['order_id']}"):
                await tx.execute("INSERT INTO sent_emails ...", {...})

The decorated function enqueues jobs of its type on its queue
(``send_receipt.enqueue(session, order_id=42)``); declared as
``def send_receipt(job, *, order_id: int)``, it takes the payload's fields as keyword
arguments, checked at that enqueue and before each call.

Raise :class:`Retry` to try again later, :class:`Snooze` to look again later without
spending an attempt, :class:`Permanent` to fail at once, :class:`Cancel` to
acknowledge ``job.cancel_requested``; any other exception retries with backoff until
the job's attempts are spent. ``await job.step_async("charge", charge)`` (``job.step``
in a plain handler) records a step's result, so that a later attempt skips it and
resumes at the first unfinished step.

``hooks.add`` wraps every attempt in an async function of yours
(:mod:`consumers.hooks`): a request id, a tenant's settings, metrics.
"""

from hybrid_jobs.consumers import hooks
from hybrid_jobs.consumers.backoff import Backoff
from hybrid_jobs.consumers.batches import BAD_BATCH_RESULT
from hybrid_jobs.consumers.errors import Cancel, LeaseLost, Permanent, Retry, Snooze
from hybrid_jobs.consumers.job import AsyncTx, Job, SyncTx
from hybrid_jobs.consumers.payload import BAD_PAYLOAD, INPUT_REDACTED
from hybrid_jobs.consumers.producer import Enqueuer, HandlerFunction
from hybrid_jobs.consumers.reconcile import Uncertain
from hybrid_jobs.consumers.registry import NO_TIMEOUT, Registry, default_registry, handler

__all__ = [
    "BAD_BATCH_RESULT",
    "BAD_PAYLOAD",
    "INPUT_REDACTED",
    "NO_TIMEOUT",
    "AsyncTx",
    "Backoff",
    "Cancel",
    "Enqueuer",
    "HandlerFunction",
    "Job",
    "LeaseLost",
    "Permanent",
    "Registry",
    "Retry",
    "Snooze",
    "SyncTx",
    "Uncertain",
    "default_registry",
    "handler",
    "hooks",
]
