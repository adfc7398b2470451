"""Limits across every consumer: rate limits with their buckets, and the job types'
concurrency limits with the jobs running under them and waiting for them."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.service.models import ConcurrencyLimitView, Limits, RateLimitView


async def list_limits(session: AsyncSession) -> Limits:
    """Every rate limit and every job type's concurrency limit, by name. Reads only:
    the concurrency limits' waiting jobs through their partial index, counted up to a
    bound."""
    rates = await outbox.rate_limits_async(session)
    types = await outbox.concurrency_limits_async(session)
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
    )
