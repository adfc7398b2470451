"""Tenants: their limits, the backpressure check at enqueue, and the relay's
repair and refresh of their usage counters."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.tables import CLAIMABLE_SQL, LEASED_SQL

# Backpressure at enqueue: for each tenant of a batch that has a max_queued, how many
# of its jobs wait. No hot row and no count of the whole table: the relay counts
# each such tenant's waiting jobs (TENANT_USAGE_REFRESH), and this adds only the
# ones enqueued since, read from the tenant's own index entries. Both counts stop at
# max_queued: past it the answer is the same, whatever the backlog. The tenants
# through a sub-select, whose value the planner does not see: given the array, a
# plan made for its values looked cheaper than the generic one, and PostgreSQL
# planned the check afresh at every enqueue (0.34 ms, to run it in 0.013).
TENANT_BACKPRESSURE: Final = f"""
SELECT l.tenant, l.max_queued,
       u.queued + (SELECT count(*) FROM (
                       SELECT 1 FROM jobs AS j
                       WHERE j.tenant = l.tenant AND j.state IN ({CLAIMABLE_SQL})
                         AND j.created_at > COALESCE(u.queued_at, '-infinity')
                       ORDER BY j.created_at
                       LIMIT l.max_queued) AS since) AS waiting,
       u.drain_per_s
FROM tenant_limits AS l JOIN tenant_usage AS u USING (tenant)
WHERE l.tenant = ANY((SELECT %(tenants)s::text[])::text[]) AND l.max_queued IS NOT NULL
"""

# A tenant's enqueue rate (max_enqueue_rate), in the enqueue's transaction: for each
# tenant of the batch that has one, its bucket (a second's worth, at least one),
# refilled since it was last taken from, locked in tenant order; if every such
# tenant has a token for each of its jobs they are taken, else none is, and the
# tenants short of tokens come back with what they have (the producer raises
# Backpressure). The lock is held until the producer commits: a tenant's producers
# take turns, others' never wait. Returns (tenant, wanted, tokens, rate) per tenant
# refused.
TENANT_ENQUEUE_TAKE: Final = """
WITH wanted AS (
    SELECT * FROM jsonb_to_recordset(%(tenants)s::jsonb) AS w(tenant text, n int)
), level AS MATERIALIZED (
    SELECT l.tenant, w.n, l.max_enqueue_rate AS rate,
           LEAST(GREATEST(l.max_enqueue_rate, 1),
                 COALESCE(l.enqueue_tokens, GREATEST(l.max_enqueue_rate, 1))
                 + l.max_enqueue_rate * GREATEST(0, EXTRACT(EPOCH FROM
                       now() - COALESCE(l.enqueue_refilled_at, now()))::float8)) AS tokens
    FROM tenant_limits AS l JOIN wanted AS w USING (tenant)
    WHERE l.max_enqueue_rate IS NOT NULL
    ORDER BY l.tenant
    FOR NO KEY UPDATE OF l
), taken AS (
    UPDATE tenant_limits AS l
    SET enqueue_tokens = v.tokens - v.n,
        enqueue_refilled_at = GREATEST(now(), l.enqueue_refilled_at)
    FROM level AS v
    WHERE l.tenant = v.tenant AND NOT EXISTS (SELECT 1 FROM level AS x WHERE x.tokens < x.n)
)
SELECT tenant, n, tokens, rate FROM level WHERE tokens < n ORDER BY tenant
"""

# Creates or changes a tenant's limits (and its usage row), in the caller's
# transaction. Only tenant_limits is written here; the counters a claim moves live
# in tenant_usage, so an operator holding this transaction open blocks no claim.
TENANT_LIMIT_SET: Final = """
WITH limits AS (
    INSERT INTO tenant_limits AS l (tenant, max_running, weight, max_queued, max_enqueue_rate,
                                    runners)
    VALUES (%(tenant)s, %(max_running)s, %(weight)s, %(max_queued)s, %(max_enqueue_rate)s,
            %(runners)s)
    ON CONFLICT (tenant) DO UPDATE
    SET max_running = EXCLUDED.max_running, weight = EXCLUDED.weight,
        max_queued = EXCLUDED.max_queued, max_enqueue_rate = EXCLUDED.max_enqueue_rate,
        runners = EXCLUDED.runners, updated_at = now()
    RETURNING l.tenant
), usage AS (
    INSERT INTO tenant_usage (tenant) SELECT tenant FROM limits
    ON CONFLICT (tenant) DO NOTHING
)
SELECT tenant FROM limits
"""

# The waiting jobs are the relay's last count, kept only for tenants with a
# max_queued (counted up to it); for the others, NULL: counting them here would read
# every tenant's backlog per call (10,000 tenants, a million waiting jobs), and a
# stale count left from a max_queued since removed would be a wrong answer.
TENANT_LIMIT_LIST: Final = """
SELECT l.tenant, l.max_running, l.weight, l.max_queued,
       COALESCE(u.running, 0),
       CASE WHEN l.max_queued IS NOT NULL THEN COALESCE(u.queued, 0) END,
       CASE WHEN l.max_queued IS NOT NULL THEN u.queued_at END,
       u.drain_per_s, l.max_enqueue_rate, l.runners
FROM tenant_limits AS l LEFT JOIN tenant_usage AS u USING (tenant)
ORDER BY l.tenant
"""

# The reconciler. First, with no lock: the tenants whose count of held slots differs
# from the leases holding one, in one snapshot (a claim or a release moves both in
# one transaction, so a snapshot never sees them apart); the leases are read once,
# through jobs_leased_idx, however many tenants there are. Usually none differs.
TENANT_USAGE_DRIFTED: Final = f"""
SELECT u.tenant
FROM tenant_usage AS u
LEFT JOIN (SELECT j.tenant, sum(COALESCE(j.weight, 1))::int AS held
           FROM jobs AS j
           WHERE j.state IN ({LEASED_SQL}) AND j.holds_slot
           GROUP BY j.tenant) AS h USING (tenant)
WHERE u.running <> COALESCE(h.held, 0)
ORDER BY u.tenant
LIMIT %(limit)s
"""

# Then, in one transaction, for those tenants only: lock their usage rows (in tenant
# order, as every statement that moves the counters does; claims and releases of
# every other tenant go on), and, in a statement whose snapshot is taken after the
# locks, set each count of held slots to the slots its leases hold (a weighed
# lease its weight).
# Returns the tenants that had drifted, with both figures.
TENANT_USAGE_LOCK: Final = """
SELECT tenant FROM tenant_usage
WHERE tenant = ANY(%(tenants)s::text[])
ORDER BY tenant
FOR NO KEY UPDATE
"""

TENANT_USAGE_RECONCILE: Final = f"""
WITH actual AS (
    SELECT u.tenant, u.running AS recorded, COALESCE(h.held, 0) AS held
    FROM tenant_usage AS u
    LEFT JOIN (SELECT j.tenant, sum(COALESCE(j.weight, 1))::int AS held
               FROM jobs AS j
               WHERE j.state IN ({LEASED_SQL}) AND j.holds_slot
                 AND j.tenant = ANY(%(tenants)s::text[])
               GROUP BY j.tenant) AS h USING (tenant)
    WHERE u.tenant = ANY(%(tenants)s::text[])
)
UPDATE tenant_usage AS u SET running = a.held
FROM actual AS a
WHERE u.tenant = a.tenant AND u.running <> a.held
RETURNING u.tenant, a.recorded, a.held
"""

# Claims per second since the tenant's last count.
_RATE = "(u.claimed - u.claimed_seen) / NULLIF(EXTRACT(EPOCH FROM now() - u.queued_at), 0)"

# About once a second, for the limited tenants (those with a max_queued) counted
# longest ago, at most %(limit)s of them: their waiting jobs, counted up to their
# max_queued (beyond it Backpressure refuses alike), and how fast their jobs are
# being claimed (for the retry-after hint). A round reads at most %(limit)s times
# max_queued index entries, whatever the backlog; every tenant's count is refreshed
# within ceil(limited tenants / %(limit)s) rounds. The counting takes no lock; the
# rows are locked in tenant order, after it, only to write the figures.
TENANT_USAGE_REFRESH: Final = f"""
WITH due AS (
    SELECT u.tenant, l.max_queued
    FROM tenant_usage AS u JOIN tenant_limits AS l USING (tenant)
    WHERE l.max_queued IS NOT NULL
    ORDER BY u.queued_at NULLS FIRST, u.tenant
    LIMIT %(limit)s
), counted AS MATERIALIZED (
    SELECT d.tenant,
           (SELECT count(*) FROM (
                SELECT 1 FROM jobs AS j
                WHERE j.tenant = d.tenant AND j.state IN ({CLAIMABLE_SQL})
                -- in index order, so the scan stops at the limit (a bitmap scan
                -- would read every entry of the tenant first)
                ORDER BY j.created_at
                LIMIT d.max_queued) AS w)::int AS waiting
    FROM due AS d
), locked AS MATERIALIZED (
    SELECT u.tenant FROM tenant_usage AS u
    WHERE u.tenant IN (SELECT tenant FROM counted)
    ORDER BY u.tenant
    FOR NO KEY UPDATE
)
UPDATE tenant_usage AS u
SET queued = c.waiting,
    queued_at = now(),
    claimed_seen = u.claimed,
    drain_per_s = COALESCE(0.5 * COALESCE(u.drain_per_s, {_RATE}) + 0.5 * {_RATE}, u.drain_per_s)
FROM locked AS k JOIN counted AS c USING (tenant)
WHERE u.tenant = k.tenant
"""
