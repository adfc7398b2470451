"""Limits across every consumer: rate limits with their buckets, and the
concurrency limits of job types and of queues with the jobs running under them and
waiting for them; setting and removing a queue's limit."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.service.errors import NotFound, invalid_argument
from hybrid_jobs.jobctl.service.models import (
    ConcurrencyLimitView,
    Limits,
    QueueLimitView,
    RateLimitView,
)


async def list_limits(session: AsyncSession) -> Limits:
    """Every rate limit, every job type's concurrency limit and every queue's, by
    name. Reads only: the waiting jobs through the limits' partial indexes, counted
    up to a bound."""
    rates = await outbox.rate_limits_async(session)
    types = await outbox.concurrency_limits_async(session)
    queues = await outbox.queue_limits_async(session)
    return Limits(
        rate_limits=tuple(
            RateLimitView(
                r.name,
                r.rate,
                r.per_seconds,
                r.burst,
                None if r.name.endswith(":*") else r.tokens,
                None if r.name.endswith(":*") else r.next_token_in_seconds,
                None if r.name.endswith(":*") else r.refilled_at,
                r.buckets,
            )
            for r in rates
        ),
        concurrency_limits=tuple(
            ConcurrencyLimitView(
                c.job_type, c.global_limit, c.running, c.waiting, c.updated_at, c.updated_by
            )
            for c in types
        ),
        queue_limits=tuple(_queue_view(q) for q in queues),
    )


def _queue_view(q: outbox.QueueLimit) -> QueueLimitView:
    return QueueLimitView(q.queue, q.limit, q.running, q.waiting, q.updated_at, q.updated_by)


async def set_queue_limit(
    session: AsyncSession, queue: str, limit: int, *, by: str
) -> tuple[QueueLimitView, bool]:
    """Give ``queue`` a concurrency limit of ``limit`` (outbox.set_queue_limit_async:
    a raised limit wakes the jobs it has room for); the limit now, and whether the
    queue had none before. Never commits."""
    had = any(q.queue == queue for q in await outbox.queue_limits_async(session))
    try:
        await outbox.set_queue_limit_async(session, queue, limit, by=by)
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc) from None
    found = next(q for q in await outbox.queue_limits_async(session) if q.queue == queue)
    return _queue_view(found), not had


async def remove_queue_limit(session: AsyncSession, queue: str) -> None:
    """Remove ``queue``'s concurrency limit (outbox.remove_queue_limit_async: the
    jobs waiting for it are woken). Never commits."""
    try:
        removed = await outbox.remove_queue_limit_async(session, queue)
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc) from None
    if not removed:
        raise NotFound(f"queue {queue!r} has no concurrency limit")
