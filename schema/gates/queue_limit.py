"""Queue concurrency limits (``consumer --queue-limit QUEUE=N``, or an operator's):
at most that many leases of a queue's jobs at once, across every consumer, counted
in queue_limits. The claim locks the queue's row, admits at most its free slots
and, once every gate has admitted them, takes them; every end of a lease that held
one (jobs.queue_limit_held) gives it back and wakes the next job turned down for it
(fragments.lease_ended, queue_limit_wake_next).

A job under both its type's limit and its queue's holds a slot of each: the queue's
admission reads only the jobs the type's admitted (limit_fit), and neither takes
until every gate has admitted the job."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.states import DelayReason

# The job's queue has a limit: queues.limited, in the queue's row ``q`` that every
# claim reads already (is it paused?), joined once to the job's row: a subquery of
# its own here would read that row again for every job, limited queue or not.
USES: Final = "COALESCE(q.limited, false)"

# What keeps a limited queue's jobs out of the plain claim: a term of its probe of
# the queue's row, which it makes anyway for a pause, so a job of a queue without a
# limit reads nothing more.
PLAIN_SKIP: Final = "q.limited"

# The leases that hold one of their queue's slots until they end: the ones claimed
# through the limit.
HOLDS: Final = "j.queue_limit_held"

REASONS: Final = (DelayReason.QUEUE_CONCURRENCY_LIMIT,)

LOCKED_COLUMN: Final = f"{USES} AS queue_limited"
LOCKED_COLUMN_ABSENT: Final = "false AS queue_limited"

CLAIM_ADMIT: Final = """queue_limit_level AS MATERIALIZED (
    -- 1k. the limited queues' rows, locked in queue order after the types' limits
    -- and before the tenants' slots (every end of a lease takes them in that order
    -- too), at their latest version: their free slots. Nothing is taken here: a slot
    -- goes only to a job every gate admits (queue_limit_taken). A queue marked
    -- limited whose limit was removed meanwhile (max_running NULL, the row kept for
    -- the leases still holding a slot) limits nothing, and its jobs take no slot.
    SELECT c.queue, c.max_running - c.running AS free
    FROM queue_limits AS c
    WHERE c.queue IN (SELECT r.queue FROM limit_fit AS r WHERE r.queue_limited)
      AND c.max_running IS NOT NULL
    ORDER BY c.queue
    FOR NO KEY UPDATE OF c
), queue_limit_refused AS (
    -- 1l. of the jobs their type's limit admitted, those past their queue's free
    -- slots, in their turn, each counted for its weight (one waiting for its key
    -- takes no turn). ``at_limit``: the queue had fewer free slots than the job
    -- weighs, so leases of it hold them and their end wakes it; the others (past
    -- this batch's share) get their wake-up back.
    SELECT x.job_id, x.queue, x.free < x.weight AS at_limit
    FROM (SELECT r.job_id, r.queue, r.weight, l.free,
                 sum(r.weight) OVER (PARTITION BY r.queue ORDER BY r.priority DESC, r.job_id)
                     AS queue_rank
          FROM limit_fit AS r JOIN queue_limit_level AS l USING (queue)
          WHERE r.job_id NOT IN (SELECT job_id FROM key_waiting)) AS x
    WHERE x.queue_rank > x.free
), queue_limit_fit AS (
    -- 1m. the runnable jobs with a slot of their queue's limit to have, or under none
    SELECT r.* FROM limit_fit AS r
    WHERE r.job_id NOT IN (SELECT job_id FROM queue_limit_refused)
)"""

CLAIM_ADMIT_ABSENT: Final = """queue_limit_refused AS (
    SELECT NULL::uuid AS job_id, NULL::text AS queue, NULL::boolean AS at_limit
    WHERE false
), queue_limit_fit AS (
    SELECT r.* FROM limit_fit AS r
)"""

CLAIM_TAKE: Final = """queue_limit_taken AS (
    -- 2h. the slots of the jobs every gate admitted (their weights), taken from the
    -- rows locked in 1k
    UPDATE queue_limits AS c SET running = c.running + n.n
    FROM (SELECT a.queue, sum(a.weight)::int AS n
          FROM resource_admitted AS a JOIN queue_limit_level AS l USING (queue)
          GROUP BY a.queue) AS n
    WHERE c.queue = n.queue
)"""

# The jobs of the batch that take a slot, and so hold it (jobs.queue_limit_held).
CLAIMED_SET: Final = "queue_limit_held = j.queue IN (SELECT queue FROM queue_limit_level),"

REFUSED: Final = f"""WHEN l.job_id IN (SELECT job_id FROM queue_limit_refused)
                THEN '{DelayReason.QUEUE_CONCURRENCY_LIMIT}'"""
