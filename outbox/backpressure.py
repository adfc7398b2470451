"""Backpressure at enqueue: a tenant with ``max_queued`` jobs waiting gets no more.

A producer finds out at once, before anything is written, instead of piling up work
that can only be late. The count costs no hot row and no count of the table (see
TENANT_BACKPRESSURE), so it is an estimate that can run over by what producers
enqueue at the same instant: a soft limit, like every admission limit in a system
with concurrent writers.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hybrid_jobs import defaults
from hybrid_jobs.schema.queries import TENANT_BACKPRESSURE, TENANT_ENQUEUE_TAKE

if TYPE_CHECKING:
    from sqlalchemy import Connection

MIN_RETRY_AFTER = defaults.MIN_RETRY_AFTER
MAX_RETRY_AFTER = defaults.MAX_RETRY_AFTER
UNKNOWN_DRAIN_RETRY_AFTER = defaults.UNKNOWN_DRAIN_RETRY_AFTER


class Backpressure(Exception):
    """The tenant already has ``limit`` jobs waiting (its ``max_queued``), or
    enqueues faster than its ``max_enqueue_rate`` (then set here, and ``limit`` and
    ``waiting`` are 0), so this enqueue wrote nothing. ``retry_after`` is a hint,
    in seconds: from how fast the tenant's jobs drained lately, or when its rate
    has room for these jobs."""

    def __init__(
        self,
        tenant: str,
        limit: int,
        waiting: int,
        retry_after: float,
        *,
        max_enqueue_rate: float | None = None,
    ) -> None:
        if max_enqueue_rate is None:
            message = f"tenant {tenant!r} has {waiting} jobs waiting, its max_queued is {limit}"
        else:
            message = f"tenant {tenant!r} enqueues faster than {max_enqueue_rate:g} jobs/s"
        super().__init__(f"{message}; retry in about {retry_after:.1f} s")
        self.tenant = tenant
        self.limit = limit
        self.waiting = waiting
        self.retry_after = retry_after
        self.max_enqueue_rate = max_enqueue_rate


def refuse(conn: Connection, tenants: Counter[str]) -> None:
    """Raise Backpressure for the first tenant these jobs would take past its
    max_queued or its max_enqueue_rate, before anything is written; a batch of no
    tenant asks nothing."""
    if tenants:
        refuse_over_limit(tenants, conn.exec_driver_sql(STATEMENT, params(tenants)).all())
        refuse_over_rate(conn.exec_driver_sql(RATE_STATEMENT, rate_params(tenants)).all())


def tenants_of(rows: Sequence[str | None]) -> Counter[str]:
    return Counter(t for t in rows if t is not None)


def params(adding: Counter[str]) -> dict[str, Any]:
    return {"tenants": sorted(adding)}


def refuse_over_limit(adding: Counter[str], rows: Sequence[Any]) -> None:
    """Raise Backpressure for the first tenant these jobs would take past its limit."""
    for tenant, limit, waiting, drain_per_s in rows:
        extra = adding[tenant]
        if waiting + extra > limit:
            excess = waiting + extra - limit
            hint = (
                min(max(excess / drain_per_s, MIN_RETRY_AFTER), MAX_RETRY_AFTER)
                if drain_per_s
                else UNKNOWN_DRAIN_RETRY_AFTER
            )
            raise Backpressure(tenant, limit, waiting, round(hint, 1))


def rate_params(adding: Counter[str]) -> dict[str, Any]:
    return {"tenants": json.dumps([{"tenant": t, "n": n} for t, n in sorted(adding.items())])}


def refuse_over_rate(rows: Sequence[Any]) -> None:
    """Raise Backpressure for the first tenant short of enqueue tokens: due again
    once its bucket holds as many as it wanted (the bucket holds a second's
    worth: more than that at once never fits)."""
    for tenant, wanted, tokens, rate in rows:
        retry_after = max(0.0, (min(wanted, max(rate, 1.0)) - tokens) / rate)
        raise Backpressure(tenant, 0, 0, round(retry_after, 3), max_enqueue_rate=rate)


STATEMENT = TENANT_BACKPRESSURE
RATE_STATEMENT = TENANT_ENQUEUE_TAKE
