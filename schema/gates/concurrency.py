"""Concurrency limits (a handler's ``global_limit``): at most that many leases of a
job type's jobs at once, across every consumer, counted in concurrency_limits. The
claim locks the type's row, admits at most its free slots and, once every gate has
admitted them, takes them; every end of a lease that held one (jobs.limit_held)
gives it back and wakes the next job turned down for it
(fragments.lease_ended, limit_wake_next)."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.states import DelayReason

# The handler of the job's type (the consumer's terms ``t``) declares a limit. The
# plain claim is given no limited type's terms: their jobs come back to the
# consumer, which composes the claim with this gate.
USES: Final = "t.global_limit IS NOT NULL"

# The leases that hold one of their type's slots until they end: the ones claimed
# through the limit.
HOLDS: Final = "j.limit_held"

REASONS: Final = (DelayReason.CONCURRENCY_LIMIT,)

LOCKED_COLUMN: Final = "t.global_limit"
LOCKED_COLUMN_ABSENT: Final = "NULL::int AS global_limit"

# The terms' column the consumer binds, for a claim composed with this gate.
HANDLER_COLUMN: Final = ", global_limit int"

CLAIM_ADMIT: Final = """limit_level AS MATERIALIZED (
    -- 1h. the limited types' rows, locked in type order after the rate limits'
    -- buckets and before the tenants' slots (every end of a lease takes them before
    -- the tenants too), at their latest version: their free slots. Nothing is taken
    -- here: a slot goes only to a job every gate admits (limit_taken).
    SELECT c.job_type, c.max_running - c.running AS free
    FROM concurrency_limits AS c
    WHERE c.job_type IN (SELECT r.job_type FROM rated AS r WHERE r.global_limit IS NOT NULL)
    ORDER BY c.job_type
    FOR NO KEY UPDATE OF c
), limit_refused AS (
    -- 1i. the limited jobs past their type's free slots, in their turn, each counted
    -- for its weight (one waiting for its key takes no turn). ``at_limit``: the type
    -- had fewer free slots than the job weighs, so leases of it hold them and their
    -- end wakes it; the others (past this batch's share) get their wake-up back.
    -- One whose type has no row yet is not turned down, only not taken: it comes
    -- back 'locked' (limit_created makes the row).
    SELECT x.job_id, x.job_type, x.global_limit, x.free IS NULL AS unseen,
           COALESCE(x.free, 0) < x.weight AS at_limit
    FROM (SELECT r.job_id, r.job_type, r.global_limit, r.weight, l.free,
                 sum(r.weight) OVER (PARTITION BY r.job_type ORDER BY r.priority DESC, r.job_id)
                     AS limit_rank
          FROM rated AS r LEFT JOIN limit_level AS l USING (job_type)
          WHERE r.global_limit IS NOT NULL
            AND r.job_id NOT IN (SELECT job_id FROM key_waiting)) AS x
    WHERE x.limit_rank > COALESCE(x.free, 0)
), limit_fit AS (
    -- 1j. the runnable jobs with a slot of their limit to have, or under none
    SELECT r.* FROM rated AS r WHERE r.job_id NOT IN (SELECT job_id FROM limit_refused)
)"""

CLAIM_ADMIT_ABSENT: Final = """limit_refused AS (
    SELECT NULL::uuid AS job_id, NULL::text AS job_type, NULL::int AS global_limit,
           NULL::boolean AS unseen, NULL::boolean AS at_limit
    WHERE false
), limit_fit AS (
    SELECT r.* FROM rated AS r
)"""

CLAIM_TAKE: Final = """limit_taken AS (
    -- 2f. the slots of the jobs every gate admitted (their weights), taken from the
    -- rows locked in 1h
    UPDATE concurrency_limits AS c SET running = c.running + n.n
    FROM (SELECT a.job_type, sum(a.weight)::int AS n
          FROM resource_admitted AS a JOIN limit_level AS l USING (job_type)
          GROUP BY a.job_type) AS n
    WHERE c.job_type = n.job_type
), limit_created AS (
    -- 2g. a type's row first needed (its consumers write it at start-up, so rarely):
    -- made with the handler's limit, for the next claim, as the last thing this
    -- claim takes
    INSERT INTO concurrency_limits (job_type, max_running, updated_by)
    SELECT r.job_type, max(r.global_limit), %(worker)s
    FROM limit_refused AS r
    WHERE r.unseen
    GROUP BY r.job_type
    ORDER BY r.job_type
    ON CONFLICT (job_type) DO NOTHING
)"""

# The jobs of the batch that take a slot, and so hold it (jobs.limit_held).
CLAIMED_SET: Final = "limit_held = j.job_type IN (SELECT job_type FROM limit_level),"

REFUSED: Final = f"""WHEN l.job_id IN (SELECT job_id FROM limit_refused)
                THEN '{DelayReason.CONCURRENCY_LIMIT}'"""
