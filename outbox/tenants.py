"""Tenants' limits, set and read inside the caller's transaction.

A tenant's ``max_running`` caps how many of its jobs run at once (a slot is
reserved by the claim that starts a job and released by the statement that ends
its lease); ``weight`` is its share of a busy queue against the other tenants
(weight 2 gets twice the share of weight 1); ``max_queued`` makes ``enqueue`` raise
:class:`outbox.Backpressure` once that many of its jobs wait, and
``max_enqueue_rate`` (jobs per second) when it enqueues faster. None means no limit.
``runners`` is ``"shared"`` (any consumer of the queue takes its jobs) or
``"dedicated"`` (only consumers started with ``--tenant`` naming it do; its jobs
wait as NO_AUTHORIZED_RUNNER while none is live).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hybrid_jobs import defaults
from hybrid_jobs.outbox.enqueue import psycopg_connection
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.schema import names
from hybrid_jobs.schema.queries import TENANT_LIMIT_LIST, TENANT_LIMIT_SET

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

MAX_WEIGHT = defaults.MAX_TENANT_WEIGHT
RUNNERS = ("shared", "dedicated")


@dataclass(frozen=True)
class TenantLimit:
    tenant: str
    max_running: int | None
    weight: float
    max_queued: int | None
    # Slots held now, and the waiting jobs as the relay last counted them (with
    # when), up to max_queued. Counted only for tenants with a max_queued: None
    # for the others (not 0: their jobs are not counted at all).
    running: int
    queued: int | None
    queued_at: datetime | None
    drain_per_s: float | None
    max_enqueue_rate: float | None = None
    runners: str = "shared"


def _limit(name: str, value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int or None, not {type(value).__name__}")
    if not 0 <= value <= 2**31 - 1:
        raise ValueError(f"{name} must be between 0 and {2**31 - 1}")
    return value


def _rate(value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"max_enqueue_rate must be a number or None, not {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError("max_enqueue_rate must be a positive number of jobs per second")
    return float(value)


def _params(
    tenant: str,
    max_running: int | None,
    weight: float,
    max_queued: int | None,
    max_enqueue_rate: float | None = None,
    runners: str = "shared",
) -> dict[str, Any]:
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise TypeError(f"weight must be a number, not {type(weight).__name__}")
    if not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
        raise ValueError(f"weight must be more than 0 and at most {MAX_WEIGHT:g}")
    if runners not in RUNNERS:
        raise ValueError(f"runners must be 'shared' or 'dedicated', not {runners!r}")
    return {
        "tenant": names.tenant(tenant),
        "max_running": _limit("max_running", max_running),
        "weight": float(weight),
        "max_queued": _limit("max_queued", max_queued),
        "max_enqueue_rate": _rate(max_enqueue_rate),
        "runners": runners,
    }


def set_tenant_limit(
    session: Session,
    tenant: str,
    *,
    max_running: int | None = None,
    weight: float = 1.0,
    max_queued: int | None = None,
    max_enqueue_rate: float | None = None,
    runners: str = "shared",
) -> None:
    """Create or change a tenant's limits through the session's transaction (never
    commits). Jobs already running when a cap is first set do not hold slots; the
    cap counts the jobs claimed from then on. ``max_enqueue_rate``: jobs per
    second the tenant may enqueue (a second's worth at once); faster, enqueue
    raises :class:`outbox.Backpressure`. ``runners="dedicated"``: only consumers
    naming the tenant (``consumer --tenant``) take its jobs; ``"shared"``: any."""
    values = _params(tenant, max_running, weight, max_queued, max_enqueue_rate, runners)
    conn = psycopg_connection(session)
    conn.exec_driver_sql(TENANT_LIMIT_SET, values)


set_tenant_limit_async = async_twin(set_tenant_limit)


def tenant_limits(session: Session) -> list[TenantLimit]:
    """Every tenant that has limits, with its slots in use and, for a tenant with
    a ``max_queued``, its waiting jobs as the relay last counted them (at most a few
    seconds old, counted up to ``max_queued``). ``queued`` is None for a tenant
    without ``max_queued``: its waiting jobs are not counted (``jobctl jobs list
    --tenant`` lists them)."""
    conn = psycopg_connection(session)
    return [TenantLimit(*row) for row in conn.exec_driver_sql(TENANT_LIMIT_LIST).all()]


tenant_limits_async = async_twin(tenant_limits)
