"""Tenant caps (tenant_limits.max_running): at most that many leases of a tenant's
jobs at once, counted in tenant_usage. In every claim, the plain one too: a probe of
the batch's own tenants, none without one. Every end of a lease releases the slot it
held (fragments.lease_ended)."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.states import DelayReason

REASONS: Final = (DelayReason.TENANT_CAP,)


def claim_admit(runnable: str) -> str:
    """Step 2a of both claims: the free slots of the tenants of ``runnable``, their
    rows locked in tenant order, as every statement that moves the counters takes
    them."""
    return f"""usage AS MATERIALIZED (
    -- 2a. their tenants' free slots, locked in tenant order (every statement that
    -- moves these counters does so)
    SELECT u.tenant, l.max_running - u.running AS free
    FROM tenant_usage AS u JOIN tenant_limits AS l USING (tenant)
    WHERE u.tenant IN (SELECT tenant FROM {runnable})
    ORDER BY u.tenant
    FOR NO KEY UPDATE OF u
)"""


def claim_take(admitted: str, slots: str = "count(*)") -> str:
    """Step 2c of both claims: the slots of ``admitted`` (tenant, holds) taken,
    ``slots`` of each job (one; the composed claim's, its weight)."""
    held = f"{slots} FILTER (WHERE a.holds)"
    if slots != "count(*)":
        held = f"COALESCE({held}, 0)"  # a sum of no rows is NULL, a count 0
    return f"""reserved AS (
    -- 2c. their slots taken, in this same statement
    UPDATE tenant_usage AS u
    SET running = u.running + a.slots, claimed = u.claimed + a.taken
    FROM (SELECT a.tenant, {held} AS slots, count(*) AS taken
          FROM {admitted} AS a JOIN usage AS s USING (tenant) GROUP BY a.tenant) AS a
    WHERE u.tenant = a.tenant
)"""
