"""A job's weight (jobs.weight, enqueue's ``weight=``): the slots one lease of it
takes, of its consumer's concurrency, of its tenant's cap (tenant_usage) and of its
type's concurrency limit (concurrency_limits), and gives back at every end of the
lease. NULL is one: a plain job is not weighed, and the plain claim and the plain
end of a lease have none of this SQL.

The consumer binds its free slots (%(free_slots)s) and its whole concurrency
(%(concurrency)s). The claim admits the weighed jobs whose running sum, by
priority, fits the free slots; one heavier than the consumer's whole concurrency
could never run there, and is turned down (WEIGHT_OVER_CONCURRENCY) rather than
left to starve unexplained. The tenant's and the limit's admission count each
job's weight in place of one (schema/gates/tenant.py, concurrency.py)."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.states import DelayReason

# The job's own weight. A handler's weight (``t.weight``, for its jobs enqueued
# without one) is not in the plain claim's terms: the consumer gives it no weighed
# type, as no limited one, and adds this gate for their jobs (by type).
USES: Final = "j.weight IS NOT NULL"
# The same in a composed claim, which has the handlers' weights.
USES_WITH_TERMS: Final = "COALESCE(j.weight, t.weight) IS NOT NULL"

# The terms' column the consumer binds, for a composed claim.
HANDLER_COLUMN: Final = ", weight int"

# A weighed lease holds its weight of every slot it took: its end must give back
# as much (fragments.lease_ended, composed with the weight).
HOLDS: Final = "j.weight IS NOT NULL"

REASONS: Final = (DelayReason.WEIGHT_OVER_CONCURRENCY,)

LOCKED_COLUMN: Final = (
    "COALESCE(j.weight, t.weight, 1) AS weight,"
    " COALESCE(j.weight, t.weight, 1) > %(concurrency)s AS too_heavy"
)

# A job enqueued without a weight takes its handler's, fixed at its first claim
# (as its attempt budget is), so that every end of its lease gives back as much.
CLAIMED_SET: Final = "weight = COALESCE(j.weight, t.weight),"
LOCKED_COLUMN_ABSENT: Final = "1 AS weight, false AS too_heavy"

# Of the runnable jobs, by priority: the slots they take of this consumer, summed.
ROOM_USED: Final = (
    ",\n           sum(l.weight) OVER (ORDER BY l.priority DESC, l.job_id) AS room_used"
)
ROOM_FITS: Final = " AND r.room_used <= %(free_slots)s"
# In the claim's answer: a job the free slots left out, whatever its handler (a plain
# function's too, though it may have found no thread either), is told 'no_room', for
# the consumer to hold the slots it needs as they free.
LEFT_OUT_FOR_ROOM: Final = (
    "l.job_id IN (SELECT k.job_id FROM ranked AS k WHERE k.room_used > %(free_slots)s)"
)

REFUSED: Final = f"WHEN l.too_heavy THEN '{DelayReason.WEIGHT_OVER_CONCURRENCY}'"
