"""Tenants: their limits, the backpressure check at enqueue, and the relay's
repair and refresh of their usage counters."""

from __future__ import annotations

from typing import Final

from schema.tables import CLAIMABLE_SQL, LEASED_SQL

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
