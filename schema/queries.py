"""Every statement that changes a job, the outbox or the control tables, named, in
one place.

Each transition is a single guarded statement: its WHERE clause carries the state it
may leave and, when a worker writes, the fence (``lease_owner`` and
``lease_generation``, see :data:`FENCE`). Statements that apply to a batch take the
fence per row, so a batch is many fenced updates in one commit. Times are always the
database's clock, never a worker's. Parameters use psycopg's ``%(name)s`` style and
are always bound, never formatted in.

A worker's statements lock their rows ``FOR NO KEY UPDATE SKIP LOCKED``: a row some
other transaction holds (a producer's open cancel request, say) delays that row only;
the statement reports it as ``LOCKED`` and the worker tries it again on its own.

Names are noun first, the way River names its queries: ``job_claim_many``,
``outbox_wake_queue``. The relay, the consumer and the producer API call them by
name and never write SQL of their own.
"""

from __future__ import annotations

from typing import Final

from schema.tables import (
    CLAIMABLE_SQL,
    CLOCK_ROW,
    DEFAULT_MAX_ATTEMPTS,
    LEASED_SQL,
    OUTBOX_CHANNEL,
    TERMINAL_SQL,
)

# The attempt budget in force: the row's, else the default.
_BUDGET = f"COALESCE(j.max_attempts, {DEFAULT_MAX_ATTEMPTS})"

# The fence every worker write carries: the row is still this worker's lease, of
# the generation the worker was given at claim (``h`` names the worker's handle).
FENCE: Final = (
    "j.job_id = h.job_id AND j.lease_generation = h.generation"
    f" AND j.lease_owner = %(worker)s AND j.state IN ({LEASED_SQL})"
)

# A wake-up ``o`` that was sent and not yet taken up: its job ``j`` still waits to
# run, was due when it was sent, and has been neither claimed nor turned down since.
# (A consumer can turn a job down before the relay's mark-sent commits, when the
# claim cannot yet see the wake-up as sent to put it back: its time, delay_since,
# still says the wake-up was used.)
UNTAKEN: Final = (
    f"j.state IN ({CLAIMABLE_SQL}) AND j.run_after <= o.sent_at"
    " AND (j.started_at IS NULL OR j.started_at < o.sent_at)"
    " AND (j.delay_since IS NULL OR j.delay_since < o.sent_at)"
)

# A live consumer: heartbeating within the given number of seconds, not stopping.
_LIVE_WORKER = "NOT w.stopping AND w.last_seen_at > now() - make_interval(secs => %(worker_ttl)s)"


def _lease_ended(source: str) -> str:
    """The tail of every statement that ends a lease (outcome, give-back, sweep):
    the attempt's history row, a wake-up for a job that will run again, and the
    release of the tenant slot the lease held, all in the statement that ended it,
    so none can happen twice or be forgotten.

    ``source`` names a CTE of the rows that left the lease, with the columns
    job_id, state (the new one), queue, tenant, priority, run_after, attempt,
    lease_generation, worker, ready_at, started_at, held_slot, error_code,
    error_message and traceback.
    """
    return f"""history AS (
    INSERT INTO job_attempts (job_id, attempt, lease_generation, worker, ready_at, started_at,
                              finished_at, outcome, error_code, error_message, traceback)
    SELECT job_id, attempt, lease_generation, worker, ready_at, started_at,
           statement_timestamp(), state, error_code, error_message, traceback
    FROM {source}
), woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT job_id, queue, COALESCE(tenant, ''), priority, run_after
    FROM {source} WHERE state IN ({CLAIMABLE_SQL})
), releasing AS MATERIALIZED (
    -- Locked in tenant order, as the claim locks them: two statements that touch
    -- several tenants never wait for each other in a circle.
    SELECT u.tenant, r.slots
    FROM tenant_usage AS u
    JOIN (SELECT tenant, count(*) AS slots FROM {source} WHERE held_slot GROUP BY tenant) AS r
      ON r.tenant = u.tenant
    ORDER BY u.tenant
    FOR NO KEY UPDATE OF u
), released AS (
    -- never below zero: drift is the reconciler's to repair, never a reason to
    -- refuse an outcome
    UPDATE tenant_usage AS u SET running = GREATEST(u.running - r.slots, 0)
    FROM releasing AS r
    WHERE u.tenant = r.tenant
)"""


# The tenants with unsent wake-ups in queue %(queue)s, as a recursive CTE named
# ``tenants`` (its last row is NULL, for the caller to skip): a skip scan of outbox_pending_idx,
# one index probe per tenant however many wake-ups each has waiting. Needs WITH
# RECURSIVE.
_PENDING_TENANTS: Final = """tenants AS (
    (SELECT o.tenant FROM outbox AS o
     WHERE o.queue = %(queue)s AND o.sent_at IS NULL ORDER BY o.tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT o.tenant FROM outbox AS o
            WHERE o.queue = %(queue)s AND o.sent_at IS NULL AND o.tenant > t.tenant
            ORDER BY o.tenant LIMIT 1)
    FROM tenants AS t WHERE t.tenant IS NOT NULL
)"""


# --------------------------------------------------------------------------- producer

# Inserts a batch of jobs and their wake-ups in one statement. A job whose
# (job_type, dedup_key) exists already inserts nothing, and gets no wake-up; the
# caller then looks its id up with JOB_FIND_BY_DEDUP_MANY. The outbox trigger
# notifies the relay when the caller's transaction commits.
JOB_INSERT_MANY: Final = """
WITH input AS (
    SELECT *
    FROM jsonb_to_recordset(%(jobs)s::jsonb) AS i(
        job_id uuid, job_type text, queue text, tenant text, payload jsonb, dedup_key text,
        max_attempts integer, priority smallint, run_after timestamptz,
        delay_seconds double precision)
), inserted AS (
    INSERT INTO jobs AS j
        (job_id, job_type, queue, tenant, payload, dedup_key, max_attempts, priority, run_after)
    -- jsonb_to_recordset reads a JSON null payload as SQL NULL; it is JSON null
    SELECT job_id, job_type, queue, tenant, COALESCE(payload, 'null'::jsonb), dedup_key,
           max_attempts, priority,
           COALESCE(run_after, now() + make_interval(secs => COALESCE(delay_seconds, 0)))
    FROM input
    ON CONFLICT (job_type, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING j.job_id, j.queue, j.tenant, j.priority, j.run_after
), woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT job_id, queue, COALESCE(tenant, ''), priority, run_after FROM inserted
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

# Backpressure at enqueue: for each tenant of a batch that has a max_queued, how many
# of its jobs wait. No hot row and no count of the whole table: the relay counts
# each such tenant's waiting jobs about once a second (TENANT_USAGE_REFRESH), and
# this adds only the ones enqueued since, read from the tenant's own index entries.
TENANT_BACKPRESSURE: Final = f"""
SELECT l.tenant, l.max_queued,
       u.queued + (SELECT count(*) FROM jobs AS j
                   WHERE j.tenant = l.tenant AND j.state IN ({CLAIMABLE_SQL})
                     AND j.created_at > COALESCE(u.queued_at, '-infinity')) AS waiting,
       u.drain_per_s
FROM tenant_limits AS l JOIN tenant_usage AS u USING (tenant)
WHERE l.tenant = ANY(%(tenants)s::text[]) AND l.max_queued IS NOT NULL
"""

# A cancel request from outside: a job nobody holds is cancelled at once (and its
# pending wake-ups go); a running one is asked to stop (its worker sees
# CANCEL_REQUESTED on its next heartbeat, and keeps its slot until it stops).
# Returns the new state, or nothing if the job is finished already or unknown.
JOB_REQUEST_CANCEL: Final = f"""
WITH cancelled AS (
    UPDATE jobs
    SET state = CASE state WHEN 'RUNNING' THEN 'CANCEL_REQUESTED' ELSE 'CANCELLED' END,
        finished_at = CASE state WHEN 'RUNNING' THEN finished_at ELSE statement_timestamp() END,
        cancel_requested_at = now(),
        delay_reason = NULL,
        delay_since = NULL,
        updated_at = now()
    WHERE job_id = %(job_id)s AND state IN ({CLAIMABLE_SQL}, 'RUNNING')
    RETURNING job_id, state
), unwoken AS (
    DELETE FROM outbox AS o USING cancelled AS c
    WHERE o.job_id = c.job_id AND c.state = 'CANCELLED' AND o.sent_at IS NULL
)
SELECT state FROM cancelled
"""

JOB_STATE: Final = "SELECT state FROM jobs WHERE job_id = %(job_id)s"

# ---------------------------------------------------------------------- tenants

# Creates or changes a tenant's limits (and its usage row), in the caller's
# transaction. Only tenant_limits is written here; the counters a claim moves live
# in tenant_usage, so an operator holding this transaction open blocks no claim.
TENANT_LIMIT_SET: Final = """
WITH limits AS (
    INSERT INTO tenant_limits AS l (tenant, max_running, weight, max_queued)
    VALUES (%(tenant)s, %(max_running)s, %(weight)s, %(max_queued)s)
    ON CONFLICT (tenant) DO UPDATE
    SET max_running = EXCLUDED.max_running, weight = EXCLUDED.weight,
        max_queued = EXCLUDED.max_queued, updated_at = now()
    RETURNING l.tenant
), usage AS (
    INSERT INTO tenant_usage (tenant) SELECT tenant FROM limits
    ON CONFLICT (tenant) DO NOTHING
)
SELECT tenant FROM limits
"""

TENANT_LIMITS: Final = """
SELECT l.tenant, l.max_running, l.weight, l.max_queued,
       COALESCE(u.running, 0), COALESCE(u.queued, 0), u.queued_at, u.drain_per_s
FROM tenant_limits AS l LEFT JOIN tenant_usage AS u USING (tenant)
ORDER BY l.tenant
"""

# -------------------------------------------------------------------------- consumer

# Claims the jobs a batch of wake-ups names, and says for every other one why not.
#
# A named job is taken when it is claimable and due, its type is one this worker has
# a handler for, its queue is not paused, a plain-function handler has a free thread
# (free_threads), and its tenant has a free slot; the slot is reserved in this same
# statement (tenant_usage, locked in tenant order). The claim raises the generation
# and the attempt, sets the lease, and fixes the handler's budget for a job enqueued
# without one and the backoff the sweeper will use if the lease expires.
#
# A job turned down for its queue, its type or its tenant's cap records why
# (delay_reason, written when the reason changes) and its used-up wake-up goes back
# to the backlog, where the relay wakes it again once it can run. A job of a type
# no live consumer knows waits without a wake-up, until one announces it
# (JOB_WAKE_PARKED); nothing about it spends an attempt.
#
# Rows another transaction holds are skipped (status 'locked'): the worker tries
# them again alone. One row per requested id comes back: 'claimed' with the job, or
# the reason it was not.
JOB_CLAIM_MANY: Final = f"""
WITH types AS (
    SELECT *
    FROM jsonb_to_recordset(%(types)s::jsonb) AS t(
        job_type text, max_attempts int, backoff_base double precision,
        backoff_cap double precision, backoff_jitter double precision, sync boolean)
), locked AS (
    SELECT j.job_id, j.queue, j.tenant, j.job_type, j.priority,
           t.job_type IS NOT NULL AS known,
           COALESCE(t.sync, false) AS sync,
           EXISTS (SELECT 1 FROM queues AS q WHERE q.queue = j.queue AND q.paused) AS paused
    FROM jobs AS j LEFT JOIN types AS t ON t.job_type = j.job_type
    WHERE j.job_id = ANY(%(job_ids)s::uuid[])
      AND j.state IN ({CLAIMABLE_SQL})
      AND j.run_after <= now()
      AND (j.max_attempts IS NULL OR j.attempt_count < j.max_attempts)
    ORDER BY j.job_id
    FOR NO KEY UPDATE OF j SKIP LOCKED
), runnable AS (
    SELECT r.*
    FROM (SELECT l.*, row_number() OVER (PARTITION BY l.sync ORDER BY l.priority DESC, l.job_id)
                 AS thread_rank
          FROM locked AS l WHERE l.known AND NOT l.paused) AS r
    WHERE NOT r.sync OR r.thread_rank <= %(free_threads)s
), usage AS MATERIALIZED (
    -- Locked in tenant order (every statement that moves these counters does so).
    SELECT u.tenant, l.max_running - u.running AS free
    FROM tenant_usage AS u JOIN tenant_limits AS l USING (tenant)
    WHERE u.tenant IN (SELECT tenant FROM runnable)
    ORDER BY u.tenant
    FOR NO KEY UPDATE OF u
), admitted AS (
    SELECT a.job_id, a.tenant, u.free IS NOT NULL AS holds
    FROM (SELECT r.*, row_number() OVER (PARTITION BY r.tenant ORDER BY r.priority DESC, r.job_id)
                 AS slot_rank
          FROM runnable AS r) AS a
    LEFT JOIN usage AS u ON u.tenant = a.tenant
    WHERE u.free IS NULL OR a.slot_rank <= u.free
), reserved AS (
    UPDATE tenant_usage AS u
    SET running = u.running + a.slots, claimed = u.claimed + a.taken
    FROM (SELECT a.tenant, count(*) FILTER (WHERE a.holds) AS slots, count(*) AS taken
          FROM admitted AS a JOIN usage AS s USING (tenant) GROUP BY a.tenant) AS a
    WHERE u.tenant = a.tenant
), refused AS (
    SELECT l.job_id, l.queue, l.tenant, l.priority, l.job_type,
           CASE WHEN l.paused THEN 'QUEUE_PAUSED'
                WHEN NOT l.known THEN 'NO_HANDLER'
                ELSE 'TENANT_CAP' END AS reason
    FROM locked AS l
    WHERE l.job_id NOT IN (SELECT job_id FROM admitted)
      AND (l.paused OR NOT l.known OR l.job_id IN (SELECT job_id FROM runnable))
), noted AS (
    -- delay_since is when a consumer last turned it down: it marks the wake-up used
    -- (see UNTAKEN), so it moves on every refusal, which is rare (the relay wakes a
    -- job only when it can run).
    UPDATE jobs AS j SET delay_reason = r.reason, delay_since = now(), updated_at = now()
    FROM refused AS r
    WHERE j.job_id = r.job_id
), used_up AS (
    DELETE FROM outbox AS o USING refused AS r
    WHERE o.job_id = r.job_id AND o.sent_at IS NOT NULL
), requeued AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT r.job_id, r.queue, COALESCE(r.tenant, ''), r.priority, now()
    FROM refused AS r
    WHERE r.reason <> 'NO_HANDLER'
       OR EXISTS (SELECT 1 FROM workers AS w
                  WHERE w.worker_id <> %(worker)s AND {_LIVE_WORKER}
                    AND r.queue = ANY(w.queues) AND r.job_type = ANY(w.job_types))
), claimed AS (
    UPDATE jobs AS j
    SET state = 'RUNNING',
        lease_owner = %(worker)s,
        lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
        lease_generation = j.lease_generation + 1,
        attempt_count = j.attempt_count + 1,
        max_attempts = COALESCE(j.max_attempts, GREATEST(t.max_attempts, j.attempt_count + 1)),
        expiry_backoff = LEAST(t.backoff_cap, t.backoff_base * power(2, LEAST(j.attempt_count, 60)))
                         * (1 + t.backoff_jitter * (2 * random() - 1)),
        holds_slot = a.holds,
        delay_reason = NULL,
        delay_since = NULL,
        started_at = now(),
        updated_at = now()
    FROM admitted AS a, types AS t
    WHERE j.job_id = a.job_id AND t.job_type = j.job_type
    RETURNING j.job_id, j.job_type, j.queue, j.tenant, j.payload, j.attempt_count,
              j.max_attempts, j.lease_generation, j.created_at
)
SELECT 'claimed' AS status, c.* FROM claimed AS c
UNION ALL
SELECT CASE
           WHEN j.job_id IS NULL THEN 'missing'
           WHEN r.reason IS NOT NULL THEN r.reason
           WHEN l.job_id IS NOT NULL THEN 'no_thread'
           WHEN j.state IN ({LEASED_SQL}) THEN 'running'
           WHEN j.state IN ({TERMINAL_SQL}) THEN 'finished'
           WHEN j.run_after > now() THEN 'early'
           WHEN j.max_attempts IS NOT NULL AND j.attempt_count >= j.max_attempts THEN 'exhausted'
           ELSE 'locked'
       END,
       ids.job_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM unnest(%(job_ids)s::uuid[]) AS ids(job_id)
LEFT JOIN jobs AS j ON j.job_id = ids.job_id
LEFT JOIN refused AS r ON r.job_id = ids.job_id
LEFT JOIN locked AS l ON l.job_id = ids.job_id
WHERE ids.job_id NOT IN (SELECT job_id FROM claimed)
"""

# After a claim whose commit was ambiguous (the connection dropped while it ran): the
# named jobs this worker holds. Worker ids are unique per process, so a job held
# under ours that the process does not know about came from that claim.
JOB_HELD_BY: Final = f"""
SELECT 'claimed', job_id, job_type, queue, tenant, payload, attempt_count, max_attempts,
       lease_generation, created_at
FROM jobs
WHERE job_id = ANY(%(job_ids)s::uuid[]) AND lease_owner = %(worker)s AND state IN ({LEASED_SQL})
"""

# Extends the leases this worker holds, through the fence and only while they have
# not expired (once expired the sweeper may have moved the job on; a late heartbeat
# must not revive it). One row per handle: the renewed job's state (so the worker
# sees CANCEL_REQUESTED), 'LOCKED' for a lease still ours whose row another
# transaction holds (try again alone), or NULL for a lease that is gone.
JOB_HEARTBEAT_MANY: Final = f"""
WITH h AS (
    SELECT * FROM jsonb_to_recordset(%(jobs)s::jsonb) AS h(job_id uuid, generation bigint)
), held AS (
    SELECT j.job_id
    FROM h JOIN jobs AS j ON {FENCE}
    WHERE j.lease_expires_at > now()
    ORDER BY j.job_id
    FOR NO KEY UPDATE OF j SKIP LOCKED
), renewed AS (
    UPDATE jobs AS j
    SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s), updated_at = now()
    FROM held
    WHERE j.job_id = held.job_id
    RETURNING j.job_id, j.state
)
SELECT h.job_id,
       COALESCE(r.state, CASE WHEN j.lease_expires_at > now() THEN 'LOCKED' END)
FROM h
LEFT JOIN renewed AS r ON r.job_id = h.job_id
LEFT JOIN jobs AS j ON {FENCE}
"""


# Records the outcomes of a batch of attempts, each through its own fence, and for
# each one that applied writes what every end of a lease writes (_lease_ended), all
# in one statement. kind is one of:
#   succeeded  -> SUCCEEDED, with the handler's result
#   cancelled  -> CANCELLED (the handler acknowledged a cancel request)
#   failed     -> FAILED at once (Permanent)
#   retry      -> RETRY_WAIT after delay_seconds, or FAILED once the budget is spent,
#                 or CANCELLED if a cancel was requested meanwhile
# The new state is decided on the locked row, so a concurrent cancel request is seen.
# Returns the applied ones' new states, and 'LOCKED' for outcomes whose row another
# transaction holds (still ours: try again alone). A stale outcome (generation or
# owner no longer match) matches no row, changes nothing and is absent.
def _finish(lock: str) -> str:
    return f"""
WITH h AS (
    SELECT *
    FROM jsonb_to_recordset(%(outcomes)s::jsonb) AS h(
        job_id uuid, generation bigint, kind text, error_code text, error_message text,
        traceback text, delay_seconds double precision, result jsonb, progress jsonb)
), decided AS (
    SELECT h.job_id, h.kind, h.error_code, h.error_message, h.traceback, h.delay_seconds,
           h.result, h.progress, j.queue, j.tenant, j.priority, j.attempt_count AS attempt,
           j.lease_generation, j.lease_owner AS worker, j.run_after AS ready_at, j.started_at,
           j.holds_slot AS held_slot,
           CASE
               WHEN h.kind = 'succeeded' THEN 'SUCCEEDED'
               WHEN h.kind = 'cancelled' THEN 'CANCELLED'
               WHEN h.kind = 'failed' THEN 'FAILED'
               WHEN j.state = 'CANCEL_REQUESTED' THEN 'CANCELLED'
               WHEN j.attempt_count >= {_BUDGET} THEN 'FAILED'
               ELSE 'RETRY_WAIT'
           END AS state
    FROM h JOIN jobs AS j ON {FENCE}
    ORDER BY j.job_id
    FOR NO KEY UPDATE OF j {lock}
), finished AS (
    UPDATE jobs AS j
    SET state = d.state,
        run_after = CASE WHEN d.state = 'RETRY_WAIT'
                         THEN now() + make_interval(secs => d.delay_seconds)
                         ELSE j.run_after END,
        lease_owner = NULL,
        lease_expires_at = NULL,
        holds_slot = false,
        last_error_code = COALESCE(d.error_code, j.last_error_code),
        last_error_message = CASE WHEN d.error_code IS NULL THEN j.last_error_message
                                  ELSE d.error_message END,
        result = CASE WHEN d.state = 'SUCCEEDED' THEN d.result ELSE j.result END,
        progress = COALESCE(d.progress, j.progress),
        progress_at = CASE WHEN d.progress IS NULL THEN j.progress_at
                           ELSE statement_timestamp() END,
        finished_at = CASE WHEN d.state = 'RETRY_WAIT' THEN NULL ELSE statement_timestamp() END,
        updated_at = now()
    FROM decided AS d
    WHERE j.job_id = d.job_id
    RETURNING d.job_id, d.state, d.queue, d.tenant, d.priority, j.run_after, d.attempt,
              d.lease_generation, d.worker, d.ready_at, d.started_at, d.held_slot,
              d.error_code, d.error_message, d.traceback
), {_lease_ended("finished")}
SELECT job_id, state FROM finished
UNION ALL
SELECT h.job_id, 'LOCKED'
FROM h JOIN jobs AS j ON {FENCE}
WHERE h.job_id NOT IN (SELECT job_id FROM finished)
"""


JOB_FINISH_MANY: Final = _finish("SKIP LOCKED")

# The same, from inside the job's own transaction (job.transaction()), which waits
# for a row lock rather than skip it: it cannot be retried alone later.
JOB_FINISH_IN_TX: Final = _finish("")

# Whether this worker's outcomes were recorded after all: used when a commit failed
# ambiguously (the connection dropped during COMMIT) and the retried statement then
# matched nothing, to tell "already applied" from "stale". The sweeper also writes
# rows under the worker's name, for leases that expired; those do not count.
JOB_ATTEMPTS_RECORDED: Final = """
SELECT a.job_id
FROM jsonb_to_recordset(%(jobs)s::jsonb) AS h(job_id uuid, generation bigint)
JOIN job_attempts AS a ON a.job_id = h.job_id AND a.lease_generation = h.generation
WHERE a.worker = %(worker)s AND a.error_code IS DISTINCT FROM 'LEASE_EXPIRED'
"""

# A graceful stop gives back the claims whose handlers did not finish in time:
# RUNNING goes back to QUEUED with its attempt refunded (a routine deploy must not
# burn attempts) and a fresh wake-up; CANCEL_REQUESTED becomes CANCELLED, since
# nobody wants it run again. Either way the attempt gets its history row (outcome
# QUEUED for a refunded one) and the slot is released. Fenced like every worker write.
JOB_GIVE_BACK_MANY: Final = f"""
WITH h AS (
    SELECT * FROM jsonb_to_recordset(%(jobs)s::jsonb) AS h(job_id uuid, generation bigint)
), giving AS (
    SELECT h.job_id, j.queue, j.tenant, j.priority, j.attempt_count AS attempt,
           j.lease_generation, j.lease_owner AS worker, j.run_after AS ready_at, j.started_at,
           j.holds_slot AS held_slot,
           CASE WHEN j.state = 'RUNNING' THEN 'QUEUED' ELSE 'CANCELLED' END AS state
    FROM h JOIN jobs AS j ON {FENCE}
    ORDER BY j.job_id
    FOR NO KEY UPDATE OF j SKIP LOCKED
), returned AS (
    UPDATE jobs AS j
    SET state = g.state,
        attempt_count = CASE WHEN g.state = 'QUEUED' THEN j.attempt_count - 1
                             ELSE j.attempt_count END,
        run_after = now(),
        lease_owner = NULL,
        lease_expires_at = NULL,
        holds_slot = false,
        finished_at = CASE WHEN g.state = 'QUEUED' THEN NULL ELSE statement_timestamp() END,
        updated_at = now()
    FROM giving AS g
    WHERE j.job_id = g.job_id
    RETURNING g.job_id, g.state, g.queue, g.tenant, g.priority, j.run_after, g.attempt,
              g.lease_generation, g.worker, g.ready_at, g.started_at, g.held_slot,
              'SHUTDOWN'::text AS error_code,
              CASE WHEN g.state = 'QUEUED'
                   THEN 'given back at a graceful stop; the attempt was refunded'
                   ELSE 'the worker stopped while a cancel was requested' END AS error_message,
              NULL::text AS traceback
), {_lease_ended("returned")}
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

# A handler's progress, through the fence. A row another transaction holds is
# skipped: progress is advisory and the next report will land.
JOB_PROGRESS: Final = f"""
WITH h AS (SELECT %(job_id)s::uuid AS job_id, %(generation)s::bigint AS generation),
held AS (
    SELECT j.job_id FROM h JOIN jobs AS j ON {FENCE}
    FOR NO KEY UPDATE OF j SKIP LOCKED
)
UPDATE jobs AS j SET progress = %(progress)s::jsonb, progress_at = now()
FROM held WHERE j.job_id = held.job_id
RETURNING j.job_id
"""

# ---------------------------------------------------------------------- workers

# A consumer announces itself at start and at every heartbeat: which queues and job
# types it serves, with what capacity, and its counters. Upsert, so a worker whose
# row expired while it was frozen comes back.
WORKER_SEEN: Final = """
INSERT INTO workers AS w (worker_id, host, pid, queues, job_types, concurrency, prefetch,
                          stopping, counts)
VALUES (%(worker)s, %(host)s, %(pid)s, %(queues)s, %(job_types)s, %(concurrency)s,
        %(prefetch)s, %(stopping)s, %(counts)s::jsonb)
ON CONFLICT (worker_id) DO UPDATE
SET last_seen_at = now(), stopping = EXCLUDED.stopping, counts = EXCLUDED.counts,
    job_types = EXCLUDED.job_types
"""

WORKER_GONE: Final = "DELETE FROM workers WHERE worker_id = %(worker)s"

# Jobs that waited for a consumer that knows their type: woken when one announces it
# (and by the re-waker, as a backstop), without waiting for the periodic re-wake.
JOB_WAKE_PARKED: Final = f"""
INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
SELECT j.job_id, j.queue, COALESCE(j.tenant, ''), j.priority, now()
FROM jobs AS j
WHERE j.delay_reason = 'NO_HANDLER' AND j.state IN ({CLAIMABLE_SQL})
  AND j.queue = ANY(%(queues)s::text[]) AND j.job_type = ANY(%(job_types)s::text[])
  AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.job_id = j.job_id)
RETURNING job_id
"""

# ----------------------------------------------------------------------------- relay

# The queues that have wake-ups due, by a loose index scan of the backlog (a few
# index probes, however long the backlog).
OUTBOX_DUE_QUEUES: Final = """
WITH RECURSIVE q AS (
    (SELECT queue FROM outbox WHERE sent_at IS NULL ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT o.queue FROM outbox AS o
            WHERE o.sent_at IS NULL AND o.queue > q.queue ORDER BY o.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL
)
SELECT q.queue FROM q
WHERE q.queue IS NOT NULL
  AND EXISTS (SELECT 1 FROM outbox AS o
              WHERE o.sent_at IS NULL AND o.queue = q.queue AND o.available_at <= now())
"""

# The relay's one decision: which of a queue's due wake-ups to send now. In the
# relay's transaction, under a per-queue advisory lock (another relay skips the
# queue meanwhile), in one statement:
#
# 1. settle: wake-ups in flight whose job has been taken up since (claimed, finished,
#    or turned down: the claim deletes those) leave the table;
# 2. room: the queue's window (given, or twice the capacity of its live consumers,
#    at least min_window) minus the wake-ups still in flight; none while paused;
# 3. order: higher priority first; within a priority, weighted fair share between
#    the queue's tenants by start-time fair queuing: a tenant's k-th wake-up gets the
#    virtual start max(its pass, the queue's clock) + (k-1)/weight, so a tenant of
#    weight 2 gets twice the share of a busy queue, and an idle tenant, whose pass
#    has fallen behind the clock, banks no credit; then age. A capped tenant gets
#    no more than its free slots minus its wake-ups in flight;
# 4. mark the chosen ones sent (the caller publishes them before it commits), move
#    the passes and the clock on, and note per tenant why wake-ups were held back
#    (QUEUE_PAUSED, TENANT_CAP, WINDOW, FAIR_SHARE), only when that changed.
#
# Returns the sent wake-ups with their turn (1 goes first: the order above, which
# the publisher keeps, so a pass's urgent wake-up is not packed behind the others),
# then one summary row (id NULL): the room there was, whether the lock was had, and
# whether due wake-ups were held back.
OUTBOX_WAKE_QUEUE: Final = f"""
WITH RECURSIVE gate AS (
    SELECT pg_try_advisory_xact_lock(hashtextextended('hybrid_jobs.wake.' || %(queue)s, 0)) AS ok
), settled AS (
    DELETE FROM outbox AS o USING jobs AS j
    WHERE (SELECT ok FROM gate) AND o.queue = %(queue)s AND o.sent_at IS NOT NULL
      AND j.job_id = o.job_id AND NOT ({UNTAKEN})
    RETURNING o.id
), capacity AS (
    SELECT COALESCE(%(window)s::int, GREATEST(%(min_window)s::int, (
               SELECT 2 * sum(w.concurrency)::int FROM workers AS w
               WHERE %(queue)s = ANY(w.queues) AND {_LIVE_WORKER}))) AS size
), pause AS (
    SELECT EXISTS (SELECT 1 FROM queues WHERE queue = %(queue)s AND paused) AS paused
), room AS (
    SELECT CASE
               WHEN NOT (SELECT ok FROM gate) THEN 0
               WHEN (SELECT paused FROM pause) THEN 0
               ELSE GREATEST(0, LEAST(%(limit)s::int, (SELECT size FROM capacity)
                   - (SELECT count(*) FROM outbox AS i
                      WHERE i.queue = %(queue)s AND i.sent_at IS NOT NULL)::int
                   + (SELECT count(*) FROM settled)::int))
           END AS n
), {_PENDING_TENANTS}, clock AS (
    SELECT COALESCE((SELECT vpass FROM fair_shares
                     WHERE queue = %(queue)s AND tenant = '{CLOCK_ROW}'), 0) AS v
), shares AS (
    SELECT t.tenant,
           COALESCE(l.weight, 1) AS weight,
           GREATEST(COALESCE(s.vpass, 0), (SELECT v FROM clock)) AS start,
           -- A capped tenant's room: its free slots, less its wake-ups in flight in
           -- this queue (those of other queues are theirs to count; the claim holds
           -- the cap exactly whatever the relay sends).
           CASE WHEN l.max_running IS NULL THEN NULL
                ELSE GREATEST(0, l.max_running - COALESCE(u.running, 0) - (
                    SELECT count(*) FROM outbox AS i
                    WHERE i.queue = %(queue)s AND i.tenant = t.tenant
                      AND i.sent_at IS NOT NULL AND i.id NOT IN (SELECT id FROM settled))::int)
           END AS cap_room,
           s.held_reason
    FROM tenants AS t
    LEFT JOIN tenant_limits AS l ON l.tenant = t.tenant
    LEFT JOIN tenant_usage AS u ON u.tenant = t.tenant
    LEFT JOIN fair_shares AS s ON s.queue = %(queue)s AND s.tenant = t.tenant
    WHERE t.tenant IS NOT NULL
), candidates AS (
    -- each tenant's best due wake-ups, one more than it could get (to tell that
    -- something was held back)
    SELECT c.id, c.job_id, c.priority, c.available_at, sh.tenant, c.k,
           sh.start + (c.k - 1) / sh.weight AS vstart
    FROM shares AS sh
    CROSS JOIN LATERAL (
        SELECT o.id, o.job_id, o.priority, o.available_at,
               row_number() OVER (ORDER BY o.priority DESC, o.available_at, o.id) AS k
        FROM outbox AS o
        WHERE o.queue = %(queue)s AND o.tenant = sh.tenant AND o.sent_at IS NULL
          AND o.available_at <= now()
        ORDER BY o.priority DESC, o.available_at, o.id
        LIMIT LEAST((SELECT n FROM room), COALESCE(sh.cap_room, 2147483646)) + 1
    ) AS c
), chosen AS (
    SELECT c.*,
           row_number() OVER (ORDER BY c.priority DESC, c.vstart, c.available_at, c.id) AS turn
    FROM candidates AS c JOIN shares AS sh USING (tenant)
    WHERE sh.cap_room IS NULL OR c.k <= sh.cap_room
    ORDER BY c.priority DESC, c.vstart, c.available_at, c.id
    LIMIT (SELECT n FROM room)
), marked AS (
    SELECT o.id FROM outbox AS o
    WHERE o.id IN (SELECT id FROM chosen) AND o.sent_at IS NULL
    FOR UPDATE SKIP LOCKED
), sent AS (
    UPDATE outbox AS o SET sent_at = now()
    FROM marked WHERE o.id = marked.id
    RETURNING o.id, o.job_id, o.priority
), verdicts AS (
    SELECT sh.tenant, sh.weight, sh.cap_room, sh.held_reason,
           (SELECT max(c.vstart) FROM chosen AS c
            WHERE c.tenant = sh.tenant AND c.id IN (SELECT id FROM sent)) AS last_vstart,
           (SELECT count(*) FROM candidates AS c WHERE c.tenant = sh.tenant) AS wanted,
           (SELECT count(*) FROM chosen AS c WHERE c.tenant = sh.tenant) AS got
    FROM shares AS sh
), reasons AS (
    SELECT v.*,
           -- WINDOW: the window had no room, or this tenant got what room there
           -- was and wanted more; FAIR_SHARE: others went first (by priority or
           -- share) and left it none.
           CASE WHEN v.got >= v.wanted THEN NULL
                WHEN (SELECT paused FROM pause) THEN 'QUEUE_PAUSED'
                WHEN v.cap_room IS NOT NULL AND v.got >= v.cap_room THEN 'TENANT_CAP'
                WHEN (SELECT n FROM room) = 0 OR v.got > 0 THEN 'WINDOW'
                ELSE 'FAIR_SHARE'
           END AS reason
    FROM verdicts AS v
), shared AS (
    INSERT INTO fair_shares AS f (queue, tenant, vpass, held_reason, held_since)
    SELECT %(queue)s, r.tenant, COALESCE(r.last_vstart + 1 / r.weight, 0), r.reason,
           CASE WHEN r.reason IS NULL THEN NULL ELSE now() END
    FROM reasons AS r
    WHERE (SELECT ok FROM gate)
      AND (r.last_vstart IS NOT NULL OR r.reason IS DISTINCT FROM r.held_reason)
    UNION ALL
    SELECT %(queue)s, '{CLOCK_ROW}', max(c.vstart), NULL, NULL
    FROM chosen AS c WHERE c.id IN (SELECT id FROM sent)
    HAVING count(*) > 0
    ON CONFLICT (queue, tenant) DO UPDATE
    SET vpass = GREATEST(f.vpass, EXCLUDED.vpass),
        held_reason = EXCLUDED.held_reason,
        held_since = CASE WHEN f.held_reason IS NOT DISTINCT FROM EXCLUDED.held_reason
                          THEN f.held_since ELSE EXCLUDED.held_since END
)
SELECT s.id, s.job_id, s.priority, NULL::int AS room, NULL::bool AS locked, NULL::bool AS held,
       c.turn
FROM sent AS s JOIN chosen AS c USING (id)
UNION ALL
SELECT NULL, NULL, NULL, (SELECT n FROM room), (SELECT ok FROM gate),
       EXISTS (SELECT 1 FROM reasons WHERE reason IS NOT NULL), NULL
"""

# Wake-ups in flight whose job has been taken up since, in every queue: the wake
# statement settles its own queue as it goes; this catches queues that got no new
# work since. Rows a wake statement holds are skipped.
OUTBOX_SETTLE: Final = f"""
DELETE FROM outbox AS o USING jobs AS j
WHERE o.id IN (SELECT id FROM outbox WHERE sent_at IS NOT NULL
               ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
  AND j.job_id = o.job_id AND NOT ({UNTAKEN})
"""

# Wake-ups in flight longer than the grace whose job still waits untaken, per queue:
# their message may have been lost. Read under the re-waker's lock.
OUTBOX_LOST_QUEUES: Final = f"""
SELECT o.queue, count(*)
FROM outbox AS o JOIN jobs AS j ON j.job_id = o.job_id
WHERE o.sent_at IS NOT NULL
  AND o.sent_at < now() - make_interval(secs => %(grace_seconds)s)
  AND {UNTAKEN}
GROUP BY o.queue
"""

# The re-waker: such wake-ups in the given queues (those the broker holds no ready
# message for, so none is on its way) go back to the backlog, to be sent again.
OUTBOX_REWAKE_LOST: Final = f"""
UPDATE outbox AS o SET sent_at = NULL, available_at = now()
FROM jobs AS j
WHERE o.queue = ANY(%(queues)s::text[])
  AND o.sent_at IS NOT NULL
  AND o.sent_at < now() - make_interval(secs => %(grace_seconds)s)
  AND j.job_id = o.job_id AND {UNTAKEN}
RETURNING o.job_id
"""

# A backstop under the re-waker's lock: a due job that waits to run and has no
# wake-up at all (none pending, none in flight) gets one. Nothing in this project
# leaves a job so; a row edited by hand might. Jobs parked for a handler nobody runs
# are left parked until someone can run them.
JOB_WAKE_ORPHANS: Final = f"""
INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
SELECT j.job_id, j.queue, COALESCE(j.tenant, ''), j.priority, now()
FROM jobs AS j
WHERE j.state IN ({CLAIMABLE_SQL})
  AND j.run_after <= now() - make_interval(secs => %(grace_seconds)s)
  AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.job_id = j.job_id)
  AND (j.delay_reason IS DISTINCT FROM 'NO_HANDLER'
       OR EXISTS (SELECT 1 FROM workers AS w
                  WHERE {_LIVE_WORKER} AND j.queue = ANY(w.queues)
                    AND j.job_type = ANY(w.job_types)))
LIMIT %(limit)s
RETURNING job_id, queue
"""

# The backlog per queue, for the relay's stats line: wake-ups waiting (due or
# later) and in flight.
OUTBOX_BACKLOG: Final = """
SELECT queue,
       count(*) FILTER (WHERE sent_at IS NULL AND available_at <= now()) AS due,
       count(*) FILTER (WHERE sent_at IS NOT NULL) AS in_flight,
       EXTRACT(EPOCH FROM now() - min(available_at) FILTER (WHERE sent_at IS NULL
                                                            AND available_at <= now()))
FROM outbox
GROUP BY queue
ORDER BY queue
"""

# The sweeper: leases that expired without a report. A crashed or frozen worker
# looks exactly like this. RUNNING becomes RETRY_WAIT after the handler's backoff
# (fixed at claim in expiry_backoff), like any failed attempt, so a job that kills
# its worker does not take the next one down at once; or FAILED once the attempts
# are spent (counted at claim, so such a job still stops); CANCEL_REQUESTED becomes
# CANCELLED. The lost attempt gets what every end of a lease gets (_lease_ended).
# SKIP LOCKED passes over a row whose worker is heartbeating it right now.
JOB_SWEEP_EXPIRED: Final = f"""
WITH expired AS (
    SELECT j.job_id, j.queue, j.tenant, j.priority, j.attempt_count AS attempt,
           j.lease_generation, j.lease_owner AS worker, j.run_after AS ready_at, j.started_at,
           j.holds_slot AS held_slot,
           COALESCE(j.expiry_backoff, %(default_backoff)s) AS backoff,
           CASE
               WHEN j.state = 'CANCEL_REQUESTED' THEN 'CANCELLED'
               WHEN j.attempt_count >= {_BUDGET} THEN 'FAILED'
               ELSE 'RETRY_WAIT'
           END AS state
    FROM jobs AS j
    WHERE j.state IN ({LEASED_SQL}) AND j.lease_expires_at <= now()
    ORDER BY j.lease_expires_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), swept AS (
    UPDATE jobs AS j
    SET state = e.state,
        run_after = CASE WHEN e.state = 'RETRY_WAIT'
                         THEN now() + make_interval(secs => e.backoff) ELSE j.run_after END,
        lease_owner = NULL,
        lease_expires_at = NULL,
        holds_slot = false,
        last_error_code = 'LEASE_EXPIRED',
        last_error_message = 'the lease of ' || e.worker || ' expired without a report',
        finished_at = CASE WHEN e.state = 'RETRY_WAIT' THEN NULL ELSE statement_timestamp() END,
        updated_at = now()
    FROM expired AS e
    WHERE j.job_id = e.job_id
    RETURNING e.job_id, e.state, e.queue, e.tenant, e.priority, j.run_after, e.attempt,
              e.lease_generation, e.worker, e.ready_at, e.started_at, e.held_slot,
              'LEASE_EXPIRED'::text AS error_code, j.last_error_message AS error_message,
              NULL::text AS traceback
), {_lease_ended("swept")}
SELECT job_id, state, worker, run_after FROM swept
"""

# The reconciler, in one transaction: lock every tenant's usage row (claims and
# releases of capped tenants wait for the moment), then, in a statement whose
# snapshot is taken after the locks, set each count of held slots to the number of
# leases that hold one. Returns the tenants that had drifted, with both figures.
TENANT_USAGE_LOCK: Final = "SELECT tenant FROM tenant_usage ORDER BY tenant FOR NO KEY UPDATE"

TENANT_USAGE_RECONCILE: Final = f"""
WITH actual AS (
    SELECT u.tenant, u.running AS recorded,
           (SELECT count(*) FROM jobs AS j
            WHERE j.tenant = u.tenant AND j.state IN ({LEASED_SQL}) AND j.holds_slot)::int AS held
    FROM tenant_usage AS u
)
UPDATE tenant_usage AS u SET running = a.held
FROM actual AS a
WHERE u.tenant = a.tenant AND u.running <> a.held
RETURNING u.tenant, a.recorded, a.held
"""

# About once a second: the waiting jobs of each tenant that has a max_queued, and how
# fast its jobs are being claimed (for the retry-after hint of Backpressure).
TENANT_USAGE_REFRESH: Final = f"""
WITH counted AS MATERIALIZED (
    SELECT u.tenant,
           (SELECT count(*) FROM jobs AS j
            WHERE j.tenant = u.tenant AND j.state IN ({CLAIMABLE_SQL}))::int AS waiting,
           (u.claimed - u.claimed_seen) / NULLIF(EXTRACT(EPOCH FROM now() - u.queued_at), 0)
               AS rate
    FROM tenant_usage AS u JOIN tenant_limits AS l USING (tenant)
    WHERE l.max_queued IS NOT NULL
    ORDER BY u.tenant
    FOR NO KEY UPDATE OF u
)
UPDATE tenant_usage AS u
SET queued = c.waiting,
    queued_at = now(),
    claimed_seen = u.claimed,
    drain_per_s = COALESCE(0.5 * COALESCE(u.drain_per_s, c.rate) + 0.5 * c.rate, u.drain_per_s)
FROM counted AS c
WHERE u.tenant = c.tenant
"""

# Consumers that stopped heartbeating (killed, frozen, partitioned) are forgotten.
WORKERS_EXPIRE: Final = """
DELETE FROM workers
WHERE last_seen_at < now() - make_interval(secs => %(worker_ttl)s)
RETURNING worker_id
"""

# ------------------------------------------------------------------------- relays

# A relay announces itself at start and at every heartbeat: whether it is connected
# to RabbitMQ and how many wake-ups it has published. Upsert, so a relay whose row
# expired while it was frozen comes back.
RELAY_SEEN: Final = """
INSERT INTO relays AS r (relay_id, host, pid, broker_connected, published)
VALUES (%(relay)s, %(host)s, %(pid)s, %(connected)s, %(published)s)
ON CONFLICT (relay_id) DO UPDATE
SET last_seen_at = now(), broker_connected = EXCLUDED.broker_connected,
    published = EXCLUDED.published
"""

RELAY_GONE: Final = "DELETE FROM relays WHERE relay_id = %(relay)s"

# Relays that stopped heartbeating (killed, frozen) are forgotten, like consumers.
RELAYS_EXPIRE: Final = """
DELETE FROM relays
WHERE last_seen_at < now() - make_interval(secs => %(ttl)s)
RETURNING relay_id
"""

# A relay seen this recently is live: several heartbeats (every 5 s by default), so
# one slow round does not make it look gone.
RELAY_LIVE_SECONDS: Final = 30

# How many relays are live, and how many of those are connected to RabbitMQ.
RELAYS_LIVE: Final = f"""
SELECT count(*)::int, (count(*) FILTER (WHERE broker_connected))::int
FROM relays
WHERE last_seen_at > now() - make_interval(secs => {RELAY_LIVE_SECONDS})
"""

# Each periodic chore (sweeping, re-waking, reconciling...) runs in one relay at a
# time: the others find its transaction-scoped advisory lock taken and skip the round.
MAINTENANCE_TRY_LOCK: Final = "SELECT pg_try_advisory_xact_lock(%(key)s)"

# ------------------------------------------------------------------------- schedules
# Producer statements write a schedule through the caller's transaction;
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
SELECT name, job_type, payload, cron, every_seconds, timezone, queue, tenant, priority,
       max_attempts, catchup, next_fire_at, now() AS db_now
FROM schedules
WHERE NOT paused AND next_fire_at <= now()
ORDER BY next_fire_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

# How long until the next occurrence of any active schedule is due (negative: one is
# due now; NULL: none): schedules_due_idx, its first entry. The scheduler sleeps
# that long rather than a fixed interval, so an occurrence fires on time.
SCHEDULE_NEXT_DUE: Final = """
SELECT EXTRACT(EPOCH FROM min(next_fire_at) - now())::float8
FROM schedules
WHERE NOT paused
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

# --------------------------------------------------------------------------- control
# (issue 10: replay, pause, explain, retention.) The operator's actions, through the
# caller's transaction like the producer's; the reads behind "why is my job
# waiting?"; and the relay's retention chore. Each read is index lookups bounded by
# the backlog, never by the history (STYLE 12); bench/control_plans.py shows the
# plans on a table of many finished jobs.

# Who acted, when the caller does not say: the database role, and the client's
# application_name when it set one ("app (jobctl)").
_WHO = (
    "current_user || COALESCE(' (' || NULLIF(current_setting('application_name'), '') || ')', '')"
)

# The size of a failed or cancelled job's own attempt budget: its max_attempts less
# the attempts it had made before its latest replay (its first run: all of them).
# NULL for a job no handler ever claimed: the handler's budget applies at claim.
# (GREATEST would skip a NULL, hence the CASE.)
_OWN_BUDGET = """CASE WHEN j.max_attempts IS NOT NULL THEN GREATEST(1, j.max_attempts - COALESCE(
    (SELECT r.attempts_before FROM job_replays AS r
     WHERE r.job_id = j.job_id ORDER BY r.id DESC LIMIT 1), 0)) END"""

_REPLAYABLE = "'CANCELLED', 'FAILED'"


def _replay(target: str, *, before: str = "") -> str:
    """Replays the jobs ``target`` selects and locks (job_id, state,
    attempt_count, budget), each still FAILED or CANCELLED (``before``: CTEs the
    target reads from): back to QUEUED, due now,
    with a fresh budget of the job's own size on top of the attempts it made (so
    attempt_count <= max_attempts holds and the history keeps numbering on), what
    belonged to the finished run cleared, a wake-up (the outbox trigger notifies the
    relay at commit), and a job_replays row saying who asked, when, from what."""
    return f"""
WITH RECURSIVE {before}target AS ({target}
), replayed AS (
    UPDATE jobs AS j
    SET state = 'QUEUED',
        max_attempts = j.attempt_count + t.budget,
        run_after = now(),
        finished_at = NULL,
        result = NULL,
        progress = NULL,
        progress_at = NULL,
        delay_reason = NULL,
        delay_since = NULL,
        cancel_requested_at = NULL,
        updated_at = now()
    FROM target AS t
    -- The array hands the planner the ids as one pkey probe each; joined alone, it
    -- may read every failed job (jobs_unsuccessful_idx) to hash-join a few.
    WHERE j.job_id = ANY(ARRAY(SELECT job_id FROM target)) AND j.job_id = t.job_id
      AND j.state IN ({_REPLAYABLE})
    RETURNING j.job_id, j.queue, j.tenant, j.priority, j.run_after,
              t.state AS from_state, t.attempt_count
), woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT job_id, queue, COALESCE(tenant, ''), priority, run_after FROM replayed
), recorded AS (
    INSERT INTO job_replays (job_id, replayed_by, from_state, attempts_before)
    SELECT job_id, COALESCE(%(by)s::text, {_WHO}), from_state, attempt_count FROM replayed
)
SELECT job_id FROM replayed
"""


# One job, by id. It waits for a lock another transaction holds on the row (a
# worker's outcome, retention), then decides on what that left.
JOB_REPLAY: Final = _replay(f"""
    SELECT j.job_id, j.state, j.attempt_count, {_OWN_BUDGET} AS budget
    FROM jobs AS j
    WHERE j.job_id = %(job_id)s AND j.state IN ({_REPLAYABLE})
    FOR NO KEY UPDATE""")

# Failed and cancelled jobs matching the filters (NULL: any), oldest finished first,
# at most `limit`. Everything is read from jobs_unsuccessful_idx (queue,
# finished_at), whose predicate is exactly this state list: the given queue, or the
# queues that have such jobs by a loose index scan; then each queue's oldest
# `limit` from its range of the index (finished_after narrows the range), merged.
# PostgreSQL may instead walk jobs_finished_idx in time order when failures are
# common enough that it meets `limit` of them soon (bench/control_plans.py shows
# both). Rows another transaction holds are skipped: the next call gets them.
_UNSUCCESSFUL_QUEUE = f"SELECT j.queue FROM jobs AS j WHERE j.state IN ({_REPLAYABLE})"

JOB_REPLAY_MATCHING: Final = _replay(
    f"""
    SELECT j.job_id, j.state, j.attempt_count, {_OWN_BUDGET} AS budget
    FROM jobs AS j
    WHERE j.job_id = ANY(ARRAY(SELECT job_id FROM candidates)) AND j.state IN ({_REPLAYABLE})
    FOR NO KEY UPDATE OF j SKIP LOCKED""",
    before=f"""found AS (
    ({_UNSUCCESSFUL_QUEUE} AND %(queue)s::text IS NULL ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT ({_UNSUCCESSFUL_QUEUE} AND j.queue > f.queue ORDER BY j.queue LIMIT 1)
    FROM found AS f WHERE f.queue IS NOT NULL
), queues AS (
    SELECT %(queue)s::text AS queue WHERE %(queue)s::text IS NOT NULL
    UNION ALL
    SELECT queue FROM found WHERE queue IS NOT NULL
), candidates AS (
    SELECT c.job_id
    FROM queues AS q
    CROSS JOIN LATERAL (
        SELECT j.job_id, j.finished_at
        FROM jobs AS j
        WHERE j.state IN ({_REPLAYABLE}) AND j.queue = q.queue
          AND (%(finished_after)s::timestamptz IS NULL
               OR j.finished_at > %(finished_after)s::timestamptz)
          AND (%(job_type)s::text IS NULL OR j.job_type = %(job_type)s::text)
          AND (%(error_code)s::text IS NULL OR j.last_error_code = %(error_code)s::text)
        ORDER BY j.finished_at
        LIMIT %(limit)s
    ) AS c
    ORDER BY c.finished_at
    LIMIT %(limit)s
), """,
)

# Pausing a paused queue keeps who paused it first, and when. The claim refuses
# the queue's jobs (QUEUE_PAUSED) and the relay sends none of its wake-ups while the
# row says paused; jobs already running finish.
QUEUE_PAUSE: Final = f"""
INSERT INTO queues AS q (queue, paused, paused_at, paused_by, updated_at)
VALUES (%(queue)s, true, now(), COALESCE(%(by)s::text, {_WHO}), now())
ON CONFLICT (queue) DO UPDATE
SET paused = true,
    paused_at = CASE WHEN q.paused THEN q.paused_at ELSE EXCLUDED.paused_at END,
    paused_by = CASE WHEN q.paused THEN q.paused_by ELSE EXCLUDED.paused_by END,
    updated_at = now()
RETURNING q.queue, q.paused_at, q.paused_by
"""

# Returns the queue if it was paused. The notification reaches the relay when the
# caller commits, so the queue's waiting wake-ups go out at once, not at a poll.
QUEUE_RESUME: Final = f"""
WITH resumed AS (
    UPDATE queues SET paused = false, paused_at = NULL, paused_by = NULL, updated_at = now()
    WHERE queue = %(queue)s AND paused
    RETURNING queue
)
SELECT r.queue, (SELECT pg_notify('{OUTBOX_CHANNEL}', '')) IS NULL FROM resumed AS r
"""

QUEUES_PAUSED: Final = """
SELECT queue, paused_at, paused_by FROM queues WHERE paused ORDER BY queue
"""

# Everything "why is my job waiting?" needs about one job, by key lookups: the row;
# its queue's pause; its tenant's cap and slots in use; why the relay last held the
# tenant's wake-ups back in that queue; its wake-up (one in flight that was not
# taken up yet, else the pending one); how many live consumers serve its queue and
# how many of them have its handler (the workers table holds one row per consumer
# process); when its lease holder last heartbeat. statement_timestamp(), not now():
# the caller's transaction may have begun long ago.
JOB_EXPLAIN: Final = f"""
SELECT j.job_id, j.job_type, j.state, j.queue, j.tenant, j.priority, j.attempt_count,
       j.max_attempts, j.run_after, j.last_error_code, j.last_error_message, j.finished_at,
       j.lease_owner, j.lease_expires_at, j.lease_generation, j.started_at, j.progress,
       j.progress_at, j.cancel_requested_at, j.delay_reason, j.delay_since,
       statement_timestamp() AS db_now,
       q.paused_at, q.paused_by,
       l.max_running, COALESCE(u.running, 0) AS running,
       f.held_reason, f.held_since,
       o.id AS wakeup_id, o.available_at AS wakeup_due, o.sent_at AS wakeup_sent_at,
       (SELECT count(*) FROM workers AS w
        WHERE j.queue = ANY(w.queues) AND {_LIVE_WORKER})::int AS workers_on_queue,
       (SELECT count(*) FROM workers AS w
        WHERE j.queue = ANY(w.queues) AND j.job_type = ANY(w.job_types)
          AND {_LIVE_WORKER})::int AS handlers_on_queue,
       (SELECT w.last_seen_at FROM workers AS w WHERE w.worker_id = j.lease_owner) AS owner_seen_at
FROM jobs AS j
LEFT JOIN queues AS q ON q.queue = j.queue AND q.paused
LEFT JOIN tenant_limits AS l ON l.tenant = j.tenant
LEFT JOIN tenant_usage AS u ON u.tenant = j.tenant
LEFT JOIN fair_shares AS f ON f.queue = j.queue AND f.tenant = COALESCE(j.tenant, '')
LEFT JOIN LATERAL (
    SELECT o.id, o.available_at, o.sent_at
    FROM outbox AS o
    WHERE o.job_id = j.job_id AND (o.sent_at IS NULL OR ({UNTAKEN}))
    ORDER BY o.sent_at IS NULL, o.available_at
    LIMIT 1
) AS o ON true
WHERE j.job_id = %(job_id)s
"""

# For a due job with a wake-up, the queue in front of it:
# - in_flight: wake-ups of its queue sent and not yet taken up, ahead of its own
#   (all of them, if its own is still pending): about a window's worth;
# - pending_ahead: due pending wake-ups that the relay sends before its own (higher
#   priority, or the same priority and older), counted per tenant over two ranges
#   of outbox_pending_idx each, so only the entries ahead are read, at most `cap`+1
#   of them per tenant (fair share between tenants is not modelled: an estimate);
# - drain: the queue's attempts that ended in the last `drain_window` seconds,
#   from the newest `drain_sample` attempts of all queues (job_attempts_finished_idx,
#   then a key lookup each), when the earliest of them started, and how far back
#   the sample reaches;
# - oldest_due: the queue's oldest due pending wake-up, read from outbox_due_idx no
#   further than its own (the queue's outbox lag).
JOB_EXPLAIN_BACKLOG: Final = f"""
WITH RECURSIVE {_PENDING_TENANTS}, ahead AS (
    SELECT x.n
    FROM tenants AS t
    CROSS JOIN LATERAL (
        SELECT (SELECT count(*) FROM (
                    SELECT 1 FROM outbox AS o
                    WHERE o.queue = %(queue)s AND o.tenant = t.tenant AND o.sent_at IS NULL
                      AND o.priority > %(priority)s AND o.available_at <= %(now)s
                    LIMIT %(cap)s + 1) AS hi)
             + (SELECT count(*) FROM (
                    SELECT 1 FROM outbox AS o
                    WHERE o.queue = %(queue)s AND o.tenant = t.tenant AND o.sent_at IS NULL
                      AND o.priority = %(priority)s
                      AND (o.available_at, o.id) < (%(due)s::timestamptz, %(wakeup_id)s::bigint)
                    LIMIT %(cap)s + 1) AS eq) AS n
    ) AS x
    WHERE t.tenant IS NOT NULL AND %(pending)s
), sampled AS (
    -- the queue of each sampled attempt by a key lookup (a subquery per row: a
    -- join could be planned as a scan of all jobs when the limit is a parameter)
    SELECT s.started_at, s.finished_at,
           (SELECT j.queue FROM jobs AS j WHERE j.job_id = s.job_id) = %(queue)s AS ours
    FROM (SELECT a.job_id, a.started_at, a.finished_at FROM job_attempts AS a
          WHERE a.finished_at > %(now)s - make_interval(secs => %(drain_window)s)
            AND a.outcome <> 'QUEUED'
          ORDER BY a.finished_at DESC
          LIMIT %(drain_sample)s) AS s
), drained AS (
    SELECT count(*) FILTER (WHERE ours) AS n, count(*) AS sampled,
           min(finished_at) AS since, min(started_at) FILTER (WHERE ours) AS first_start
    FROM sampled
)
SELECT (SELECT count(*) FROM (
            SELECT 1 FROM outbox AS o JOIN jobs AS j ON j.job_id = o.job_id
            WHERE o.queue = %(queue)s AND o.sent_at IS NOT NULL
              AND (%(pending)s OR (o.sent_at, o.id) < (%(sent_at)s::timestamptz,
                                                       %(wakeup_id)s::bigint))
              AND {UNTAKEN}
            LIMIT %(cap)s + 1) AS f) AS in_flight,
       (SELECT COALESCE(sum(n), 0) FROM ahead)::bigint AS pending_ahead,
       d.n AS drained, d.sampled, d.since, d.first_start,
       (SELECT o.available_at FROM outbox AS o
        WHERE %(pending)s AND o.sent_at IS NULL AND o.available_at <= %(due)s::timestamptz
          AND o.queue = %(queue)s
        ORDER BY o.available_at LIMIT 1) AS oldest_due
FROM drained AS d
"""

# Retention: a batch of jobs finished longer ago than keep_seconds, oldest first
# (jobs_finished_idx), with their effect keys (job_effects has no foreign key: an
# effect's record outlives its job until now); attempts, wake-ups and replays go by
# ON DELETE CASCADE. A row another transaction holds (an operator replaying it) is
# skipped, and the state is checked again on the locked row, so a job replayed
# meanwhile is never deleted. Deleting the job frees its dedup key. The deletes take
# the batch as an array, so each is a key lookup per id whatever the batch size
# (joined, a generic plan could scan all of job_effects or jobs).
JOB_RETENTION_DELETE: Final = f"""
WITH doomed AS (
    SELECT j.job_id
    FROM jobs AS j
    WHERE j.state IN ({TERMINAL_SQL})
      AND j.finished_at < now() - make_interval(secs => %(keep_seconds)s)
    ORDER BY j.finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), effects AS (
    DELETE FROM job_effects WHERE job_id = ANY(ARRAY(SELECT job_id FROM doomed))
), deleted AS (
    DELETE FROM jobs AS j
    WHERE j.job_id = ANY(ARRAY(SELECT job_id FROM doomed)) AND j.state IN ({TERMINAL_SQL})
    RETURNING j.job_id
)
SELECT count(*) FROM deleted
"""

# --------------------------------------------------------------- operator surface
# (issue 11.) Writes the operator's surface (jobctl, the HTTP API) makes beside the
# producer API's own.

# A schedule's job template, for a manual trigger: what each occurrence enqueues.
SCHEDULE_TEMPLATE: Final = """
SELECT job_type, payload, queue, tenant, priority, max_attempts
FROM schedules
WHERE name = %(name)s
"""

# The fingerprint of the API request that created a job (Idempotency-Key). Inserted
# after the enqueue, in its transaction: a row that comes back means this request
# made the job (or adopted one enqueued with its key by other means); none means the
# job had a fingerprint already, and JOB_REQUEST_FINGERPRINT reads it.
JOB_REQUEST_RECORD: Final = """
INSERT INTO job_requests (job_id, fingerprint)
VALUES (%(job_id)s, %(fingerprint)s)
ON CONFLICT (job_id) DO NOTHING
RETURNING true
"""

JOB_REQUEST_FINGERPRINT: Final = """
SELECT fingerprint FROM job_requests WHERE job_id = %(job_id)s
"""
