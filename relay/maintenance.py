"""Periodic chores of the relay, each run by one relay at a time."""

from __future__ import annotations

import logging

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from relay.broker import Publisher
from schema.queries import (
    JOB_REWAKE_STRANDED,
    JOB_STRANDED_QUEUES,
    JOB_SWEEP_EXPIRED,
    MAINTENANCE_TRY_LOCK,
    OUTBOX_PRUNE_SENT,
)

log = logging.getLogger("relay")

# pg_try_advisory_xact_lock keys: one relay at a time does each chore, and a long
# prune never makes the sweeper skip its round.
PRUNE_LOCK = 0x6A6F6201
SWEEP_LOCK = 0x6A6F6202
REWAKE_LOCK = 0x6A6F6203


async def _locked(conn: AsyncConnection, key: int) -> bool:
    row = await (await conn.execute(MAINTENANCE_TRY_LOCK, {"key": key})).fetchone()
    return bool(row and row[0])


async def prune_sent(
    pool: AsyncConnectionPool[AsyncConnection], *, retention: float, batch: int
) -> int:
    """Delete wake-ups sent longer than ``retention`` seconds ago, batch by batch."""
    total = 0
    while True:
        async with pool.connection() as conn, conn.transaction():
            if not await _locked(conn, PRUNE_LOCK):
                return total
            cur = await conn.execute(
                OUTBOX_PRUNE_SENT, {"retention_seconds": retention, "limit": batch}
            )
            total += cur.rowcount
        if cur.rowcount < batch:
            if total:
                log.info("relay.outbox_pruned", extra={"count": total})
            return total


async def sweep_expired(pool: AsyncConnectionPool[AsyncConnection], *, batch: int) -> int:
    """Move jobs whose lease expired without a report on, batch by batch."""
    total = 0
    while True:
        async with pool.connection() as conn, conn.transaction():
            if not await _locked(conn, SWEEP_LOCK):
                return total
            rows = await (await conn.execute(JOB_SWEEP_EXPIRED, {"limit": batch})).fetchall()
        total += len(rows)
        for job_id, state in rows:
            log.warning(
                "relay.lease_expired",
                extra={"job_id": str(job_id), "state": state, "action": "swept"},
            )
        if len(rows) < batch:
            return total


async def rewake_stranded(
    pool: AsyncConnectionPool[AsyncConnection],
    publisher: Publisher,
    *,
    grace: float,
    batch: int,
) -> int:
    """Queue a new wake-up for due jobs whose wake-up seems lost.

    A job qualifies when it has been claimable for more than ``grace`` seconds, has no
    unsent wake-up and none sent within ``grace``, and its queue holds no ready
    message in RabbitMQ. The last condition keeps a backlog (wake-ups waiting their
    turn) from being mistaken for loss and flooded with duplicates; the ones a
    consumer has prefetched but not yet claimed may get one duplicate, which costs a
    claim that matches nothing.
    """
    params = {"grace_seconds": grace}
    async with pool.connection() as conn:
        candidates = await (await conn.execute(JOB_STRANDED_QUEUES, params)).fetchall()
    if not candidates:
        return 0
    ready = await publisher.ready_counts([queue for queue, _ in candidates])
    empty = [queue for queue, _ in candidates if ready.get(queue, 0) == 0]
    if not empty:
        return 0
    async with pool.connection() as conn, conn.transaction():
        if not await _locked(conn, REWAKE_LOCK):
            return 0
        cur = await conn.execute(JOB_REWAKE_STRANDED, params | {"queues": empty, "limit": batch})
        woken = cur.rowcount
    if woken:
        log.warning(
            "relay.rewoke_stranded_jobs",
            extra={"count": woken, "queues": empty, "why": "no wake-up pending or recent"},
        )
    return woken
