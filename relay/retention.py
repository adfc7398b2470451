"""Retention: finished jobs leave the tables once they are old enough.

A relay chore (one relay at a time, under its own advisory lock). A job that has
been SUCCEEDED, FAILED or CANCELLED for longer than ``relay --keep-finished`` is
deleted with everything of its own: its attempts, wake-ups and replays (by cascade)
and its effect keys. That frees its dedup key: enqueueing with it again creates a
new job. A job waiting, running or replayed meanwhile is never touched (the
statement checks the state on the locked row).

Deletes go in small batches, one transaction each, oldest first, so no transaction
holds many row locks or grows a long WAL record, and a big first pass (retention
just switched on) is spread over many short transactions.
"""

from __future__ import annotations

import logging

from relay.maintenance import Pool, _chore
from schema.queries import JOB_RETENTION_DELETE

log = logging.getLogger("relay")

RETENTION_LOCK = 0x6A6F6207


async def delete_finished(pool: Pool, *, keep_seconds: float, batch: int) -> int:
    """Delete every job finished more than ``keep_seconds`` ago, ``batch`` at a
    time; returns how many went (0 when another relay holds the chore)."""
    total = 0
    while True:
        async with _chore(pool, RETENTION_LOCK) as conn:
            if conn is None:
                break
            cur = await conn.execute(
                JOB_RETENTION_DELETE, {"keep_seconds": keep_seconds, "limit": batch}
            )
            row = await cur.fetchone()
        deleted = int(row[0]) if row else 0
        total += deleted
        if deleted < batch:
            break
    if total:
        log.info("relay.retention_deleted", extra={"jobs": total, "keep_seconds": keep_seconds})
    return total
