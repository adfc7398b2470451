"""Exclusive resources (jobs.resource): the holds the claim takes (JOB_CLAIM_MANY,
steps 2b4 to 2b6) and every clean end of a lease releases (lease_ended), the
resolution of one a vanished holder left uncertain, and what is held now."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.queries.fragments import resource_wake_next
from hybrid_jobs.schema.tables import CLAIMABLE_SQL

# Who acts when the caller does not say (as JOB_APPROVE records it).
_WHO = (
    "current_user || COALESCE(' (' || NULLIF(current_setting('application_name'), '') || ')', '')"
)

# An operator (or a reconcile hook) says what happened to the target an expired
# lease left uncertain: the hold is deleted, who and when recorded with the job that
# had left it so, and the resource's next waiting job woken, in the caller's
# transaction. Only an uncertain hold is resolved: one a live lease holds is that
# lease's to release, and freeing it would let a second job act on the target
# beside it.
# Fenced by the holder: an answer is about one hold, the one the expired lease of
# job %(job_id)s, generation %(lease_generation)s left (a hook's, or an operator's
# who names the holder they saw), and frees that hold only. Once it was resolved
# meanwhile and a later lease (another job's, or the same job's retry) took the
# resource and left it uncertain too, the late answer matches no row and changes
# nothing: what was found at the target then says nothing of the later holder. A
# NULL job_id (an operator who names no holder) takes the hold as it is now, read by
# this statement's own DELETE, and returns which it freed; a NULL lease_generation,
# any lease of that job. Returns the job, since when and the generation, or no row.
RESOURCE_RESOLVE: Final = f"""
WITH freed AS (
    DELETE FROM resource_holds AS h
    WHERE h.resource = %(resource)s AND h.uncertain_since IS NOT NULL
      AND h.job_id = COALESCE(%(job_id)s::uuid, h.job_id)
      AND h.lease_generation = COALESCE(%(lease_generation)s::bigint, h.lease_generation)
    RETURNING h.resource, h.job_id, h.lease_generation, h.uncertain_since
), recorded AS (
    INSERT INTO resource_resolutions (resource, job_id, uncertain_since, resolved_by, outcome)
    SELECT resource, job_id, uncertain_since, COALESCE(%(by)s::text, {_WHO}), %(outcome)s::text
    FROM freed
), {resource_wake_next("freed")}
SELECT job_id, uncertain_since, lease_generation FROM freed
"""

# The uncertain holds of the named jobs' resources, each once, with the lease that
# left it so (job and generation, the fence RESOURCE_RESOLVE takes) and, while that
# job is still there, its type (whose handler's reconcile hook looks at the target)
# and payload: for a consumer whose claim turned them down RESOURCE_UNCERTAIN. A
# holder retention deleted leaves its hold uncertain all the same, so it is a LEFT
# JOIN: type and payload NULL, and the types of the named jobs turned down for the
# resource (asking, sorted) say whose hooks may be asked instead.
RESOURCE_UNCERTAIN_FOR: Final = """
SELECT h.resource, h.job_id, h.lease_generation, x.job_type, x.payload, h.uncertain_since,
       array_agg(DISTINCT j.job_type ORDER BY j.job_type) AS asking
FROM jobs AS j
JOIN resource_holds AS h ON h.resource = j.resource AND h.uncertain_since IS NOT NULL
LEFT JOIN jobs AS x ON x.job_id = h.job_id
WHERE j.job_id = ANY(%(job_ids)s::uuid[]) AND j.resource IS NOT NULL
GROUP BY h.resource, x.job_id
ORDER BY h.resource
"""

# The resources held now, uncertain ones first (oldest first), with their holder's
# state (NULL: retention deleted the job, its hold stays) and lease generation, and
# how many jobs wait for each. The table holds a row per resource held,
# so this reads it whole; the waiting count is one index range per row.
RESOURCE_HOLD_LIST: Final = f"""
SELECT h.resource, h.job_id, j.state, j.job_type, h.held_since, h.uncertain_since,
       (SELECT count(*) FROM jobs AS w
        WHERE w.resource = h.resource AND w.state IN ({CLAIMABLE_SQL})
          AND w.job_id <> h.job_id)::int AS waiting,
       h.lease_generation
FROM resource_holds AS h
LEFT JOIN jobs AS j ON j.job_id = h.job_id
ORDER BY h.uncertain_since IS NULL, h.uncertain_since, h.resource
"""
