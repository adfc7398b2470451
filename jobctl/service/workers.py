"""Consumers, as they announce themselves."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from jobctl.service import queries
from jobctl.service.models import WorkerView
from jobctl.service.sql import fetch_all
from schema.queries import WORKER_TTL_SECONDS


async def list_workers(session: AsyncSession) -> list[WorkerView]:
    """Every consumer with a row (the relay forgets one silent for its
    --worker-ttl), with the leases it holds now. Reads only."""
    rows = await fetch_all(session, queries.WORKERS_LIST, {"worker_ttl": WORKER_TTL_SECONDS})
    return [
        WorkerView(
            worker_id,
            host,
            pid,
            tuple(queues),
            tuple(job_types),
            concurrency,
            prefetch,
            started_at,
            last_seen_at,
            stopping,
            live,
            running,
            counts,
            tuple(tenants),
        )
        for (
            worker_id,
            host,
            pid,
            queues,
            job_types,
            concurrency,
            prefetch,
            started_at,
            last_seen_at,
            stopping,
            live,
            running,
            counts,
            tenants,
        ) in rows
    ]
