"""Keys (jobs.key): at most ``key_limit`` leases of a key at once and, for an ordered
key, one job at a time in the order of enqueue (``ordered=True``), or until a FAILED
one is replayed (``"strict"``). A key's leases are counted in key_usage; its end of
a lease releases them and wakes the next (fragments.lease_ended, key_wake_next)."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.queries.fragments import KEY_AHEAD
from hybrid_jobs.schema.states import DelayReason

USES: Final = "(j.key IS NOT NULL OR j.key_seq IS NOT NULL)"

# The leases that hold one of the key's leases until they end (every lease of a job
# with a key: the claim takes a lease only with its key).
HOLDS: Final = "j.key IS NOT NULL"

REASONS: Final = (DelayReason.KEY_BUSY, DelayReason.KEY_ORDER)

CLAIM_ADMIT: Final = f"""key_behind AS (
    -- 1c1. ordered jobs with an earlier one of their key still waiting, running or, for
    -- 'strict', FAILED: they wait for it (KEY_ORDER). key_seq follows the commit
    -- order of the enqueues (JOB_KEYS_LOCK), so no earlier one is still to appear.
    SELECT r.job_id
    FROM runnable AS r
    WHERE r.key_seq IS NOT NULL
      AND EXISTS (SELECT 1 FROM jobs AS x
                  WHERE x.key = r.key AND x.key_seq < r.key_seq
                    AND {KEY_AHEAD.format(x="x")})
), key_ranked AS (
    -- 1c2. the others with a key, ranked per key: the first key_limit may take it
    SELECT r.job_id, r.key_limit_in_batch,
           row_number() OVER (PARTITION BY r.key ORDER BY r.key_seq, r.priority DESC, r.job_id)
               AS key_rank
    FROM (SELECT r.*, min(r.key_limit) OVER (PARTITION BY r.key) AS key_limit_in_batch
          FROM runnable AS r
          WHERE r.key IS NOT NULL AND r.job_id NOT IN (SELECT job_id FROM key_behind)) AS r
), key_waiting AS (
    -- 1c3. what waits for its key whatever the tenants say: behind in order, or past the
    -- key's limit within this batch
    SELECT job_id FROM key_behind
    UNION ALL
    SELECT job_id FROM key_ranked WHERE key_rank > key_limit_in_batch
)"""

CLAIM_ADMIT_ABSENT: Final = """key_behind AS (
    SELECT NULL::uuid AS job_id WHERE false
), key_waiting AS (
    SELECT job_id FROM key_behind
)"""

CLAIM_TAKE: Final = """key_wanted AS (
    -- 2b1. the leases each key is asked for
    SELECT a.key, count(*)::int AS n, min(a.key_limit) AS key_limit
    FROM admitted AS a WHERE a.key IS NOT NULL GROUP BY a.key
), key_taken AS (
    -- 2b2. A key's leases are taken here, all the jobs admitted for it or none, keys in
    -- sorted order and after the tenants (as every end of a lease releases them). A
    -- row another statement holds is waited for and judged by the count it left; one
    -- inserted meanwhile conflicts and is judged so too: never a count and then a
    -- write. The key's limit is the strictest of its holders' and the newcomers':
    -- a job that asked to run alone is never joined by one that allows company, nor
    -- joins one (the row goes with the key's last lease, so the next holder's own
    -- limit governs again).
    INSERT INTO key_usage AS u (key, running, key_limit)
    SELECT w.key, w.n, w.key_limit FROM key_wanted AS w ORDER BY w.key
    ON CONFLICT (key) DO UPDATE
    SET running = u.running + EXCLUDED.running,
        key_limit = LEAST(u.key_limit, EXCLUDED.key_limit)
    WHERE u.running + EXCLUDED.running <= LEAST(u.key_limit, EXCLUDED.key_limit)
    RETURNING u.key
), key_admitted AS (
    -- 2b3. the admitted jobs whose key was had
    SELECT a.* FROM admitted AS a
    WHERE a.key IS NULL OR a.key IN (SELECT key FROM key_taken)
)"""

CLAIM_TAKE_ABSENT: Final = """key_admitted AS (
    SELECT a.* FROM admitted AS a
)"""

# The claim's reasons, by the step that decided: behind in order, or its key's
# leases not had (past the limit within the batch, or taken by others).
REFUSED_ORDER: Final = (
    f"WHEN l.job_id IN (SELECT job_id FROM key_behind) THEN '{DelayReason.KEY_ORDER}'"
)
REFUSED_BUSY: Final = f"""WHEN l.job_id IN (SELECT job_id FROM key_waiting)
                     OR l.job_id IN (SELECT job_id FROM admitted) THEN '{DelayReason.KEY_BUSY}'"""
