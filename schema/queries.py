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

from schema.tables import CLAIMABLE_SQL, DEFAULT_MAX_ATTEMPTS, LEASED_SQL

# The attempt budget in force: the row's, else the default.
_BUDGET = f"COALESCE(j.max_attempts, {DEFAULT_MAX_ATTEMPTS})"

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

# A cancel request from outside: a job nobody holds is cancelled at once; a running
# one is asked to stop (its worker sees CANCEL_REQUESTED on its next heartbeat).
# Returns the new state, or nothing if the job is finished already or unknown.
JOB_REQUEST_CANCEL: Final = f"""
UPDATE jobs
SET state = CASE state WHEN 'RUNNING' THEN 'CANCEL_REQUESTED' ELSE 'CANCELLED' END,
    finished_at = CASE state WHEN 'RUNNING' THEN finished_at ELSE now() END,
    updated_at = now()
WHERE job_id = %(job_id)s AND state IN ({CLAIMABLE_SQL}, 'RUNNING')
RETURNING state
"""

JOB_STATE: Final = "SELECT state FROM jobs WHERE job_id = %(job_id)s"

# -------------------------------------------------------------------------- consumer

# Claims the jobs a batch of deliveries names: each one that is claimable and due
# becomes RUNNING under this worker's lease, with the next generation and attempt.
# Rows are locked in job_id order, so two consumers claiming overlapping batches
# (a duplicated wake-up) wait for each other instead of deadlocking; the loser then
# sees the job RUNNING and claims nothing. Worker statements lock FOR NO KEY UPDATE,
# the strength their UPDATE needs: it does not conflict with the key-share lock an
# insert into outbox or job_attempts takes on the job it references. A job enqueued
# without max_attempts takes its handler's budget here (never less than the attempt
# being started).
JOB_CLAIM_MANY: Final = f"""
WITH wanted AS (
    SELECT j.job_id
    FROM jobs AS j
    WHERE j.job_id = ANY(%(job_ids)s::uuid[])
      AND j.state IN ({CLAIMABLE_SQL})
      AND j.run_after <= now()
      AND (j.max_attempts IS NULL OR j.attempt_count < j.max_attempts)
    ORDER BY j.job_id
    FOR NO KEY UPDATE
), budgets AS (
    SELECT * FROM jsonb_to_recordset(%(budgets)s::jsonb) AS b(job_type text, max_attempts int)
)
UPDATE jobs AS j
SET state = 'RUNNING',
    lease_owner = %(worker)s,
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    lease_generation = j.lease_generation + 1,
    attempt_count = j.attempt_count + 1,
    max_attempts = COALESCE(
        j.max_attempts,
        (SELECT GREATEST(b.max_attempts, j.attempt_count + 1)
         FROM budgets AS b WHERE b.job_type = j.job_type)),
    started_at = now(),
    updated_at = now()
FROM wanted AS w
WHERE j.job_id = w.job_id
RETURNING j.job_id, j.job_type, j.queue, j.payload, j.attempt_count, j.max_attempts,
          j.lease_generation, j.lease_expires_at, j.created_at
"""

# After a claim whose commit was ambiguous (the connection dropped while it ran): the
# named jobs this worker holds. Worker ids are unique per process, so a job held
# under ours that the process does not know about came from that claim.
JOB_HELD_BY: Final = f"""
SELECT job_id, job_type, queue, payload, attempt_count, max_attempts, lease_generation,
       lease_expires_at, created_at
FROM jobs
WHERE job_id = ANY(%(job_ids)s::uuid[]) AND lease_owner = %(worker)s AND state IN ({LEASED_SQL})
"""

# Why a delivery claimed nothing: each named job's state, due or not. A job id with
# no row at all is missing from the result.
JOB_EXPLAIN_MISSES: Final = """
SELECT job_id, state, run_after > now() AS early
FROM jobs
WHERE job_id = ANY(%(job_ids)s::uuid[])
"""

# Extends the leases this worker holds, through the fence: owner, generation, and a
# lease not yet expired (once expired the sweeper may have moved the job on; a late
# heartbeat must not revive it). Returns each renewed job's state, so the worker sees
# CANCEL_REQUESTED; a held job missing from the result has lost its lease.
JOB_HEARTBEAT_MANY: Final = f"""
WITH held AS (
    SELECT j.job_id
    FROM jsonb_to_recordset(%(jobs)s::jsonb) AS h(job_id uuid, generation bigint)
    JOIN jobs AS j ON j.job_id = h.job_id AND j.lease_generation = h.generation
    WHERE j.lease_owner = %(worker)s
      AND j.state IN ({LEASED_SQL})
      AND j.lease_expires_at > now()
    ORDER BY j.job_id
    FOR NO KEY UPDATE OF j
)
UPDATE jobs AS j
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    updated_at = now()
FROM held
WHERE j.job_id = held.job_id
RETURNING j.job_id, j.state
"""

# Records the outcomes of a batch of attempts, each through its own fence, and for
# each applied one writes the attempt's history row and, for a retry, the wake-up
# due at run_after, all in one statement. kind is one of:
#   succeeded  -> SUCCEEDED
#   cancelled  -> CANCELLED (the handler acknowledged a cancel request)
#   failed     -> FAILED at once (Permanent)
#   retry      -> RETRY_WAIT after delay_seconds, or FAILED once the budget is spent,
#                 or CANCELLED if a cancel was requested meanwhile
# The new state is decided on the locked row, so a concurrent cancel request is seen.
# A stale outcome (generation or owner no longer matches) matches no row and changes
# nothing; it is simply absent from the result.
JOB_FINISH_MANY: Final = f"""
WITH outcome AS (
    SELECT *
    FROM jsonb_to_recordset(%(outcomes)s::jsonb) AS o(
        job_id uuid, generation bigint, kind text, error_code text, error_message text,
        delay_seconds double precision)
), decided AS (
    SELECT o.*,
           CASE
               WHEN o.kind = 'succeeded' THEN 'SUCCEEDED'
               WHEN o.kind = 'cancelled' THEN 'CANCELLED'
               WHEN o.kind = 'failed' THEN 'FAILED'
               WHEN j.state = 'CANCEL_REQUESTED' THEN 'CANCELLED'
               WHEN j.attempt_count >= {_BUDGET} THEN 'FAILED'
               ELSE 'RETRY_WAIT'
           END AS new_state
    FROM outcome AS o
    JOIN jobs AS j ON j.job_id = o.job_id AND j.lease_generation = o.generation
    WHERE j.lease_owner = %(worker)s AND j.state IN ({LEASED_SQL})
    ORDER BY j.job_id
    FOR NO KEY UPDATE OF j
), finished AS (
    UPDATE jobs AS j
    SET state = d.new_state,
        run_after = CASE WHEN d.new_state = 'RETRY_WAIT'
                         THEN now() + make_interval(secs => d.delay_seconds)
                         ELSE j.run_after END,
        lease_owner = NULL,
        lease_expires_at = NULL,
        last_error_code = COALESCE(d.error_code, j.last_error_code),
        last_error_message = CASE WHEN d.error_code IS NULL THEN j.last_error_message
                                  ELSE d.error_message END,
        finished_at = CASE WHEN d.new_state = 'RETRY_WAIT' THEN NULL ELSE now() END,
        updated_at = now()
    FROM decided AS d
    WHERE j.job_id = d.job_id
    RETURNING j.job_id, j.state, j.queue, j.run_after, j.attempt_count, j.lease_generation,
              j.started_at, d.error_code, d.error_message
), history AS (
    INSERT INTO job_attempts (job_id, attempt, lease_generation, worker, started_at,
                              finished_at, outcome, error_code, error_message)
    SELECT job_id, attempt_count, lease_generation, %(worker)s, started_at, now(), state,
           error_code, error_message
    FROM finished
), woken AS (
    INSERT INTO outbox (job_id, queue, available_at)
    SELECT job_id, queue, run_after FROM finished WHERE state = 'RETRY_WAIT'
)
SELECT job_id, state FROM finished
"""

# Whether this worker's outcomes were recorded after all: used when a commit failed
# ambiguously (the connection dropped during COMMIT) and the retried statement then
# matched nothing, to tell "already applied" from "stale". The sweeper also writes
# rows under the worker's name, for leases that expired; those do not count.
JOB_ATTEMPTS_RECORDED: Final = """
SELECT job_id
FROM jsonb_to_recordset(%(jobs)s::jsonb) AS h(job_id uuid, generation bigint)
JOIN job_attempts AS a USING (job_id)
WHERE a.lease_generation = h.generation
  AND a.worker = %(worker)s
  AND a.error_code IS DISTINCT FROM 'LEASE_EXPIRED'
"""

# A graceful stop gives back the claims whose handlers did not finish in time:
# RUNNING goes back to QUEUED with its attempt returned (a routine deploy must not
# burn attempts) and a fresh wake-up; CANCEL_REQUESTED becomes CANCELLED, since
# nobody wants it run again. Fenced like every worker write.
JOB_GIVE_BACK_MANY: Final = f"""
WITH held AS (
    SELECT j.job_id, j.state AS old_state
    FROM jsonb_to_recordset(%(jobs)s::jsonb) AS h(job_id uuid, generation bigint)
    JOIN jobs AS j ON j.job_id = h.job_id AND j.lease_generation = h.generation
    WHERE j.lease_owner = %(worker)s AND j.state IN ({LEASED_SQL})
    ORDER BY j.job_id
    FOR NO KEY UPDATE OF j
), returned AS (
    UPDATE jobs AS j
    SET state = CASE WHEN held.old_state = 'RUNNING' THEN 'QUEUED' ELSE 'CANCELLED' END,
        attempt_count = CASE WHEN held.old_state = 'RUNNING' THEN j.attempt_count - 1
                             ELSE j.attempt_count END,
        run_after = now(),
        lease_owner = NULL,
        lease_expires_at = NULL,
        finished_at = CASE WHEN held.old_state = 'RUNNING' THEN NULL ELSE now() END,
        updated_at = now()
    FROM held
    WHERE j.job_id = held.job_id
    RETURNING j.job_id, j.state, j.queue, j.attempt_count, j.lease_generation, j.started_at
), history AS (
    INSERT INTO job_attempts (job_id, attempt, lease_generation, worker, started_at,
                              finished_at, outcome, error_code, error_message)
    SELECT job_id, attempt_count, lease_generation, %(worker)s, started_at, now(), state,
           'SHUTDOWN', 'worker stopped while a cancel was requested'
    FROM returned WHERE state = 'CANCELLED'
), woken AS (
    INSERT INTO outbox (job_id, queue)
    SELECT job_id, queue FROM returned WHERE state = 'QUEUED'
)
SELECT job_id, state FROM returned
"""

# Marks one effect done, once per key, in the handler's own transaction: true the
# first time, false for every later attempt (whose transaction then skips the effect).
JOB_EFFECT_CLAIM: Final = """
INSERT INTO job_effects (effect_key, job_id)
VALUES (%(effect_key)s, %(job_id)s)
ON CONFLICT (effect_key) DO NOTHING
RETURNING true
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

# The sweeper: leases that expired without a report. A crashed or frozen worker
# looks exactly like this. RUNNING becomes RETRY_WAIT (or FAILED once the attempts
# are spent: attempts are counted at claim, so a job that kills its worker still
# stops), CANCEL_REQUESTED becomes CANCELLED; the lost attempt gets its history row
# and a retry gets its wake-up. SKIP LOCKED passes over a row whose worker is
# heartbeating it right now.
JOB_SWEEP_EXPIRED: Final = f"""
WITH expired AS (
    SELECT j.job_id, j.lease_owner AS old_owner,
           CASE
               WHEN j.state = 'CANCEL_REQUESTED' THEN 'CANCELLED'
               WHEN j.attempt_count >= {_BUDGET} THEN 'FAILED'
               ELSE 'RETRY_WAIT'
           END AS new_state
    FROM jobs AS j
    WHERE j.state IN ({LEASED_SQL}) AND j.lease_expires_at <= now()
    ORDER BY j.lease_expires_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), swept AS (
    UPDATE jobs AS j
    SET state = e.new_state,
        run_after = now(),
        lease_owner = NULL,
        lease_expires_at = NULL,
        last_error_code = 'LEASE_EXPIRED',
        last_error_message = 'the lease of ' || e.old_owner || ' expired without a report',
        finished_at = CASE WHEN e.new_state = 'RETRY_WAIT' THEN NULL ELSE now() END,
        updated_at = now()
    FROM expired AS e
    WHERE j.job_id = e.job_id
    RETURNING j.job_id, j.state, j.queue, j.attempt_count, j.lease_generation, j.started_at,
              e.old_owner, j.last_error_message
), history AS (
    INSERT INTO job_attempts (job_id, attempt, lease_generation, worker, started_at,
                              finished_at, outcome, error_code, error_message)
    SELECT job_id, attempt_count, lease_generation, old_owner, started_at, now(), state,
           'LEASE_EXPIRED', last_error_message
    FROM swept
), woken AS (
    INSERT INTO outbox (job_id, queue)
    SELECT job_id, queue FROM swept WHERE state = 'RETRY_WAIT'
)
SELECT job_id, state FROM swept
"""

# Due claimable jobs whose wake-up is not pending and was not sent lately, per queue:
# their wake-up may have been lost (a purged queue, a broker that dropped it).
_STRANDED = f"""
    j.state IN ({CLAIMABLE_SQL})
    AND j.run_after <= now() - make_interval(secs => %(grace_seconds)s)
    AND NOT EXISTS (
        SELECT 1 FROM outbox AS o
        WHERE o.job_id = j.job_id
          AND (o.sent_at IS NULL
               OR o.sent_at > now() - make_interval(secs => %(grace_seconds)s)))
"""

JOB_STRANDED_QUEUES: Final = f"""
SELECT j.queue, count(*)
FROM jobs AS j
WHERE {_STRANDED}
GROUP BY j.queue
"""

# The re-waker: a fresh wake-up for the stranded jobs of the given queues (those the
# broker holds no ready message for, so nothing is on its way to them).
JOB_REWAKE_STRANDED: Final = f"""
INSERT INTO outbox (job_id, queue)
SELECT j.job_id, j.queue
FROM jobs AS j
WHERE j.queue = ANY(%(queues)s::text[]) AND {_STRANDED}
ORDER BY j.run_after
LIMIT %(limit)s
RETURNING job_id
"""

# Each periodic chore (pruning, sweeping, re-waking) runs in one relay at a time: the
# others find its transaction-scoped advisory lock taken and skip the round.
MAINTENANCE_TRY_LOCK: Final = "SELECT pg_try_advisory_xact_lock(%(key)s)"

# ------------------------------------------------------------------------- schedules
# (issue 10.) Producer statements write a schedule through the caller's transaction;
# the relay fires due ones. An occurrence's identity is (schedule_name,
# scheduled_for): its ledger row is inserted ON CONFLICT DO NOTHING, and only the
# relay whose insert came back enqueues the job, in the same transaction.

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
     max_attempts, catchup, next_fire_at)
VALUES
    (%(name)s, %(job_type)s, %(payload)s::jsonb, %(cron)s, %(every_seconds)s, %(timezone)s,
     %(queue)s, %(tenant)s, %(priority)s, %(max_attempts)s, %(catchup)s, %(next_fire_at)s)
ON CONFLICT (name) DO UPDATE
SET job_type = EXCLUDED.job_type,
    payload = EXCLUDED.payload,
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
# now() is this transaction's clock, the one delays are measured with.
SCHEDULE_CLAIM_DUE: Final = """
SELECT name, job_type, payload, cron, every_seconds, timezone, queue, priority,
       max_attempts, catchup, next_fire_at, now() AS db_now
FROM schedules
WHERE NOT paused AND next_fire_at <= now()
ORDER BY next_fire_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
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
    last_fire_at = COALESCE(%(last_fire_at)s::timestamptz, last_fire_at)
WHERE name = %(name)s
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

__all__ = [
    "JOB_ATTEMPTS_RECORDED",
    "JOB_CLAIM_MANY",
    "JOB_EFFECT_CLAIM",
    "JOB_EXPLAIN_MISSES",
    "JOB_FIND_BY_DEDUP_MANY",
    "JOB_FINISH_MANY",
    "JOB_GIVE_BACK_MANY",
    "JOB_HEARTBEAT_MANY",
    "JOB_HELD_BY",
    "JOB_INSERT_MANY",
    "JOB_REQUEST_CANCEL",
    "JOB_REWAKE_STRANDED",
    "JOB_STATE",
    "JOB_STRANDED_QUEUES",
    "JOB_SWEEP_EXPIRED",
    "MAINTENANCE_TRY_LOCK",
    "OUTBOX_CLAIM_DUE",
    "OUTBOX_PRUNE_SENT",
    "SCHEDULE_ADVANCE",
    "SCHEDULE_CLAIM_DUE",
    "SCHEDULE_CLOCK",
    "SCHEDULE_DELETE",
    "SCHEDULE_FIRE_PRUNE",
    "SCHEDULE_FIRE_RECORD_MANY",
    "SCHEDULE_FIRE_SET_JOB",
    "SCHEDULE_PAUSE",
    "SCHEDULE_RESUME",
    "SCHEDULE_RULE_FOR_UPDATE",
    "SCHEDULE_UPSERT",
]
