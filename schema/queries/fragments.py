"""The pieces every statement is built from, named once so they are the same
everywhere: the fence a worker's write carries, the end of a lease, what an untaken
wake-up is, a live consumer, the skip scan of a queue's tenants."""

from __future__ import annotations

from typing import Final

from schema.tables import CLAIMABLE_SQL, DEFAULT_MAX_ATTEMPTS, LEASED_SQL

# The attempt budget in force: the row's, else the default.
BUDGET = f"COALESCE(j.max_attempts, {DEFAULT_MAX_ATTEMPTS})"

# The fence every worker write carries: the row is still this worker's lease, of
# the generation the worker was given at claim (``h`` names the worker's handle).
FENCE: Final = (
    "j.job_id = h.job_id AND j.lease_generation = h.generation"
    f" AND j.lease_owner = %(worker)s AND j.state IN ({LEASED_SQL})"
)

# A wake-up ``o`` that was sent and not yet taken up: its job ``j`` still waits to
# run, was due when it was sent, and has been neither claimed nor turned down since.
# (A consumer can turn a job down before the relay's mark-sent commits, when the
# claim cannot yet see the wake-up as sent to put it back: its time, delay_since,
# still says the wake-up was used.)
UNTAKEN: Final = (
    f"j.state IN ({CLAIMABLE_SQL}) AND j.run_after <= o.sent_at"
    " AND (j.started_at IS NULL OR j.started_at < o.sent_at)"
    " AND (j.delay_since IS NULL OR j.delay_since < o.sent_at)"
)

# A wake-up a consumer turned down for want of a handler, while another live
# consumer has it, comes due again after this many seconds at the latest: the
# backstop. The relay brings it forward as soon as such a consumer has a free slot
# (OUTBOX_WAKE_REFUSED); sent back at once, it met a consumer that could not run it
# either, round and round (about 870 wake-ups per job in 10 s).
REFUSAL_BACKSTOP_SECONDS: Final = 10

# A consumer not heard from for this many seconds is gone: the relay forgets its row
# (WORKER_EXPIRE, after --worker-ttl), and every judgement of liveness (LIVE_WORKER:
# the claim's refusals, the relay's window and packing, explain, jobctl's stats and
# workers) stops counting it, so they must all use the same figure: a consumer
# judged gone while its row lives on would make explain say "no consumer" for a job
# a live one is about to take. It is bound (%(worker_ttl)s), not formatted in,
# because the relay takes it as a flag; its default, the consumer's, and the figure
# explain and jobctl use (which cannot know a relay's flag) are this one constant.
# A consumer refreshes its row at least three times per TTL (consumers.lease_keeper).
WORKER_TTL_SECONDS: Final = 60.0

# A live consumer: heartbeating within the given number of seconds, not stopping.
LIVE_WORKER = "NOT w.stopping AND w.last_seen_at > now() - make_interval(secs => %(worker_ttl)s)"


def lease_ended(source: str) -> str:
    """The tail of every statement that ends a lease (outcome, give-back, sweep):
    the attempt's history row, a wake-up for a job that will run again, and the
    release of the tenant slot the lease held, all in the statement that ended it,
    so none can happen twice or be forgotten.

    ``source`` names a CTE of the rows that left the lease, with the columns
    job_id, state (the new one), queue, tenant, priority, run_after, attempt,
    lease_generation, worker, ready_at, started_at, held_slot, error_code,
    error_message and traceback.
    """
    return f"""history AS (
    INSERT INTO job_attempts (job_id, attempt, lease_generation, worker, ready_at, started_at,
                              finished_at, outcome, error_code, error_message, traceback)
    SELECT job_id, attempt, lease_generation, worker, ready_at, started_at,
           statement_timestamp(), state, error_code, error_message, traceback
    FROM {source}
), woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT job_id, queue, COALESCE(tenant, ''), priority, run_after
    FROM {source} WHERE state IN ({CLAIMABLE_SQL})
), releasing AS MATERIALIZED (
    -- Locked in tenant order, as the claim locks them: two statements that touch
    -- several tenants never wait for each other in a circle.
    SELECT u.tenant, r.slots
    FROM tenant_usage AS u
    JOIN (SELECT tenant, count(*) AS slots FROM {source} WHERE held_slot GROUP BY tenant) AS r
      ON r.tenant = u.tenant
    ORDER BY u.tenant
    FOR NO KEY UPDATE OF u
), released AS (
    -- never below zero: drift is the reconciler's to repair, never a reason to
    -- refuse an outcome
    UPDATE tenant_usage AS u SET running = GREATEST(u.running - r.slots, 0)
    FROM releasing AS r
    WHERE u.tenant = r.tenant
)"""


# The tenants with unsent wake-ups in queue %(queue)s, as a recursive CTE named
# ``tenants`` (its last row is NULL, for the caller to skip): a skip scan of outbox_pending_idx,
# one index probe per tenant however many wake-ups each has waiting. Needs WITH
# RECURSIVE.
PENDING_TENANTS: Final = """tenants AS (
    (SELECT o.tenant FROM outbox AS o
     WHERE o.queue = %(queue)s AND o.sent_at IS NULL ORDER BY o.tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT o.tenant FROM outbox AS o
            WHERE o.queue = %(queue)s AND o.sent_at IS NULL AND o.tenant > t.tenant
            ORDER BY o.tenant LIMIT 1)
    FROM tenants AS t WHERE t.tenant IS NOT NULL
)"""
