"""Consumers, as they announce themselves."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from hybrid_jobs.jobctl.service import queries
from hybrid_jobs.jobctl.service.models import WorkerView
from hybrid_jobs.jobctl.service.sql import fetch_all
from hybrid_jobs.schema.queries import WORKER_TTL_SECONDS


async def list_workers(session: AsyncSession) -> list[WorkerView]:
    """Every consumer with a row (the relay forgets one silent for its
    --worker-ttl), with the leases it holds now. Reads only."""
    rows = await fetch_all(session, queries.WORKERS_LIST, {"worker_ttl": WORKER_TTL_SECONDS})
    # WORKERS_LIST's columns are WorkerView's fields in order; its arrays (queues,
    # job types, tenants) become tuples.
    return [WorkerView(*(_tupled(v) for v in row)) for row in rows]


def _tupled(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
