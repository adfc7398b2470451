"""The metrics collector's statements, named. All of them only read.

They live here rather than in :mod:`schema.queries` because they change nothing and
only the collector runs them: their shape (a high-water mark with an overlap, a
snapshot shared by every gauge) is the collector's business, and keeping them apart
leaves the durable record's file to the transitions.

Each one is written to match one index's predicate exactly, so its cost follows the
backlog, or the rows that finished since the last round, never the history: no
``count(*)`` over finished jobs, and no ``state IN (...)`` list spanning two partial
indexes, which makes PostgreSQL scan the whole table (bench/metrics_cost.py shows
the plans at a million finished jobs):

- jobs waiting: ``jobs_claimable_idx`` (queue, state, run_after) WHERE claimable, an
  index-only scan that also gives the oldest due ``run_after``;
- jobs leased: ``jobs_leased_idx`` (queue, state) WHERE leased; a separate statement,
  since one ``state IN (...)`` spanning both partial indexes scans the whole table;
- jobs held for their parents, and waiting for their key, resource or tenant's
  slot: the same index, its rows of the backlog only;
- jobs rate-limited, without an authorized runner, and expired:
  ``jobs_rate_limited_idx``, ``jobs_no_runner_idx`` and ``jobs_expired_idx``;
- the outbox backlog: ``outbox_due_idx`` (available_at, queue) WHERE sent_at IS NULL;
- attempts: ``job_attempts_finished_idx`` (finished_at);
- cancellations: ``jobs_finished_idx`` (finished_at) WHERE terminal;
- scheduler delay: ``schedule_fires_fired_idx`` (fired_at) WHERE enqueued.

The incremental reads take the same two parts: ``late``, rows inside the overlap
window behind the cursor, re-read so that a row committed a moment after its
timestamp is not missed (the caller skips those it counted already); and new rows
past the cursor, oldest first, at most ``limit`` of them per round. For attempts,
whose rows need their job looked up, the late part is read as keys only.
"""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.locks import INSTANCE_SEED, METRICS_LOCK_NAME
from hybrid_jobs.schema.queries import RELAY_FAILING_QUEUES, RELAY_LIVE_LIST
from hybrid_jobs.schema.states import DelayReason
from hybrid_jobs.schema.tables import CLAIMABLE_SQL, LEASED_SQL, TERMINAL_SQL

# The name of the transaction-scoped advisory lock that lets one collection run at a
# time across every `jobctl serve` (schema.locks).
LOCK_NAME: Final = METRICS_LOCK_NAME

# The first statement of a round: its statement timeout (for the rest of this
# transaction only), whether this process may collect now, and the snapshot's clock.
# Timestamps come back in UTC, which psycopg reads several times faster than a named
# zone (even 'Etc/UTC'): a round reads thousands of them.
METRICS_ROUND_BEGIN: Final = f"""
SELECT set_config('statement_timeout', %(timeout_ms)s, true),
       set_config('TimeZone', 'UTC', true),
       pg_try_advisory_xact_lock(hashtextextended(%(lock)s, {INSTANCE_SEED})),
       now()
"""

# Per queue and waiting state: how many, and the age of the oldest one that is due.
METRICS_JOBS_WAITING: Final = f"""
SELECT queue, state, count(*),
       EXTRACT(EPOCH FROM now() - min(run_after) FILTER (WHERE run_after <= now()))::float8
FROM jobs
WHERE state IN ({CLAIMABLE_SQL})
GROUP BY queue, state
"""

# Per queue: jobs that wait for approval (QUEUED, held never due): a few index
# probes of the waiting jobs' partial index, bounded like the count above.
METRICS_JOBS_AWAITING_APPROVAL: Final = """
SELECT queue, count(*)
FROM jobs
WHERE state = 'QUEUED' AND approval = 'REQUIRED'
GROUP BY queue
"""

# Per queue, the waiting jobs a consumer last turned down for their key (KEY_BUSY,
# KEY_ORDER): they wait for the lease ahead of them to end. Read from the same
# waiting jobs as the count above.
METRICS_KEY_WAITS: Final = f"""
SELECT queue, delay_reason, count(*)
FROM jobs
WHERE state IN ({CLAIMABLE_SQL})
  AND delay_reason IN ('{DelayReason.KEY_BUSY}', '{DelayReason.KEY_ORDER}')
GROUP BY queue, delay_reason
"""

# Per queue: jobs held for their parents (enqueue's after=, explain DEPENDENCY):
# QUEUED with a parent not settled yet, never due, so never turned down by a claim
# (their delay_reason is the enqueue's). Read from the waiting jobs' index, like
# the counts above.
METRICS_JOBS_WAITING_FOR_PARENTS: Final = f"""
SELECT queue, count(*)
FROM jobs
WHERE state IN ({CLAIMABLE_SQL}) AND parents_pending > 0
GROUP BY queue
"""

# Per queue: the waiting jobs a consumer last turned down for their tenant's cap
# (TENANT_CAP: max_running of its jobs held leases), from the same waiting jobs. A
# slot that frees wakes them at once (or the relay sends them when it has room).
METRICS_TENANT_CAP_WAITS: Final = f"""
SELECT queue, count(*)
FROM jobs
WHERE state IN ({CLAIMABLE_SQL}) AND delay_reason = '{DelayReason.TENANT_CAP}'
GROUP BY queue
"""

# Per queue: the waiting jobs a consumer last turned down for their type's
# concurrency limit (CONCURRENCY_LIMIT: global_limit jobs of the type held leases),
# from the same waiting jobs. The end of one of those leases wakes the next.
METRICS_CONCURRENCY_LIMIT_WAITS: Final = f"""
SELECT queue, count(*)
FROM jobs
WHERE state IN ({CLAIMABLE_SQL}) AND delay_reason = '{DelayReason.CONCURRENCY_LIMIT}'
GROUP BY queue
"""

# Per queue: the waiting jobs a consumer last turned down for their queue's
# concurrency limit (QUEUE_CONCURRENCY_LIMIT), through jobs_queue_limit_waiting_idx.
# The end of a lease of the queue wakes the next.
METRICS_QUEUE_LIMIT_WAITS: Final = f"""
SELECT queue, count(*)
FROM jobs
WHERE state IN ({CLAIMABLE_SQL}) AND delay_reason = '{DelayReason.QUEUE_CONCURRENCY_LIMIT}'
GROUP BY queue
"""

# Per queue: the waiting jobs a consumer last turned down for a weight above its
# whole concurrency (WEIGHT_OVER_CONCURRENCY), from the same waiting jobs.
METRICS_WEIGHT_WAITS: Final = f"""
SELECT queue, count(*)
FROM jobs
WHERE state IN ({CLAIMABLE_SQL}) AND delay_reason = '{DelayReason.WEIGHT_OVER_CONCURRENCY}'
GROUP BY queue
"""

# Per queue, the waiting jobs a consumer last turned down for their exclusive
# resource (RESOURCE_BUSY: another job's lease holds it; RESOURCE_UNCERTAIN: its
# holder vanished and nobody resolved it yet), from the same waiting jobs.
METRICS_RESOURCE_WAITS: Final = f"""
SELECT queue, delay_reason, count(*)
FROM jobs
WHERE state IN ({CLAIMABLE_SQL})
  AND delay_reason IN ('{DelayReason.RESOURCE_BUSY}', '{DelayReason.RESOURCE_UNCERTAIN}')
GROUP BY queue, delay_reason
"""

# The resources an expired lease left uncertain (resource_holds has a row per
# resource held, so this reads a handful): nothing of them starts until resolved.
METRICS_RESOURCES_UNCERTAIN: Final = """
SELECT count(*) FROM resource_holds WHERE uncertain_since IS NOT NULL
"""

# Per queue and leased state: how many, and how many of their leases have expired
# without the sweeper having moved them on yet.
METRICS_JOBS_LEASED: Final = f"""
SELECT queue, state, count(*), count(*) FILTER (WHERE lease_expires_at <= now())
FROM jobs
WHERE state IN ({LEASED_SQL})
GROUP BY queue, state
"""

# Per queue: jobs waiting for a rate limit's token (jobs_rate_limited_idx), and jobs
# that expired before they started, as long as retention keeps them
# (jobs_expired_idx). Each reads only its own index.
METRICS_JOBS_RATE_LIMITED: Final = f"""
SELECT queue, count(*) FROM jobs
WHERE delay_reason = 'RATE_LIMITED' AND state IN ({CLAIMABLE_SQL})
GROUP BY queue
"""

# Per queue: jobs of a dedicated tenant that a consumer turned down for not naming
# it (NO_AUTHORIZED_RUNNER), from jobs_no_runner_idx only.
METRICS_JOBS_NO_AUTHORIZED_RUNNER: Final = f"""
SELECT queue, count(*) FROM jobs
WHERE delay_reason = '{DelayReason.NO_AUTHORIZED_RUNNER}' AND state IN ({CLAIMABLE_SQL})
GROUP BY queue
"""

METRICS_JOBS_EXPIRED: Final = """
SELECT queue, count(*) FROM jobs
WHERE state = 'CANCELLED' AND last_error_code = 'EXPIRED'
GROUP BY queue
"""

# Wake-ups due and unsent: the backlog beyond each queue's window, and any lag.
# Ones due later (delayed jobs, retries waiting out their backoff) and those of a
# paused queue are not waiting for the relay and are left out.
METRICS_OUTBOX_DUE: Final = """
SELECT count(*), EXTRACT(EPOCH FROM now() - min(available_at))::float8
FROM outbox AS o
WHERE o.sent_at IS NULL AND o.available_at <= now()
  AND NOT EXISTS (SELECT 1 FROM queues AS q WHERE q.queue = o.queue AND q.paused)
"""

# Relays live (heartbeat seen lately) and, of those, connected to RabbitMQ.
METRICS_RELAYS: Final = RELAY_LIVE_LIST

# Queues live relays cannot publish to right now, by reason (relays.failing_queues,
# a few rows at most).
METRICS_PUBLISH_FAILING: Final = RELAY_FAILING_QUEUES


def _count(key: str) -> str:
    # A consumer writes integers; anything else counts as zero rather than failing
    # the whole round.
    return (
        f"CASE WHEN jsonb_typeof(counts->'{key}') = 'number'"
        f" THEN (counts->>'{key}')::numeric::bigint ELSE 0 END"
    )


# Each live consumer's cumulative fence rejections: outcomes the fence turned away
# (stale_outcome) and leases it lost (lease_lost, mostly a heartbeat the fence
# refused). The worker id is a key for the increase since the last round, never a
# label.
METRICS_WORKERS: Final = f"""
SELECT worker_id, queues, {_count("stale_outcome")}, {_count("lease_lost")}
FROM workers
"""

# Queues an operator has touched (paused, resumed): known even while idle.
# Paused queues: a row stays after a resume, and would keep an idle queue's
# series for good.
METRICS_QUEUES: Final = "SELECT queue FROM queues WHERE paused"

# Attempts: the keys of those inside the overlap (most of them counted already: no
# lookup of their job for those), then the ones past the mark with their job's queue
# and type, then, by key, the few late ones not counted yet. The job is looked up by
# its primary key per row (LIMIT 1 keeps the planner from turning it into a join
# that reads the whole jobs table); queue and type are NULL when retention deleted
# the job since. Job ids come as text: a round keeps thousands of keys, and a str
# hashes much faster than a uuid.UUID.
METRICS_ATTEMPTS_LATE: Final = """
SELECT job_id::text, lease_generation, finished_at
FROM job_attempts
WHERE finished_at >= %(low)s AND finished_at <= %(cursor)s
"""

_ATTEMPT = """
SELECT a.job_id::text, a.lease_generation, a.finished_at, j.queue, j.job_type,
       -- a snooze, told from a give-back (both left the job QUEUED, attempt refunded)
       CASE WHEN a.outcome = 'QUEUED' AND a.error_code = 'SNOOZED' THEN 'SNOOZED'
            ELSE a.outcome END,
       a.attempt,
       EXTRACT(EPOCH FROM a.finished_at - a.started_at)::float8,
       EXTRACT(EPOCH FROM a.started_at - a.ready_at)::float8,
       a.error_code IS NOT DISTINCT FROM 'LEASE_EXPIRED'
"""
_JOB_OF_ATTEMPT = """
LEFT JOIN LATERAL (
    SELECT queue, job_type FROM jobs WHERE jobs.job_id = a.job_id LIMIT 1
) AS j ON true
"""

METRICS_ATTEMPTS_AHEAD: Final = f"""
{_ATTEMPT}
FROM (SELECT * FROM job_attempts
      WHERE finished_at > %(cursor)s
      ORDER BY finished_at
      LIMIT %(limit)s) AS a
{_JOB_OF_ATTEMPT}
"""

METRICS_ATTEMPTS_BY_KEY: Final = f"""
{_ATTEMPT}
FROM unnest(%(job_ids)s::uuid[], %(generations)s::bigint[]) AS k(job_id, lease_generation)
JOIN job_attempts AS a USING (job_id, lease_generation)
{_JOB_OF_ATTEMPT}
"""

# Finished jobs someone had asked to cancel, with the state they ended in (the
# caller observes those that ended CANCELLED) and the time from the request to the
# end. The condition is on the request, not on the state: `state = 'CANCELLED'`
# would let the planner pick jobs_unsuccessful_idx (queue, finished_at), whose
# range on its second column reads every failed and cancelled job ever kept.
METRICS_CANCELLATIONS_SINCE: Final = f"""
(SELECT true AS late, job_id, finished_at, state,
        EXTRACT(EPOCH FROM finished_at - cancel_requested_at)::float8
 FROM jobs
 WHERE state IN ({TERMINAL_SQL}) AND finished_at >= %(low)s AND finished_at <= %(cursor)s
   AND cancel_requested_at IS NOT NULL)
UNION ALL
(SELECT false, job_id, finished_at, state,
        EXTRACT(EPOCH FROM finished_at - cancel_requested_at)::float8
 FROM jobs
 WHERE state IN ({TERMINAL_SQL}) AND finished_at > %(cursor)s AND cancel_requested_at IS NOT NULL
 ORDER BY finished_at
 LIMIT %(limit)s)
"""

# Occurrences of recurring schedules that enqueued a job: how late the relay fired
# them. Skipped occurrences (missed while no relay ran, by the catch-up rule) are
# not scheduler delay and are left out.
METRICS_SCHEDULE_FIRES_SINCE: Final = """
(SELECT true AS late, schedule_name, scheduled_for, fired_at, delay_seconds
 FROM schedule_fires
 WHERE outcome = 'enqueued' AND fired_at >= %(low)s AND fired_at <= %(cursor)s)
UNION ALL
(SELECT false, schedule_name, scheduled_for, fired_at, delay_seconds
 FROM schedule_fires
 WHERE outcome = 'enqueued' AND fired_at > %(cursor)s
 ORDER BY fired_at
 LIMIT %(limit)s)
"""
