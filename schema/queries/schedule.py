"""Recurring schedules: written through the caller's transaction, fired by the relay.
An occurrence's identity is (schedule_name, scheduled_for): its ledger row is inserted
ON CONFLICT DO NOTHING, and only the relay whose insert came back enqueues the job, in
the same transaction."""

from __future__ import annotations

from typing import Final

# The database clock at this statement (now() would be the caller's transaction
# start, which may be long past): the instant a new or changed rule counts from.
SCHEDULE_CLOCK: Final = "SELECT statement_timestamp()"

# Creates or updates a schedule by name. An update that keeps the rule (cron,
# every_seconds, timezone) keeps next_fire_at, so editing a payload neither skips nor
# repeats an occurrence; a new rule starts from the next_fire_at given (computed from
# SCHEDULE_CLOCK). A pause stays as it was.
SCHEDULE_UPSERT: Final = """
INSERT INTO schedules AS s
    (name, job_type, payload, cron, every_seconds, timezone, queue, tenant, priority,
     max_attempts, catchup, next_fire_at, tags, meta)
VALUES
    (%(name)s, %(job_type)s, %(payload)s::jsonb, %(cron)s, %(every_seconds)s, %(timezone)s,
     %(queue)s, %(tenant)s, %(priority)s, %(max_attempts)s, %(catchup)s, %(next_fire_at)s,
     %(tags)s::text[], %(meta)s::jsonb)
ON CONFLICT (name) DO UPDATE
SET job_type = EXCLUDED.job_type,
    payload = EXCLUDED.payload,
    tags = EXCLUDED.tags,
    meta = EXCLUDED.meta,
    cron = EXCLUDED.cron,
    every_seconds = EXCLUDED.every_seconds,
    timezone = EXCLUDED.timezone,
    queue = EXCLUDED.queue,
    tenant = EXCLUDED.tenant,
    priority = EXCLUDED.priority,
    max_attempts = EXCLUDED.max_attempts,
    catchup = EXCLUDED.catchup,
    next_fire_at = CASE
        WHEN (s.cron, s.every_seconds, s.timezone)
             IS NOT DISTINCT FROM (EXCLUDED.cron, EXCLUDED.every_seconds, EXCLUDED.timezone)
        THEN s.next_fire_at
        ELSE EXCLUDED.next_fire_at
    END,
    updated_at = now()
RETURNING next_fire_at
"""

# The ledger goes with it (ON DELETE CASCADE); jobs already enqueued stay.
SCHEDULE_DELETE: Final = "DELETE FROM schedules WHERE name = %(name)s RETURNING true"

SCHEDULE_PAUSE: Final = """
UPDATE schedules SET paused = true, updated_at = now()
WHERE name = %(name)s
RETURNING true
"""

# A schedule's rule, locked for a resume, with the database clock.
SCHEDULE_RULE_FOR_UPDATE: Final = """
SELECT cron, every_seconds, timezone, paused, statement_timestamp()
FROM schedules
WHERE name = %(name)s
FOR UPDATE
"""

# Resuming does not backfill: a paused schedule starts again from the first
# occurrence after now. One that was not paused keeps its place.
SCHEDULE_RESUME: Final = """
UPDATE schedules
SET next_fire_at = CASE WHEN paused THEN %(next_fire_at)s::timestamptz ELSE next_fire_at END,
    paused = false,
    updated_at = CASE WHEN paused THEN now() ELSE updated_at END
WHERE name = %(name)s
RETURNING next_fire_at
"""

# Due schedules for one relay: SKIP LOCKED lets several relays split them, and the
# lock holds each one still until its occurrences are recorded and it is advanced.
# One whose firing failed waits out its backoff (retry_at), and is not claimed again
# by the relay's round that saw it fail (failed).
# now() is this transaction's clock, the one delays are measured with.
SCHEDULE_CLAIM_DUE: Final = """
SELECT name, job_type, payload, cron, every_seconds, timezone, queue, tenant, priority,
       max_attempts, catchup, next_fire_at, now() AS db_now, tags, meta
FROM schedules
WHERE NOT paused AND next_fire_at <= now() AND (retry_at IS NULL OR retry_at <= now())
  AND name <> ALL(%(failed)s::text[])
ORDER BY next_fire_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

# How long until the next occurrence of any active schedule is due (negative: one is
# due now; NULL: none), a failing one's once its backoff is over: schedules_due_idx's
# first entry that is not backing off, and the backing-off ones (few, and only
# while something fails). The scheduler sleeps that long rather than a fixed
# interval, so an occurrence fires on time.
SCHEDULE_NEXT_DUE: Final = """
SELECT EXTRACT(EPOCH FROM LEAST(
    (SELECT min(next_fire_at) FROM schedules WHERE NOT paused AND retry_at IS NULL),
    (SELECT min(GREATEST(next_fire_at, retry_at)) FROM schedules
     WHERE NOT paused AND retry_at IS NOT NULL)) - now())::float8
"""

# Records a schedule's occurrences, each once: the rows that come back are the ones
# this transaction recorded, and only theirs may enqueue (job_id was drawn in
# advance; the caller inserts those jobs next, in the same transaction).
SCHEDULE_FIRE_RECORD_MANY: Final = """
INSERT INTO schedule_fires AS f
    (schedule_name, scheduled_for, delay_seconds, outcome, skip_reason, job_id)
SELECT %(name)s, i.scheduled_for, EXTRACT(EPOCH FROM now() - i.scheduled_for),
       i.outcome, i.skip_reason, i.job_id
FROM jsonb_to_recordset(%(fires)s::jsonb) AS i(
    scheduled_for timestamptz, outcome text, skip_reason text, job_id uuid)
ORDER BY i.scheduled_for
ON CONFLICT (schedule_name, scheduled_for) DO NOTHING
RETURNING f.scheduled_for, f.job_id
"""

# When an occurrence's job already existed (its dedup key was taken), the record
# points at that job instead of the one that was not inserted.
SCHEDULE_FIRE_SET_JOB: Final = """
UPDATE schedule_fires SET job_id = %(job_id)s
WHERE schedule_name = %(name)s AND scheduled_for = %(scheduled_for)s
"""

# Moves a schedule past the occurrences just decided. last_fire_at is the nominal
# instant of the latest one decided, fired or skipped (the ledger says which).
SCHEDULE_ADVANCE: Final = """
UPDATE schedules
SET next_fire_at = %(next_fire_at)s,
    last_fire_at = COALESCE(%(last_fire_at)s::timestamptz, last_fire_at),
    failures = 0,
    retry_at = NULL
WHERE name = %(name)s
"""

# A schedule whose firing failed (rolled back to its savepoint): why, and when to try
# again, the backoff doubling with each failure in a row. last_error stays after a
# later success, as the record of the last failure.
SCHEDULE_FAILED: Final = """
UPDATE schedules
SET failures = failures + 1,
    last_error = %(error)s,
    last_error_at = clock_timestamp(),
    -- from now, not from the start of the relay's transaction, however long it ran
    retry_at = clock_timestamp() + make_interval(
        secs => LEAST(%(cap)s, %(base)s * power(2, LEAST(failures, 30))))
WHERE name = %(name)s
RETURNING failures, retry_at
"""

# Keeps the newest `keep` ledger rows of the named schedules, deleting at most
# `limit` older ones of each per call (the walk reads keep + limit index entries).
SCHEDULE_FIRE_PRUNE: Final = """
DELETE FROM schedule_fires AS f
USING unnest(%(names)s::text[]) AS s(name)
CROSS JOIN LATERAL (
    SELECT scheduled_for
    FROM schedule_fires
    WHERE schedule_name = s.name
    ORDER BY scheduled_for DESC
    OFFSET %(keep)s
    LIMIT %(limit)s
) AS old
WHERE f.schedule_name = s.name AND f.scheduled_for = old.scheduled_for
"""

# A schedule's job template, for a manual trigger: what each occurrence enqueues.
SCHEDULE_TEMPLATE: Final = """
SELECT job_type, payload, queue, tenant, priority, max_attempts, tags, meta
FROM schedules
WHERE name = %(name)s
"""
