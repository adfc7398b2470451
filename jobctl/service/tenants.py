"""Tenants: their limits, their use of them, and whether the relay holds them back."""

from __future__ import annotations

from enum import Enum
from typing import Final

from sqlalchemy.ext.asyncio import AsyncSession

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.service import queries
from hybrid_jobs.jobctl.service.errors import invalid_argument
from hybrid_jobs.jobctl.service.models import Held, TenantView
from hybrid_jobs.jobctl.service.sql import fetch_all


class _Keep(Enum):
    KEEP = "keep"


# A limit left as it is by set_tenant.
KEEP: Final = _Keep.KEEP


async def list_tenants(session: AsyncSession) -> list[TenantView]:
    """Tenants with limits, and tenants whose wake-ups the relay holds back now,
    by name. Reads only."""
    held: dict[str, list[Held]] = {}
    for tenant, queue, reason, since in await fetch_all(session, queries.TENANTS_HELD):
        held.setdefault(tenant, []).append(Held(queue, reason, since))
    views = {
        t.tenant: TenantView(
            t.tenant,
            t.max_running,
            t.weight,
            t.max_queued,
            t.running,
            t.queued,
            t.queued_at,
            t.drain_per_s,
            tuple(held.get(t.tenant, ())),
            t.runners,
        )
        for t in await outbox.tenant_limits_async(session)
    }
    for tenant, holds in held.items():
        if tenant not in views:
            views[tenant] = TenantView(tenant, None, 1.0, None, 0, None, None, None, tuple(holds))
    return [views[name] for name in sorted(views)]


async def get_tenant(session: AsyncSession, tenant: str) -> TenantView | None:
    """The tenant, if it has limits or the relay holds it back. Reads only."""
    return next((t for t in await list_tenants(session) if t.tenant == tenant), None)


async def has_limits(session: AsyncSession, tenant: str) -> bool:
    """Whether the tenant has a row of limits (a PUT of it replaces rather than
    creates). Reads only."""
    return any(t.tenant == tenant for t in await outbox.tenant_limits_async(session))


async def set_tenant(
    session: AsyncSession,
    tenant: str,
    *,
    max_running: int | _Keep | None = KEEP,
    weight: float | _Keep = KEEP,
    max_queued: int | _Keep | None = KEEP,
    runners: str | _Keep = KEEP,
) -> TenantView:
    """Change a tenant's limits (outbox.set_tenant_limit_async); a limit given as
    ``KEEP`` stays as it was (for a new tenant: none, weight 1). None removes a
    limit. Never commits."""
    current = next(
        (t for t in await outbox.tenant_limits_async(session) if t.tenant == tenant), None
    )
    if max_running is KEEP:
        max_running = None if current is None else current.max_running
    if weight is KEEP:
        weight = 1.0 if current is None else current.weight
    if max_queued is KEEP:
        max_queued = None if current is None else current.max_queued
    if runners is KEEP:
        runners = "shared" if current is None else current.runners
    try:
        await outbox.set_tenant_limit_async(
            session,
            tenant,
            max_running=max_running,
            weight=weight,
            max_queued=max_queued,
            # not an operator surface's setting yet: kept as the producer set it
            max_enqueue_rate=None if current is None else current.max_enqueue_rate,
            runners=runners,
        )
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc) from None
    return next(t for t in await list_tenants(session) if t.tenant == tenant)
