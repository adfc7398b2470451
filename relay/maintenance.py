"""Periodic chores of the relay, each run by one relay at a time."""

from __future__ import annotations

import logging

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from schema.queries import MAINTENANCE_TRY_LOCK, OUTBOX_PRUNE_SENT

log = logging.getLogger("relay")

# pg_try_advisory_xact_lock key: one relay at a time does maintenance.
MAINTENANCE_LOCK_KEY = 0x6A6F6273  # "jobs"


async def prune_sent(
    pool: AsyncConnectionPool[AsyncConnection], *, retention: float, batch: int
) -> int:
    """Delete wake-ups sent longer than ``retention`` seconds ago, batch by batch."""
    total = 0
    while True:
        async with pool.connection() as conn, conn.transaction():
            locked = await (
                await conn.execute(MAINTENANCE_TRY_LOCK, {"key": MAINTENANCE_LOCK_KEY})
            ).fetchone()
            if not (locked and locked[0]):
                return total
            cur = await conn.execute(
                OUTBOX_PRUNE_SENT, {"retention_seconds": retention, "limit": batch}
            )
            total += cur.rowcount
        if cur.rowcount < batch:
            if total:
                log.info("relay.outbox_pruned", extra={"count": total})
            return total
