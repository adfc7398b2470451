"""Every statement that changes a job or the outbox, named, in one place.

Each transition is a single guarded statement: its WHERE clause carries the state it
may leave and, when a worker writes, the fence (``lease_owner`` and
``lease_generation``). Statements that apply to a batch take the fence per row, so a
batch is many fenced updates in one commit. Times are always the database's
``now()``, never a worker's clock. Parameters use psycopg's ``%(name)s`` style and
are always bound, never formatted in.

Names are noun first, the way River names its queries: ``job_claim_many``,
``outbox_claim_due``. The relay and the consumer call them by name and never write
SQL of their own.
"""

from __future__ import annotations

from typing import Final

from schema.tables import CLAIMABLE_SQL, LEASED_SQL

# --------------------------------------------------------------------------- producer

# Inserts a batch of jobs and their wake-ups in one statement. A job whose
# (job_type, dedup_key) exists already inserts nothing, and gets no wake-up; the
# caller then looks its id up with job_find_by_dedup_many. The outbox trigger
# notifies the relay when the caller's transaction commits.
JOB_INSERT_MANY: Final = """
WITH input AS (
    SELECT *
    FROM jsonb_to_recordset(%(jobs)s::jsonb) AS i(
        job_id uuid, job_type text, queue text, payload jsonb, dedup_key text,
        max_attempts integer, priority smallint, run_after timestamptz,
        delay_seconds double precision)
), inserted AS (
    INSERT INTO jobs AS j
        (job_id, job_type, queue, payload, dedup_key, max_attempts, priority, run_after)
    SELECT job_id, job_type, queue, payload, dedup_key, max_attempts, priority,
           COALESCE(run_after, now() + make_interval(secs => COALESCE(delay_seconds, 0)))
    FROM input
    ON CONFLICT (job_type, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING j.job_id, j.queue, j.run_after
), woken AS (
    INSERT INTO outbox (job_id, queue, available_at)
    SELECT job_id, queue, run_after FROM inserted
)
SELECT job_id FROM inserted
"""

# A separate statement from the insert on purpose: under READ COMMITTED it takes a
# fresh snapshot, so it sees the row of a concurrent transaction that won the race on
# the same dedup key (the insert above waited for that transaction to commit).
JOB_FIND_BY_DEDUP_MANY: Final = """
SELECT j.job_type, j.dedup_key, j.job_id
FROM jsonb_to_recordset(%(keys)s::jsonb) AS k(job_type text, dedup_key text)
JOIN jobs j ON j.job_type = k.job_type AND j.dedup_key = k.dedup_key
"""

# ----------------------------------------------------------------------------- relay

# Claims a batch of due wake-ups and marks them sent, in the relay's transaction. The
# relay publishes them before it commits; a failed publish rolls the mark back, so the
# rows go out again. SKIP LOCKED lets several relays drain the outbox side by side
# without ever holding the same row.
OUTBOX_CLAIM_DUE: Final = """
WITH due AS (
    SELECT id
    FROM outbox
    WHERE sent_at IS NULL AND available_at <= now()
    ORDER BY available_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox AS o
SET sent_at = now()
FROM due, jobs AS j
WHERE o.id = due.id AND j.job_id = o.job_id
RETURNING o.id, o.job_id, o.queue, j.priority
"""

# Deletes one batch of wake-ups sent longer ago than the retention.
OUTBOX_PRUNE_SENT: Final = """
DELETE FROM outbox
WHERE id IN (
    SELECT id
    FROM outbox
    WHERE sent_at IS NOT NULL
      AND sent_at < now() - make_interval(secs => %(retention_seconds)s)
    ORDER BY sent_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
"""

# Periodic maintenance (pruning, sweeping, re-waking) runs in one relay at a time: the
# others find this transaction-scoped advisory lock taken and skip the round.
MAINTENANCE_TRY_LOCK: Final = "SELECT pg_try_advisory_xact_lock(%(key)s)"

__all__ = [
    "CLAIMABLE_SQL",
    "JOB_FIND_BY_DEDUP_MANY",
    "JOB_INSERT_MANY",
    "LEASED_SQL",
    "MAINTENANCE_TRY_LOCK",
    "OUTBOX_CLAIM_DUE",
    "OUTBOX_PRUNE_SENT",
]
