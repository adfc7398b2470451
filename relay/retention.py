"""Retention: finished jobs leave the tables once they are old enough, and effect
keys once they are older still.

A relay chore (one relay at a time, under its own advisory lock). A job that has
been SUCCEEDED, FAILED or CANCELLED for longer than ``relay --keep-finished`` is
deleted with everything of its own: its attempts, wake-ups and replays (by cascade).
That frees its dedup key: enqueueing with it again creates a new job. A job
waiting, running or replayed meanwhile is never touched (the statement checks the
state on the locked row). Nor is a job a waiting job still waits on, so retention
never changes what a waiting job waits for: a FAILED ``ordered="strict"`` job, which
holds its key until it is replayed, and a job that an unfinished job depends on
(``after=``).

Stored inputs (``outbox.store_input``) go once no job names them and they are older
than ``relay --keep-finished``: a job deleted takes its reference with it, and an
input stored and never enqueued is kept that long for a producer that enqueues in a
later transaction. A trigger (job_inputs_keep_named) refuses the delete of one a
job still names, whatever the race.

Effect keys (``tx.once``) are not the job's: they record that an effect happened,
and a new job with the same key (its dedup key freed by retention, or a job with
none) must still find it. They have their own retention, ``relay --keep-effects``,
by age, and none by default: forgetting a key means doing its effect again.

Deletes go in small batches, one transaction each, oldest first, so no transaction
holds many row locks or grows a long WAL record, and a big first pass (retention
just switched on) is spread over many short transactions.
"""

from __future__ import annotations

import logging

from psycopg.errors import ForeignKeyViolation

from hybrid_jobs.relay.maintenance import Pool, _chore
from hybrid_jobs.schema.locks import LockKey
from hybrid_jobs.schema.queries import (
    EFFECT_RETENTION_DELETE,
    INPUT_RETENTION_DELETE,
    JOB_RETENTION_DELETE,
    WEBHOOK_DELIVERY_RETENTION_DELETE,
)

log = logging.getLogger("relay")


async def delete_finished(pool: Pool, *, keep_seconds: float, batch: int) -> int:
    """Delete every job finished more than ``keep_seconds`` ago, ``batch`` at a
    time; returns how many went (0 when another relay holds the chore)."""
    total = await _in_batches(pool, JOB_RETENTION_DELETE, keep_seconds, batch)
    if total:
        log.info("relay.retention_deleted", extra={"jobs": total, "keep_seconds": keep_seconds})
    return total


async def delete_unreferenced_inputs(pool: Pool, *, keep_seconds: float, batch: int) -> int:
    """Delete every stored input no job names and stored more than ``keep_seconds``
    ago, ``batch`` at a time; returns how many went."""
    try:
        total = await _in_batches(pool, INPUT_RETENTION_DELETE, keep_seconds, batch)
    except ForeignKeyViolation:
        # A producer committed a job naming one of the batch after this statement
        # looked: the batch is kept whole, and the next round sees the reference.
        log.info("relay.retention_input_named_meanwhile")
        return 0
    if total:
        log.info("relay.retention_deleted_inputs", extra={"inputs": total})
    return total


async def delete_old_effects(pool: Pool, *, keep_seconds: float, batch: int) -> int:
    """Delete every effect key marked more than ``keep_seconds`` ago, ``batch`` at
    a time; returns how many went."""
    total = await _in_batches(pool, EFFECT_RETENTION_DELETE, keep_seconds, batch)
    if total:
        log.info(
            "relay.retention_deleted_effects",
            extra={"effect_keys": total, "keep_seconds": keep_seconds},
        )
    return total


async def delete_old_webhook_calls(pool: Pool, *, keep_seconds: float, batch: int) -> int:
    """Delete the webhook calls delivered or given up more than ``keep_seconds``
    ago (as finished jobs), ``batch`` at a time; returns how many went."""
    total = await _in_batches(pool, WEBHOOK_DELIVERY_RETENTION_DELETE, keep_seconds, batch)
    if total:
        log.info("relay.retention_deleted_webhook_calls", extra={"calls": total})
    return total


async def _in_batches(pool: Pool, statement: str, keep_seconds: float, batch: int) -> int:
    total = 0
    while True:
        async with _chore(pool, LockKey.RETENTION) as conn:
            if conn is None:
                break
            cur = await conn.execute(statement, {"keep_seconds": keep_seconds, "limit": batch})
            row = await cur.fetchone()
        deleted = int(row[0]) if row else 0
        total += deleted
        if deleted < batch:
            break
    return total
