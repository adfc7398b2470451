"""Concurrency limits per queue (queue_limits): written by consumers from their
``--queue-limit`` options and by operators, taken and given back by the claim and
the end of a lease (schema/gates/queue_limit.py, fragments.queue_limit_wake_next),
listed for operators."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.queries.fragments import WHO, no_pending_wakeup
from hybrid_jobs.schema.states import DelayReason
from hybrid_jobs.schema.tables import CLAIMABLE_SQL

_WAITING: Final = (
    f"x.state IN ({CLAIMABLE_SQL}) AND x.delay_reason = '{DelayReason.QUEUE_CONCURRENCY_LIMIT}'"
)

# A consumer at start-up (its --queue-limit options), or an operator: each queue's
# limit written (created, or changed when it differs: updated_by is who last changed
# it: the consumer's worker id, else the operator's database role), so the last to
# write wins; its running count is kept, a removed limit's too (its leases still
# hold their slots). The queue's row is
# marked limited in the same statement: that mark, read by every claim with the
# queue's pause, is what sends its jobs through the limit. A limit raised wakes as
# many of the jobs turned down for it (QUEUE_CONCURRENCY_LIMIT) as it now has free
# slots: nothing else would, since they wait without a wake-up for the end of a
# lease of their queue. Rows are locked in queue order, as the claim locks them.
# Returns the queues whose limit changed.
QUEUE_LIMIT_RECORD_MANY: Final = f"""
WITH given AS (
    SELECT g.queue, g.max_running
    FROM jsonb_to_recordset(%(limits)s::jsonb) AS g(queue text, max_running int)
), written AS (
    INSERT INTO queue_limits AS c (queue, max_running, updated_by)
    SELECT queue, max_running, COALESCE(%(worker)s::text, {WHO}) FROM given
    ORDER BY queue
    ON CONFLICT (queue) DO UPDATE
    SET max_running = EXCLUDED.max_running, updated_at = now(),
        updated_by = EXCLUDED.updated_by
    WHERE c.max_running IS DISTINCT FROM EXCLUDED.max_running
    RETURNING c.queue, c.max_running, c.running
), marked AS (
    INSERT INTO queues AS q (queue, limited, updated_at)
    SELECT queue, true, now() FROM given
    ORDER BY queue
    ON CONFLICT (queue) DO UPDATE SET limited = true, updated_at = now()
    WHERE NOT q.limited
), woken AS (
    -- the waiters as they are now, read by queue_limit_waiters with a snapshot of
    -- its own taken after the row was locked: this statement's, taken before it
    -- waited for the lock, misses a job a claim holding the row just turned down
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT n.job_id, n.queue, COALESCE(n.tenant, ''), n.priority, now()
    FROM written AS w
    CROSS JOIN LATERAL queue_limit_waiters(
        w.queue, GREATEST(w.max_running - w.running, 0), w.max_running - w.running,
        '{{}}'::uuid[]) AS n
    WHERE {no_pending_wakeup("n.job_id")}
)
SELECT queue FROM written
"""

# An operator removes a queue's limit: its queue's mark goes, so claims no longer
# take its slots, and every job turned down for it is woken (nothing holds them
# back any more). Its row stays, max_running NULL: the leases that hold a slot give
# it back there as they end, so a limit set again counts them (deleted, a new row
# would start at 0, those ends would take from it, and the queue would run over
# its limit). The waiters are read as a raised limit's are, after the row's lock.
# Returns the queue if it had a limit.
QUEUE_LIMIT_REMOVE: Final = f"""
WITH removed AS (
    UPDATE queue_limits AS c SET max_running = NULL, updated_at = now()
    WHERE c.queue = %(queue)s AND c.max_running IS NOT NULL
    RETURNING c.queue
), unmarked AS (
    UPDATE queues AS q SET limited = false, updated_at = now()
    WHERE q.queue = %(queue)s AND q.limited
), woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT n.job_id, n.queue, COALESCE(n.tenant, ''), n.priority, now()
    FROM removed AS r
    CROSS JOIN LATERAL queue_limit_waiters(r.queue, NULL, NULL, '{{}}'::uuid[]) AS n
    WHERE {no_pending_wakeup("n.job_id")}
)
SELECT queue FROM removed
"""

# Every queue's limit (not a removed one's kept row), with the leases that hold a
# slot of it now and the jobs turned down for it that wait (counted to %(limit)s,
# through jobs_queue_limit_waiting_idx), in queue order.
QUEUE_LIMIT_LIST: Final = f"""
SELECT c.queue, c.max_running, c.running,
       (SELECT count(*) FROM (SELECT 1 FROM jobs AS x
                              WHERE x.queue = c.queue AND {_WAITING}
                              LIMIT %(limit)s) AS w)::int AS waiting,
       c.updated_at, c.updated_by
FROM queue_limits AS c
WHERE c.max_running IS NOT NULL
ORDER BY c.queue
"""
