"""Concurrency limits per job type (concurrency_limits): written by consumers from
their handlers' ``global_limit``, taken and given back by the claim and the end of
a lease (schema/gates/concurrency.py, fragments.limit_wake_next), listed for
operators."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.queries.fragments import no_pending_wakeup
from hybrid_jobs.schema.states import DelayReason
from hybrid_jobs.schema.tables import CLAIMABLE_SQL

# A consumer at start-up, for every handler of it that declares a global_limit: the
# type's limit written (created, or changed when it differs: updated_by is the
# consumer that last changed it), so the last consumer to start wins; its running
# count is kept. A limit raised wakes as many of the jobs turned down for it
# (CONCURRENCY_LIMIT) as it now has free slots: nothing else would, since they
# wait without a wake-up for the end of a lease of their type. Rows are locked in
# job-type order, as the claim locks them. Returns the types whose limit changed.
CONCURRENCY_LIMIT_RECORD_MANY: Final = f"""
WITH given AS (
    SELECT g.job_type, g.global_limit
    FROM jsonb_to_recordset(%(limits)s::jsonb) AS g(job_type text, global_limit int)
), written AS (
    INSERT INTO concurrency_limits AS c (job_type, max_running, updated_by)
    SELECT job_type, global_limit, %(worker)s FROM given
    ORDER BY job_type
    ON CONFLICT (job_type) DO UPDATE
    SET max_running = EXCLUDED.max_running, updated_at = now(),
        updated_by = EXCLUDED.updated_by
    WHERE c.max_running <> EXCLUDED.max_running
    RETURNING c.job_type, c.max_running, c.running
), woken AS (
    -- the waiters as they are now, read by concurrency_limit_waiters (migration
    -- 0033) with a snapshot of its own taken after the row was locked: this
    -- statement's, taken before it waited for the lock, misses a job a claim
    -- holding the row just turned down
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT n.job_id, n.queue, COALESCE(n.tenant, ''), n.priority, now()
    FROM written AS w
    CROSS JOIN LATERAL concurrency_limit_waiters(
        w.job_type, GREATEST(w.max_running - w.running, 0), w.max_running - w.running,
        '{{}}'::uuid[]) AS n
    WHERE {no_pending_wakeup("n.job_id")}
)
SELECT job_type FROM written
"""

# Every type's limit, with the leases that hold a slot of it now and the jobs
# turned down for it that wait (counted to %(limit)s, through
# jobs_limit_waiting_idx), in type order.
CONCURRENCY_LIMIT_LIST: Final = f"""
SELECT c.job_type, c.max_running, c.running,
       (SELECT count(*) FROM (SELECT 1 FROM jobs AS x
                              WHERE x.job_type = c.job_type AND x.state IN ({CLAIMABLE_SQL})
                                AND x.delay_reason = '{DelayReason.CONCURRENCY_LIMIT}'
                              LIMIT %(limit)s) AS w)::int AS waiting,
       c.updated_at, c.updated_by
FROM concurrency_limits AS c
ORDER BY c.job_type
"""
