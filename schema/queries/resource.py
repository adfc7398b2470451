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
# beside it. Returns the job and since when, or no row.
RESOURCE_RESOLVE: Final = f"""
WITH freed AS (
    DELETE FROM resource_holds AS h
    WHERE h.resource = %(resource)s AND h.uncertain_since IS NOT NULL
    RETURNING h.resource, h.job_id, h.uncertain_since
), recorded AS (
    INSERT INTO resource_resolutions (resource, job_id, uncertain_since, resolved_by, outcome)
    SELECT resource, job_id, uncertain_since, COALESCE(%(by)s::text, {_WHO}), %(outcome)s::text
    FROM freed
), {resource_wake_next("freed")}
SELECT job_id, uncertain_since FROM freed
"""

# The uncertain holds of the named jobs' resources, each once, with the job that
# left it so (its type, whose handler's reconcile hook looks at the target, and its
# payload): for a consumer whose claim turned them down RESOURCE_UNCERTAIN.
RESOURCE_UNCERTAIN_FOR: Final = """
SELECT DISTINCT ON (h.resource) h.resource, h.job_id, x.job_type, x.payload, h.uncertain_since
FROM jobs AS j
JOIN resource_holds AS h ON h.resource = j.resource AND h.uncertain_since IS NOT NULL
JOIN jobs AS x ON x.job_id = h.job_id
WHERE j.job_id = ANY(%(job_ids)s::uuid[]) AND j.resource IS NOT NULL
ORDER BY h.resource
"""

# The resources held now, uncertain ones first (oldest first), with their holder's
# state and how many jobs wait for each. The table holds a row per resource held,
# so this reads it whole; the waiting count is one index range per row.
RESOURCE_HOLD_LIST: Final = f"""
SELECT h.resource, h.job_id, j.state, j.job_type, h.held_since, h.uncertain_since,
       (SELECT count(*) FROM jobs AS w
        WHERE w.resource = h.resource AND w.state IN ({CLAIMABLE_SQL})
          AND w.job_id <> h.job_id)::int AS waiting
FROM resource_holds AS h
LEFT JOIN jobs AS j ON j.job_id = h.job_id
ORDER BY h.uncertain_since IS NULL, h.uncertain_since, h.resource
"""
