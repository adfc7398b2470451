"""Resources (jobs.resource): at most one lease acts on a resource at once. The claim
takes it by inserting its hold (resource_holds), which is its check too: a hold that
stands turns the job down. A clean end of the lease deletes the hold and wakes the
next waiter; an expired lease leaves it uncertain until it is resolved
(fragments.lease_ended, resource_wake_next, RESOURCE_RESOLVE)."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.states import DelayReason

USES: Final = "j.resource IS NOT NULL"

# The leases that hold the resource until they end (or, expired, until resolved).
HOLDS: Final = "j.resource IS NOT NULL"

REASONS: Final = (DelayReason.RESOURCE_BUSY, DelayReason.RESOURCE_UNCERTAIN)

CLAIM_TAKE: Final = """resource_ranked AS (
    -- 2b4. of those, the ones with a resource (a job has a key or a resource, never
    -- both), ranked per resource: only the first may take it. Without one in the
    -- batch, this and the next read no table.
    SELECT a.job_id, a.resource, a.lease_generation,
           row_number() OVER (PARTITION BY a.resource ORDER BY a.priority DESC, a.job_id)
               AS resource_rank
    FROM key_admitted AS a WHERE a.resource IS NOT NULL
), resource_taken AS (
    -- 2b5. A resource is taken by inserting its hold, for the lease this claim starts
    -- (the next generation), resources in sorted order and after the tenants and
    -- keys (as every end of a lease releases them). A hold that stands, held or
    -- uncertain, turns the job down; one another statement is writing or deleting
    -- is waited for and judged by what it left: never a read and then a write.
    INSERT INTO resource_holds (resource, job_id, lease_generation)
    SELECT r.resource, r.job_id, r.lease_generation + 1
    FROM resource_ranked AS r WHERE r.resource_rank = 1
    ORDER BY r.resource
    ON CONFLICT (resource) DO NOTHING
    RETURNING job_id
), resource_admitted AS (
    -- 2b6. the admitted jobs whose key and resource were had
    SELECT a.* FROM key_admitted AS a
    WHERE a.resource IS NULL OR a.job_id IN (SELECT job_id FROM resource_taken)
)"""

CLAIM_TAKE_ABSENT: Final = """resource_admitted AS (
    SELECT a.* FROM key_admitted AS a
)"""

REFUSED: Final = f"""-- its resource held (by this batch's first, or a lease): uncertain
                -- when its hold says so, as far as this snapshot sees it
                WHEN l.resource IS NOT NULL AND l.job_id IN (SELECT job_id FROM key_admitted)
                THEN CASE WHEN EXISTS (SELECT 1 FROM resource_holds AS x
                                       WHERE x.resource = l.resource
                                         AND x.uncertain_since IS NOT NULL)
                          THEN '{DelayReason.RESOURCE_UNCERTAIN}'
                          ELSE '{DelayReason.RESOURCE_BUSY}' END"""
