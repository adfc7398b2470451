"""What a job type allows (job_type_policies): written by consumers from their
handlers' declarations, read by the replay and cancel statements, which refuse what
a type's policy forbids unless the caller overrides it."""

from __future__ import annotations

from typing import Final


def forbids(action: str, job: str = "j") -> str:
    """True when the policy of ``job``'s type forbids ``action`` (the column
    ``replay`` or ``cancel_running``): one probe of the policies' primary key, which
    finds nothing for a type that declared no policy."""
    return f"""EXISTS (SELECT 1 FROM job_type_policies AS p
        WHERE p.job_type = {job}.job_type AND NOT p.{action})"""


# A consumer at start-up, for every handler it has: a type that restricts anything
# gets its row (created, or changed when it differs: updated_by is the consumer that
# last changed it), a type that declares nothing loses its row. So the last consumer
# to start wins, and a deploy that drops a restriction removes it. Rows are locked in
# job-type order, so consumers starting together wait for each other, never deadlock
# on their own types. Returns the types whose row changed.
JOB_TYPE_POLICY_RECORD_MANY: Final = """
WITH given AS (
    SELECT g.job_type, g.replay, g.cancel_running, g.on_cancel,
           g.replay AND g.cancel_running AND g.on_cancel IS NULL AS allows_all
    FROM jsonb_to_recordset(%(policies)s::jsonb)
         AS g(job_type text, replay boolean, cancel_running boolean, on_cancel text)
), dropping AS (
    SELECT p.job_type FROM job_type_policies AS p JOIN given AS g ON g.job_type = p.job_type
    WHERE g.allows_all
    ORDER BY p.job_type
    FOR UPDATE OF p
), dropped AS (
    DELETE FROM job_type_policies AS p USING dropping AS d
    WHERE p.job_type = d.job_type
    RETURNING p.job_type
), written AS (
    INSERT INTO job_type_policies AS p (job_type, replay, cancel_running, on_cancel, updated_by)
    SELECT job_type, replay, cancel_running, on_cancel, %(worker)s FROM given
    WHERE NOT allows_all
    ORDER BY job_type
    ON CONFLICT (job_type) DO UPDATE
    SET replay = EXCLUDED.replay, cancel_running = EXCLUDED.cancel_running,
        on_cancel = EXCLUDED.on_cancel, updated_at = now(), updated_by = EXCLUDED.updated_by
    WHERE (p.replay, p.cancel_running, p.on_cancel)
          IS DISTINCT FROM (EXCLUDED.replay, EXCLUDED.cancel_running, EXCLUDED.on_cancel)
    RETURNING p.job_type
)
SELECT job_type FROM written UNION ALL SELECT job_type FROM dropped
"""

# One type's policy; no row: it allows everything.
JOB_TYPE_POLICY: Final = """
SELECT job_type, replay, cancel_running, on_cancel, updated_at, updated_by
FROM job_type_policies WHERE job_type = %(job_type)s
"""

# Why a replay or a cancel request changed nothing: the job's state, and its type's
# policy (NULLs: it has none).
JOB_TYPE_POLICY_REFUSAL: Final = """
SELECT j.state, p.job_type, p.replay, p.cancel_running, p.on_cancel, p.updated_at,
       p.updated_by, j.job_type
FROM jobs AS j LEFT JOIN job_type_policies AS p ON p.job_type = j.job_type
WHERE j.job_id = %(job_id)s
"""
