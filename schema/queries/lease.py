"""A lease's life: the claim that starts it, the heartbeat that extends it, and every
statement that ends it (the holder's outcome, a give-back at a graceful stop, the
sweeper). Each one that ends a lease carries :func:`~schema.queries.fragments.lease_ended`."""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Final

from hybrid_jobs.schema.gates import (
    GATES,
    HELD_GATES,
    concurrency,
    deadline,
    dedicated,
    key,
    queue_limit,
    rate,
    resource,
    tenant,
    weight,
)
from hybrid_jobs.schema.queries.fragments import (
    BUDGET,
    FENCE,
    LIVE_WORKER,
    REFUSAL_BACKSTOP_SECONDS,
    WAITING_BY_ID,
    WEIGHED_CAP_RETRY_SECONDS,
    fence,
    lease_ended,
)
from hybrid_jobs.schema.states import DelayReason
from hybrid_jobs.schema.tables import CLAIMABLE_SQL, LEASED_SQL, TERMINAL_SQL


# What this worker can run, as the consumer binds it: its handlers' types, with their
# budget, backoff, kind (a plain function needs a thread) and rate limit; and, for the
# whole claim, their concurrency limits (the plain claim is given no limited type).
def _handlers(columns: str = "") -> str:
    return f"""types AS (
    -- 1a. what this worker can run: its handlers, with their budget and backoff
    SELECT *
    FROM jsonb_to_recordset(%(types)s::jsonb) AS t(
        job_type text, max_attempts int, backoff_base double precision,
        backoff_cap double precision, backoff_jitter double precision, sync boolean,
        rate_limit text{columns})
)"""


_HANDLERS: Final = _handlers()


def _claimed(admitted: str, taken: str = "", weighed: str = "") -> str:
    """Step 4 of both claims: the jobs of ``admitted`` (job_id, holds) made RUNNING
    under this worker's lease, the next generation, one more attempt; ``weighed``,
    the composed claim's, returns each one's weight too."""
    return f"""claimed AS (
    -- 4. the admitted jobs claimed: RUNNING under this worker's lease
    UPDATE jobs AS j
    SET state = 'RUNNING',
        lease_owner = %(worker)s,
        lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
        lease_generation = j.lease_generation + 1,
        attempt_count = j.attempt_count + 1,
        max_attempts = COALESCE(j.max_attempts, GREATEST(t.max_attempts, j.attempt_count + 1)),
        expiry_backoff = LEAST(t.backoff_cap, t.backoff_base * power(2, LEAST(j.attempt_count, 60)))
                         * (1 + t.backoff_jitter * (2 * random() - 1)),
        holds_slot = a.holds,{taken}
        delay_reason = NULL,
        delay_since = NULL,
        started_at = now(),
        updated_at = now()
    FROM {admitted} AS a, types AS t
    WHERE j.job_id = a.job_id AND t.job_type = j.job_type
    RETURNING j.job_id, j.job_type, j.queue, j.tenant, j.payload, j.attempt_count,
              j.max_attempts, j.lease_generation, j.created_at, j.scheduled_for,
              j.trace_context, j.meta, j.payload_ref{weighed}
)"""


# Refusals for want of a consumer that could take the job: one with its handler
# (NO_HANDLER), or one naming its dedicated tenant (NO_AUTHORIZED_RUNNER). Their
# wake-ups go only where such a consumer has room.
_WANTING_RUNNER: Final = f"'{DelayReason.NO_HANDLER}', '{DelayReason.NO_AUTHORIZED_RUNNER}'"

# Steps 3c to 3f of every composed claim: the refusals' used-up wake-ups deleted, and
# a fresh one where the job should come back (see JOB_CLAIM_MANY).
_REFUSALS_WOKEN: Final = f"""used_up AS (
    -- 3c. their used-up wake-ups deleted
    -- (An array, so that even the generic plan the consumer's prepared claim settles
    -- on probes outbox_job_id_idx per job, where a join was planned as a scan of the
    -- whole outbox; and nothing at all, a one-time test, when none was refused.)
    DELETE FROM outbox AS o
    WHERE EXISTS (SELECT 1 FROM refused)
      AND o.job_id = ANY(ARRAY(SELECT job_id FROM refused)) AND o.sent_at IS NOT NULL
), held AS (
    -- 3d. leases per consumer (at most the fleet's concurrency), counted only when
    -- something was turned down for want of a handler or of a runner naming its tenant
    SELECT x.lease_owner, count(*) AS n
    FROM jobs AS x
    WHERE x.state IN ({LEASED_SQL})
      AND EXISTS (SELECT 1 FROM refused WHERE reason IN ({_WANTING_RUNNER}))
    GROUP BY x.lease_owner
), capable AS (
    -- 3e. per job turned down for want of a handler (or of a runner naming its
    -- tenant): whether another live consumer has it (and names the tenant), and
    -- whether one of those has a free slot now
    SELECT r.job_id, bool_or(COALESCE(h.n, 0) < w.concurrency) AS has_room
    FROM refused AS r
    JOIN workers AS w
      ON w.worker_id <> %(worker)s AND {LIVE_WORKER}
     AND r.queue = ANY(w.queues) AND r.job_type = ANY(w.job_types)
     AND (r.reason = '{DelayReason.NO_HANDLER}' OR r.tenant = ANY(w.tenants))
    LEFT JOIN held AS h ON h.lease_owner = w.worker_id
    WHERE r.reason IN ({_WANTING_RUNNER})
    GROUP BY r.job_id
), requeued AS (
    -- 3f. a fresh wake-up in the backlog. Due now, but for want of a handler (or of
    -- a runner naming its tenant): then only straight to a free slot, and not twice
    -- in a second; else after the backstop, or earlier once a slot frees
    -- (OUTBOX_WAKE_REFUSED). None when no live consumer could take it: it
    -- waits for one to start (JOB_WAKE_PARKED).
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT r.job_id, r.queue, COALESCE(r.tenant, ''), r.priority,
           CASE WHEN r.reason = '{DelayReason.WEIGHT_OVER_CONCURRENCY}'
                -- a consumer with room for its weight may take it. When another live
                -- one serving its queue and type is that large: at once, for it
                -- (the wake-up may meet small ones first: from the second time in
                -- a second, a second later, so they do not pass it round and round).
                -- Else after the backstop, not sent round the consumers too small for
                -- it (one that starts large enough brings it forward: JOB_WAKE_HEAVY)
                THEN CASE WHEN NOT EXISTS (
                              SELECT 1 FROM workers AS w
                              WHERE w.worker_id <> %(worker)s AND {LIVE_WORKER}
                                AND r.queue = ANY(w.queues) AND r.job_type = ANY(w.job_types)
                                AND w.concurrency >= r.weight)
                          THEN now() + make_interval(secs => {REFUSAL_BACKSTOP_SECONDS})
                          WHEN r.refused_lately THEN now() + interval '1 second'
                          ELSE now() END
                WHEN r.reason = '{DelayReason.TENANT_CAP}' AND r.weight > 1
                -- the relay sends a capped tenant's wake-up once one slot is free;
                -- a heavier job needs more, so it asks again a moment later, not at once
                THEN now() + make_interval(secs => {WEIGHED_CAP_RETRY_SECONDS})
                WHEN r.reason = '{DelayReason.RATE_LIMITED}'
                -- when its turn's token will be there (the n-th past the tokens the
                -- bucket has left waits for n more), not before; a bucket first
                -- seen, now (it was made full)
                THEN now() + make_interval(secs => GREATEST(
                         0, d.short_by - COALESCE(t.left_tokens, d.short_by)) / d.per_second)
                WHEN r.reason NOT IN ({_WANTING_RUNNER})
                     OR (c.has_room AND NOT r.refused_lately)
                THEN now()
                ELSE now() + make_interval(secs => {REFUSAL_BACKSTOP_SECONDS}) END
    FROM refused AS r LEFT JOIN capable AS c USING (job_id)
    LEFT JOIN rate_refused AS d USING (job_id)
    LEFT JOIN rate_spent AS t ON t.name = d.bucket
    WHERE r.reason <> 'EXPIRED'
      AND (r.reason NOT IN ({_WANTING_RUNNER}) OR c.job_id IS NOT NULL)
      -- a job waiting for its key or its resource gets its wake-up back when that
      -- frees (or, an uncertain resource, is resolved)
      AND r.reason NOT IN ('{DelayReason.KEY_BUSY}', '{DelayReason.KEY_ORDER}',
                           '{DelayReason.RESOURCE_BUSY}', '{DelayReason.RESOURCE_UNCERTAIN}')
      -- and one turned down by a full concurrency limit, when a lease of its type
      -- (or of its queue) ends
      AND r.job_id NOT IN (SELECT job_id FROM limit_refused WHERE at_limit)
      AND r.job_id NOT IN (SELECT job_id FROM queue_limit_refused WHERE at_limit)
)"""

# In a claim composed with the weight, a job a concurrency limit (its type's, its
# queue's) turns down gets its handler's weight now, as its first claim would fix
# it: the ends of leases that wake the limit's waiters read jobs.weight, and a
# heavy job never claimed yet, its weight NULL there, would be woken for a single
# free slot, turned down again, and the slot left idle while a lighter one slept.
_LIMIT_WEIGHT_NOTED: Final = f""",
        weight = CASE WHEN r.reason IN ('{DelayReason.CONCURRENCY_LIMIT}',
                                        '{DelayReason.QUEUE_CONCURRENCY_LIMIT}')
                      THEN COALESCE(j.weight, (SELECT t.weight FROM types AS t
                                               WHERE t.job_type = j.job_type))
                      ELSE j.weight END"""

# Step 1c's words for a claim composed with the weight.
_ROOM_NOTE: Final = "\n    -- and, weighed, for this worker's free slots"
_ROOM_FIT_NOTE: Final = "\n    -- and, weighed, as many of this worker's free slots as they weigh"


# Step 5 of every composed claim; ``weighed``, of one composed with the weight.
def _answer(weighed: bool) -> str:
    # Answered 'no_thread', a plain function's job short of slots would go back to
    # the backlog, and lighter jobs would take the slots it needs as they free: the
    # claimer holds them for it only on 'no_room'.
    room = weight.LEFT_OUT_FOR_ROOM if weighed else "NOT l.sync"
    return f"""-- 5. one row per requested id: the claimed job, with the gates it uses (what its
-- end of a lease is composed of), or why it was not claimed
SELECT 'claimed' AS status, c.*, l.gates FROM claimed AS c JOIN locked AS l ON l.job_id = c.job_id
UNION ALL
SELECT CASE
           WHEN j.job_id IS NULL THEN 'missing'
           WHEN j.queue <> ALL(%(queues)s::text[]) THEN 'other_queue'
           WHEN r.reason IS NOT NULL THEN r.reason
           -- a gate this statement leaves out: 'full', with the gates it uses, for
           -- the claim composed of them
           WHEN l.unfit THEN 'full'
           -- its rate limit's bucket made by this claim, for the next
           WHEN l.job_id IN (SELECT job_id FROM rate_refused WHERE unseen)
                OR l.job_id IN (SELECT job_id FROM limit_refused WHERE unseen)
           THEN 'locked'
           -- left out of runnable: this worker's free slots were fewer than it needs
           -- (whatever its handler), or else its threads
           WHEN l.job_id IS NOT NULL
                AND {room}
           THEN 'no_room'
           WHEN l.job_id IS NOT NULL THEN 'no_thread'
           -- this worker's already: a claim of it that committed, whose answer was lost
           WHEN j.state IN ({LEASED_SQL}) AND j.lease_owner = %(worker)s THEN 'held_here'
           WHEN j.state IN ({LEASED_SQL}) THEN 'running'
           WHEN j.state IN ({TERMINAL_SQL}) THEN 'finished'
           WHEN j.run_after > now() THEN 'early'
           WHEN j.max_attempts IS NOT NULL AND j.attempt_count >= j.max_attempts THEN 'exhausted'
           ELSE 'locked'
       END,
       ids.job_id, j.job_type, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, CASE WHEN l.unfit THEN l.gates END
FROM unnest(%(job_ids)s::uuid[]) AS ids(job_id)
LEFT JOIN jobs AS j ON j.job_id = ids.job_id
LEFT JOIN refused AS r ON r.job_id = ids.job_id
LEFT JOIN locked AS l ON l.job_id = ids.job_id
WHERE ids.job_id NOT IN (SELECT job_id FROM claimed)
"""


def job_claim_many(gates: Iterable[str] = GATES) -> str:
    """JOB_CLAIM_MANY composed from the optional ``gates`` its batch's jobs use (the
    names of schema/gates: key, rate, resource, deadline); the others' steps are
    left out, their names standing for empty sets. A job that uses a gate left out
    is neither claimed nor turned down: it comes back 'full' with the gates it uses,
    for the claim composed of them. A claimed job comes back with its gates too."""
    return _composed(frozenset(gates))


@cache
def _composed(used: frozenset[str]) -> str:
    unknown = used - set(GATES)
    if unknown:
        raise ValueError(f"no such gate: {sorted(unknown)}")
    k, r, s, d = ("key" in used, "rate" in used, "resource" in used, "deadline" in used)
    c, w, ql = "concurrency" in used, "weight" in used, "queue_limit" in used
    absent = [
        weight.USES_WITH_TERMS if name == "weight" else g.USES
        for name, g in _MODULES.items()
        if name not in used
    ]
    unfit = " OR ".join(absent) if absent else "false"
    # every gate the job uses, its handler's terms included: a claim that leaves one
    # out answers 'full' with them, and a claimed job's end of a lease is composed of them
    uses = ", ".join(
        f"CASE WHEN {weight.USES_WITH_TERMS if name == 'weight' else g.USES} THEN '{name}' END"
        for name, g in _MODULES.items()
    )
    admit = ", ".join(
        [
            key.CLAIM_ADMIT if k else key.CLAIM_ADMIT_ABSENT,
            rate.CLAIM_ADMIT if r else rate.CLAIM_ADMIT_ABSENT,
            concurrency.CLAIM_ADMIT if c else concurrency.CLAIM_ADMIT_ABSENT,
            queue_limit.CLAIM_ADMIT if ql else queue_limit.CLAIM_ADMIT_ABSENT,
            tenant.claim_admit("queue_limit_fit"),
        ]
    )
    take = ", ".join(
        [
            key.CLAIM_TAKE if k else key.CLAIM_TAKE_ABSENT,
            resource.CLAIM_TAKE if s else resource.CLAIM_TAKE_ABSENT,
            tenant.claim_take("resource_admitted", "sum(a.weight)"),
            rate.CLAIM_TAKE if r else rate.CLAIM_TAKE_ABSENT,
            *([concurrency.CLAIM_TAKE] if c else []),
            *([queue_limit.CLAIM_TAKE] if ql else []),
        ]
    )
    reasons = [
        deadline.REFUSED if d else None,
        f"WHEN l.paused THEN '{DelayReason.QUEUE_PAUSED}'",
        f"WHEN l.unauthorized THEN '{DelayReason.NO_AUTHORIZED_RUNNER}'",
        f"WHEN NOT l.known THEN '{DelayReason.NO_HANDLER}'",
        weight.REFUSED if w else None,
        rate.REFUSED if r else None,
        concurrency.REFUSED if c else None,
        queue_limit.REFUSED if ql else None,
        key.REFUSED_ORDER if k else None,
        resource.REFUSED if s else None,
        key.REFUSED_BUSY if k else None,
    ]
    case = "\n                ".join(x for x in reasons if x is not None)
    return f"""
WITH {_handlers(concurrency.HANDLER_COLUMN + weight.HANDLER_COLUMN)}, locked AS (
    -- 1b. the named jobs of this worker's queues that may be claimed now, locked
    -- (others' rows skipped)
    SELECT j.job_id, j.queue, j.tenant, j.job_type, j.priority, j.delay_reason, j.delay_since,
           j.key, j.key_limit, j.key_seq, j.resource, j.lease_generation,
           t.job_type IS NOT NULL AS known,
           {deadline.LOCKED_COLUMN if d else deadline.LOCKED_COLUMN_ABSENT},
           {rate.LOCKED_COLUMN if r else rate.LOCKED_COLUMN_ABSENT},
           {concurrency.LOCKED_COLUMN if c else concurrency.LOCKED_COLUMN_ABSENT},
           {queue_limit.LOCKED_COLUMN if ql else queue_limit.LOCKED_COLUMN_ABSENT},
           {weight.LOCKED_COLUMN if w else weight.LOCKED_COLUMN_ABSENT},
           COALESCE(t.sync, false) AS sync,
           COALESCE(q.paused, false) AS paused,
           -- a dedicated tenant (tenant_limits.runners) this worker does not name
           -- (%(tenants)s, consumer --tenant): its jobs are not this worker's to take.
           -- One probe of the tenant's row per job, however many tenants are dedicated.
           COALESCE({dedicated.NOT_OURS}, false) AS unauthorized,
           -- it uses a gate this statement leaves out: not this statement's to decide
           ({unfit}) AS unfit,
           array_remove(ARRAY[{uses}], NULL) AS gates
    FROM jobs AS j LEFT JOIN types AS t ON t.job_type = j.job_type
    -- its queue's row, read once for its pause and its limit (queues.limited)
    LEFT JOIN queues AS q ON q.queue = j.queue
    -- (the ids through a sub-select, as in JOB_CLAIM_PLAIN_MANY: on a table never
    -- analyzed, a plan made for the values took a scan of every job over 25 lookups)
    WHERE j.job_id = ANY((SELECT %(job_ids)s::uuid[])::uuid[])
      AND j.queue = ANY(%(queues)s::text[])
      AND {WAITING_BY_ID}
      AND j.run_after <= now()
      AND (j.max_attempts IS NULL OR j.attempt_count < j.max_attempts)
    ORDER BY j.job_id
    FOR NO KEY UPDATE OF j SKIP LOCKED
), ranked AS (
    -- 1c. of those, the ones with a handler, an unpaused queue, a tenant this worker
    -- may serve, ranked by priority for the free threads{_ROOM_NOTE if w else ""}
    SELECT l.*, row_number() OVER (PARTITION BY l.sync ORDER BY l.priority DESC, l.job_id)
           AS thread_rank{weight.ROOM_USED if w else ""}
    FROM locked AS l
    WHERE l.known AND NOT l.paused AND NOT l.expired AND NOT l.unauthorized
      AND NOT l.unfit AND NOT l.too_heavy
), runnable AS (
    -- and of those, for a plain function, the ones with a free thread{_ROOM_FIT_NOTE if w else ""}
    SELECT r.*
    FROM ranked AS r
    WHERE (NOT r.sync OR r.thread_rank <= %(free_threads)s){weight.ROOM_FITS if w else ""}
), {admit}, admitted AS (
    -- 2b. the runnable jobs not waiting for their key that fit their tenant's free
    -- slots, by priority, each counted for its weight
    SELECT a.job_id, a.tenant, u.free IS NOT NULL AS holds, a.key, a.key_limit, a.resource,
           a.lease_generation, a.priority, a.job_type, a.weight, a.queue
    FROM (SELECT r.*, sum(r.weight) OVER (PARTITION BY r.tenant ORDER BY r.priority DESC, r.job_id)
                 AS slot_rank
          FROM queue_limit_fit AS r WHERE r.job_id NOT IN (SELECT job_id FROM key_waiting)) AS a
    LEFT JOIN usage AS u ON u.tenant = a.tenant
    WHERE u.free IS NULL OR a.slot_rank <= u.free
), {take}, refused AS (
    -- 3a. the jobs turned down, and why (deadline passed, paused queue, no handler,
    -- no token, key, resource, tenant's cap)
    SELECT l.job_id, l.queue, l.tenant, l.priority, l.job_type, l.rate_name, l.weight,
           CASE {case}
                ELSE '{DelayReason.TENANT_CAP}' END AS reason,
           -- turned down for want of a handler (or of a runner naming its tenant), or
           -- as too heavy, less than a second ago already
           COALESCE(l.delay_reason IN ({_WANTING_RUNNER}, '{DelayReason.WEIGHT_OVER_CONCURRENCY}')
                    AND l.delay_since > now() - interval '1 second', false) AS refused_lately
    FROM locked AS l
    WHERE l.job_id NOT IN (SELECT job_id FROM resource_admitted)
      AND l.job_id NOT IN (SELECT job_id FROM rate_refused WHERE unseen)
      AND l.job_id NOT IN (SELECT job_id FROM limit_refused WHERE unseen)
      AND (l.expired OR l.paused OR l.unauthorized OR NOT l.known OR l.too_heavy
           OR l.job_id IN (SELECT job_id FROM runnable))
), noted AS (
    -- 3b. the reason recorded on the job. delay_since is when a consumer last
    -- turned it down: it marks the wake-up used (see UNTAKEN), so it moves on every
    -- refusal, which is rare (the relay wakes a job only when it can run).
    UPDATE jobs AS j SET delay_reason = r.reason, delay_since = now(), updated_at = now(),
        -- the handler's rate limit, for explain to name
        rate_limit = CASE WHEN r.reason = '{DelayReason.RATE_LIMITED}' THEN r.rate_name
                          ELSE j.rate_limit END{_LIMIT_WEIGHT_NOTED if w else ""}
    FROM refused AS r
    WHERE j.job_id = r.job_id AND r.reason <> 'EXPIRED'
), {deadline.CLAIM_END + ", " if d else ""}{_REFUSALS_WOKEN}, {
        _claimed(
            "resource_admitted",
            (concurrency.CLAIMED_SET if c else "")
            + (queue_limit.CLAIMED_SET if ql else "")
            + (weight.CLAIMED_SET if w else ""),
            ", COALESCE(j.weight, 1) AS weight",
        )
    }
{_answer(w)}"""


_MODULES: Final = {
    "key": key,
    "rate": rate,
    "resource": resource,
    "deadline": deadline,
    "concurrency": concurrency,
    "queue_limit": queue_limit,
    "weight": weight,
}

# Each gate a job uses, named (NULL for one it does not). Not the concurrency
# limit's: the plain claim is given no limited type's terms, and the consumer, which
# knows its handlers' limits, adds it for a job of such a type (the answer's
# job_type). A queue's limit is the database's: its mark on the queue's row names
# it here, read only for the jobs the plain claim leaves.
_USED_GATES: Final = ", ".join(
    f"CASE WHEN {module.USES} THEN '{name}' END"
    for name, module in _MODULES.items()
    if name != "concurrency"
)

# Claims the jobs a batch of wake-ups names, and says for every other one why not.
#
# A named job is taken when it is claimable and due, its type is one this worker has
# a handler for, its queue is not paused, a plain-function handler has a free thread
# (free_threads), its tenant has a free slot, and its key (jobs.key) holds fewer
# than key_limit leases and, for an ordered job, no earlier job of the key waits or
# runs (or, "strict", FAILED), and its resource (jobs.resource) has no hold,
# neither a lease's nor an uncertain one; the slot, the key and the resource are
# taken in this same statement (tenant_usage, key_usage and resource_holds, each
# locked in its own sorted order, in that order). The claim raises the generation
# and the attempt, sets the lease, and fixes the handler's budget for a job enqueued
# without one and the backoff the sweeper will use if the lease expires.
#
# A job under a rate limit (its own rate_limit, else its handler's) needs a token
# of its bucket. The buckets are locked first and their tokens counted (rate_level):
# a job past them is turned down (RATE_LIMITED), its wake-up due when its token will
# be (rate_refused); the others go on to the tenants, keys and resources, and only
# the jobs they all admit take their tokens, last (rate_spent): a job another gate
# turns down spends none. Check all, then take all.
#
# A job past its deadline (expires_at) is not started: it ends CANCELLED, code
# EXPIRED, here (expired_ended).
#
# A job turned down for its queue, its type or its tenant's cap records why
# (delay_reason, written when the reason changes) and its used-up wake-up goes back
# to the backlog, to wait until something can change the answer: for a paused queue
# or a full tenant, due now, since the relay's decision holds it back until the
# queue resumes or a slot frees (which notifies the relay). For want of a handler
# another live consumer has: due now if one of those has a free slot (the wake-up
# met the wrong consumer), at most once a second; else due only after
# REFUSAL_BACKSTOP_SECONDS, and brought forward by the relay once such a consumer
# has a free slot (OUTBOX_WAKE_REFUSED). Sent straight back, it met consumers that
# could not run it either, round and round. A job of a type no other live consumer
# knows waits without a wake-up, until one announces it (JOB_WAKE_PARKED). A job
# waiting for its key (KEY_BUSY, KEY_ORDER) waits without one too: the end of the
# lease ahead of it wakes it (key_wake_next), so a busy key is never polled; and so
# a job waiting for its resource (RESOURCE_BUSY, RESOURCE_UNCERTAIN): the clean end
# of the holder's lease, or the resolution of an uncertain hold, wakes the next
# (resource_wake_next).
# Nothing about it spends an attempt.
#
# A job of a dedicated tenant (tenant_limits.runners) is taken only by a worker
# that names the tenant (%(tenants)s, consumer --tenant); any other turns it down
# (NO_AUTHORIZED_RUNNER) before its rate limit or its tenant's slot is looked at,
# and its wake-up is handled as for want of a handler, among the live consumers that
# name the tenant: due now if one has a free slot, at most once a second; after
# the backstop if one is live but busy (brought forward once one has room,
# OUTBOX_WAKE_REFUSED); none if none is live, until one announces
# itself naming the tenant (JOB_WAKE_PARKED). A worker naming tenants still takes
# every shared tenant's jobs.
#
# A job of a queue this worker does not serve (%(queues)s, its consumer's queues) is
# not its to take, whoever published the wake-up that named it: it is neither locked
# nor written (its own wake-up, in its own queue, stays as it was) and comes back
# 'other_queue', for the worker to drop the stray wake-up.
#
# Rows another transaction holds are skipped (status 'locked'): the worker tries
# them again alone. One row per requested id comes back: 'claimed' with the job, or
# the reason it was not. 'held_here' is a lease this worker holds already: either it
# runs the job, or a claim of it committed and its answer was lost (a dropped
# connection, or the plain claim's partner failing after it), and only this worker
# can start it (JOB_HELD_BY).
#
# The steps, numbered in the SQL: 1. what may run here (its key's turn, and its
# rate limits' tokens); 2. the tenants' slots and the keys' leases;
# 3. the refusals, recorded and woken again; 4. the claim; 5. the answer.
JOB_CLAIM_MANY: Final = job_claim_many()

# The claim of plain jobs: no key, no resource, no deadline, no rate limit (neither
# the job's nor its handler's), a handler here, an unpaused queue this worker
# serves, and a tenant this worker may serve. Most jobs are plain, and for them this
# is JOB_CLAIM_MANY's claim (the same budget, threads, tenant slots taken in tenant
# order, and step 4), without the steps that would find nothing to do: it costs
# 20-30% less (bench.claim_cost). Every other named id comes back 'full', whatever
# the reason (not plain, turned down, of a queue this worker does not serve, held by
# another transaction, no longer waiting): the consumer claims those with
# JOB_CLAIM_MANY, which decides and records why not. Nothing it turns down is
# written, so a job it passes over is exactly as it was.
JOB_CLAIM_PLAIN_MANY: Final = f"""
WITH {_HANDLERS}, locked AS (
    -- 1b. the named plain jobs that may be claimed now, locked (others' rows skipped).
    -- The ids through a sub-select, whose value the planner does not see: a plan
    -- made with the values then looks no cheaper than the generic one, which the
    -- prepared claim settles on. Given the array itself, a plan made for one id
    -- looked cheaper, and PostgreSQL planned the claim afresh every time (0.9 ms of
    -- the 1.7 a claim of one job took, with 40,000 jobs waiting).
    SELECT j.job_id, j.tenant, j.priority, COALESCE(t.sync, false) AS sync
    FROM jobs AS j JOIN types AS t ON t.job_type = j.job_type
    WHERE j.job_id = ANY((SELECT %(job_ids)s::uuid[])::uuid[])
      AND j.queue = ANY(%(queues)s::text[])
      AND {WAITING_BY_ID}
      AND j.run_after <= now()
      AND (j.max_attempts IS NULL OR j.attempt_count < j.max_attempts)
      AND j.key IS NULL AND j.key_seq IS NULL AND j.resource IS NULL
      AND j.expires_at IS NULL AND j.rate_limit IS NULL AND t.rate_limit IS NULL
      AND j.weight IS NULL
      -- (a queue's limit is read from the row of the queue read for its pause)
      AND NOT EXISTS (SELECT 1 FROM queues AS q
                      WHERE q.queue = j.queue AND (q.paused OR {queue_limit.PLAIN_SKIP}))
      AND (j.tenant IS NULL OR NOT EXISTS (
               SELECT 1 FROM tenant_limits AS d
               WHERE d.tenant = j.tenant AND d.runners = 'dedicated'
                 AND d.tenant <> ALL(%(tenants)s::text[])))
    ORDER BY j.job_id
    FOR NO KEY UPDATE OF j SKIP LOCKED
), runnable AS (
    -- 1c. of those, a plain function's only with a free thread
    SELECT r.*
    FROM (SELECT l.*, row_number() OVER (PARTITION BY l.sync ORDER BY l.priority DESC, l.job_id)
                 AS thread_rank
          FROM locked AS l) AS r
    WHERE NOT r.sync OR r.thread_rank <= %(free_threads)s
), {tenant.claim_admit("runnable")}, admitted AS (
    -- 2b. the runnable jobs that fit their tenant's free slots, by priority
    SELECT a.job_id, a.tenant, u.free IS NOT NULL AS holds
    FROM (SELECT r.*, row_number() OVER (PARTITION BY r.tenant ORDER BY r.priority DESC, r.job_id)
                 AS slot_rank
          FROM runnable AS r) AS a
    LEFT JOIN usage AS u ON u.tenant = a.tenant
    WHERE u.free IS NULL OR a.slot_rank <= u.free
), {tenant.claim_take("admitted")}, {_claimed("admitted")}
-- 5. one row per requested id: the claimed job, or 'full' for JOB_CLAIM_MANY to decide,
-- with the gates its job uses (read without a lock: the whole claim is composed of
-- them, and turns back a job whose gates changed meanwhile)
SELECT 'claimed' AS status, c.*, NULL::text[] AS gates FROM claimed AS c
UNION ALL
SELECT 'full', ids.job_id, j.job_type, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, array_remove(ARRAY[{_USED_GATES}], NULL)
FROM unnest(%(job_ids)s::uuid[]) AS ids(job_id)
LEFT JOIN jobs AS j ON j.job_id = ids.job_id
LEFT JOIN types AS t ON t.job_type = j.job_type
-- (its queue's row, once, for its limit: queue_limit.USES)
LEFT JOIN queues AS q ON q.queue = j.queue
WHERE ids.job_id NOT IN (SELECT job_id FROM claimed)
"""

# After a claim whose commit was ambiguous (the connection dropped while it ran): the
# named jobs this worker holds. Worker ids are unique per process, so a job held
# under ours that the process does not know about came from that claim.
JOB_HELD_BY: Final = f"""
SELECT 'claimed', job_id, job_type, queue, tenant, payload, attempt_count, max_attempts,
       lease_generation, created_at, scheduled_for, trace_context, meta, payload_ref,
       COALESCE(weight, 1)
FROM jobs
WHERE job_id = ANY(%(job_ids)s::uuid[]) AND lease_owner = %(worker)s AND state IN ({LEASED_SQL})
"""

# Extends the leases this worker holds, through the fence and only while they have
# not expired (once expired the sweeper may have moved the job on; a late heartbeat
# must not revive it). One row per handle: the renewed job's state (so the worker
# sees CANCEL_REQUESTED), 'LOCKED' for a lease still ours whose row another
# transaction holds (try again alone), or NULL for a lease that is gone; and whether
# the cancel was requested with force (the worker then interrupts the handler).
JOB_HEARTBEAT_MANY: Final = f"""
WITH h AS (
    SELECT * FROM jsonb_to_recordset(%(jobs)s::jsonb) AS h(job_id uuid, generation bigint)
), held AS (
    SELECT j.job_id
    FROM h JOIN jobs AS j ON {FENCE}
    WHERE j.lease_expires_at > now()
    ORDER BY j.job_id
    FOR NO KEY UPDATE OF j SKIP LOCKED
), renewed AS (
    UPDATE jobs AS j
    SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s), updated_at = now()
    FROM held
    WHERE j.job_id = held.job_id
    RETURNING j.job_id, j.state, j.cancel_forced_at IS NOT NULL AS forced
)
SELECT h.job_id,
       COALESCE(r.state, CASE WHEN j.lease_expires_at > now() THEN 'LOCKED' END),
       COALESCE(r.forced AND r.state = 'CANCEL_REQUESTED', false)
FROM h
LEFT JOIN renewed AS r ON r.job_id = h.job_id
LEFT JOIN jobs AS j ON {FENCE}
"""


# Records the outcomes of a batch of attempts, each through its own fence, and for
# each one that applied writes what every end of a lease writes (lease_ended), all
# in one statement. kind is one of:
#   succeeded  -> SUCCEEDED, with the handler's result
#   cancelled  -> CANCELLED (the handler acknowledged a cancel request)
#   failed     -> FAILED at once (Permanent)
#   retry      -> RETRY_WAIT after delay_seconds, or FAILED once the budget is spent,
#                 or CANCELLED if a cancel was requested meanwhile
#   snoozed    -> QUEUED, due after delay_seconds, the attempt refunded (Snooze: not
#                 yet, which is no failure), or CANCELLED if a cancel was requested
# The new state is decided on the locked row, so a concurrent cancel request is seen.
# Returns the applied ones' new states, and 'LOCKED' for outcomes whose row another
# transaction holds (still ours: try again alone). A stale outcome (generation or
# owner no longer match) matches no row, changes nothing and is absent.
def job_finish_many(gates: Iterable[str] = HELD_GATES, *, in_tx: bool = False) -> str:
    """JOB_FINISH_MANY composed from the ``gates`` its batch's leases hold something
    of (key, resource; the others hold nothing past the claim and are ignored): the
    others' steps are left out. An outcome of a lease that holds a gate left out is
    not applied: it comes back 'full', untouched, for JOB_FINISH_MANY. ``in_tx``:
    from inside the job's own transaction, which waits for a row lock rather than
    skip it (it cannot be retried alone later)."""
    return _finish("" if in_tx else "SKIP LOCKED", frozenset(gates) & HELD_GATES)


@cache
def _finish(lock: str, held: frozenset[str]) -> str:
    # A lease holding what this statement leaves out is not taken, and comes back
    # 'full'; the steps that would find nothing to release are not there.
    unfit = " OR ".join(
        g.HOLDS
        for name, g in (
            ("key", key),
            ("resource", resource),
            ("concurrency", concurrency),
            ("queue_limit", queue_limit),
            ("weight", weight),
        )
        if name not in held
    )
    # (only a lease that holds a slot of its limit has one to clear)
    released = "\n        limit_held = false," if "concurrency" in held else ""
    if "queue_limit" in held:
        released += "\n        queue_limit_held = false,"
    only_fit = f"\n    WHERE NOT ({unfit})" if unfit else ""
    left = f"CASE WHEN {unfit} THEN 'full' ELSE 'LOCKED' END" if unfit else "'LOCKED'"
    return f"""
WITH h AS (
    SELECT *
    FROM jsonb_to_recordset(%(outcomes)s::jsonb) AS h(
        job_id uuid, generation bigint, kind text, error_code text, error_message text,
        traceback text, delay_seconds double precision, result jsonb, progress jsonb)
), decided AS (
    SELECT h.job_id, h.kind, h.error_code, h.error_message, h.traceback, h.delay_seconds,
           h.result, h.progress, j.queue, j.tenant, j.priority, j.attempt_count AS attempt,
           j.lease_generation, j.lease_owner AS worker, j.run_after AS ready_at, j.started_at,
           j.holds_slot AS held_slot,
           CASE
               WHEN h.kind = 'succeeded' THEN 'SUCCEEDED'
               WHEN h.kind = 'cancelled' THEN 'CANCELLED'
               WHEN h.kind = 'failed' THEN 'FAILED'
               WHEN j.state = 'CANCEL_REQUESTED' THEN 'CANCELLED'
               WHEN h.kind = 'snoozed' THEN 'QUEUED'
               WHEN j.attempt_count >= {BUDGET} THEN 'FAILED'
               ELSE 'RETRY_WAIT'
           END AS state
    FROM h JOIN jobs AS j ON {FENCE}{only_fit}
    ORDER BY j.job_id
    FOR NO KEY UPDATE OF j {lock}
), finished AS (
    UPDATE jobs AS j
    SET state = d.state,
        -- a snooze gives back the attempt its claim counted, as a give-back does
        attempt_count = CASE WHEN d.state = 'QUEUED' THEN j.attempt_count - 1
                             ELSE j.attempt_count END,
        run_after = CASE WHEN d.state IN ({CLAIMABLE_SQL})
                         THEN now() + make_interval(secs => d.delay_seconds)
                         ELSE j.run_after END,
        lease_owner = NULL,
        lease_expires_at = NULL,
        holds_slot = false,{released}
        -- a snooze is no error: the job's last error stays (its history row says it)
        -- a snooze is no error, even one that a cancel request turned into CANCELLED
        last_error_code = CASE WHEN d.kind = 'snoozed' THEN j.last_error_code
                               ELSE COALESCE(d.error_code, j.last_error_code) END,
        last_error_message = CASE WHEN d.error_code IS NULL OR d.kind = 'snoozed'
                                  THEN j.last_error_message ELSE d.error_message END,
        -- why it waits, for explain, until a claim takes it or turns it down
        delay_reason = CASE WHEN d.state = 'QUEUED' THEN '{DelayReason.SNOOZED}'
                            ELSE j.delay_reason END,
        delay_since = CASE WHEN d.state = 'QUEUED' THEN now() ELSE j.delay_since END,
        result = CASE WHEN d.state = 'SUCCEEDED' THEN d.result ELSE j.result END,
        progress = COALESCE(d.progress, j.progress),
        progress_at = CASE WHEN d.progress IS NULL THEN j.progress_at
                           ELSE statement_timestamp() END,
        finished_at = CASE WHEN d.state IN ({CLAIMABLE_SQL}) THEN NULL
                           ELSE statement_timestamp() END,
        updated_at = now()
    FROM decided AS d
    WHERE j.job_id = d.job_id
    RETURNING d.job_id, d.state, d.queue, d.tenant, d.priority, j.run_after, d.attempt,
              d.lease_generation, d.worker, d.ready_at, d.started_at, d.held_slot,
              d.error_code, d.error_message, d.traceback
), {lease_ended("finished", gates=held)}, unfinished AS (
    -- the handles not applied, the only ones looked up again (as a plain join the
    -- plan read every handle's row once more, after the statement had them all)
    SELECT * FROM h WHERE h.job_id NOT IN (SELECT job_id FROM finished)
)
SELECT job_id, state FROM finished
UNION ALL
SELECT h.job_id, {left}
FROM unfinished AS h JOIN jobs AS j ON {fence("unfinished")}
"""


JOB_FINISH_MANY: Final = job_finish_many()

# The same for the outcomes of leases that hold no key and no resource (most): the
# others come back 'full', untouched, for a statement composed of what they hold.
JOB_FINISH_PLAIN_MANY: Final = job_finish_many(())

# The same, from inside the job's own transaction (job.transaction()), which waits
# for a row lock rather than skip it: it cannot be retried alone later.
JOB_FINISH_MANY_IN_TX: Final = job_finish_many(in_tx=True)

# Whether this worker's outcomes were recorded after all: used when a commit failed
# ambiguously (the connection dropped during COMMIT) and the retried statement then
# matched nothing, to tell "already applied" from "stale". The sweeper also writes
# rows under the worker's name, for leases that expired; those do not count.
JOB_ATTEMPT_RECORDED_MANY: Final = """
SELECT a.job_id
FROM jsonb_to_recordset(%(jobs)s::jsonb) AS h(job_id uuid, generation bigint)
JOIN job_attempts AS a ON a.job_id = h.job_id AND a.lease_generation = h.generation
WHERE a.worker = %(worker)s AND a.error_code IS DISTINCT FROM 'LEASE_EXPIRED'
"""

# outbox.explain's SNOOZED: how many times the job was snoozed, from its history (a
# range of its primary key), counted up to %(limit)s.
JOB_SNOOZES: Final = """
SELECT count(*)::int
FROM (SELECT 1 FROM job_attempts
      WHERE job_id = %(job_id)s AND outcome = 'QUEUED' AND error_code = 'SNOOZED'
      LIMIT %(limit)s) AS s
"""

# A graceful stop gives back the claims whose handlers did not finish in time:
# RUNNING goes back to QUEUED with its attempt refunded (a routine deploy must not
# burn attempts) and a fresh wake-up; CANCEL_REQUESTED becomes CANCELLED, since
# nobody wants it run again. Either way the attempt gets its history row (outcome
# QUEUED for a refunded one) and the slot is released. Fenced like every worker write.
# Returns the given-back ones' new states, and 'LOCKED' for a lease still ours whose
# row another transaction holds right now (a heartbeat, a cancel request, the
# sweeper: try it again in a moment). A stale one (generation or owner no longer
# match) matches no row, changes nothing and is absent.
JOB_GIVE_BACK_MANY: Final = f"""
WITH h AS (
    SELECT * FROM jsonb_to_recordset(%(jobs)s::jsonb) AS h(job_id uuid, generation bigint)
), giving AS (
    SELECT h.job_id, j.queue, j.tenant, j.priority, j.attempt_count AS attempt,
           j.lease_generation, j.lease_owner AS worker, j.run_after AS ready_at, j.started_at,
           j.holds_slot AS held_slot,
           CASE WHEN j.state = 'RUNNING' THEN 'QUEUED' ELSE 'CANCELLED' END AS state
    FROM h JOIN jobs AS j ON {FENCE}
    ORDER BY j.job_id
    FOR NO KEY UPDATE OF j SKIP LOCKED
), returned AS (
    UPDATE jobs AS j
    SET state = g.state,
        attempt_count = CASE WHEN g.state = 'QUEUED' THEN j.attempt_count - 1
                             ELSE j.attempt_count END,
        run_after = now(),
        lease_owner = NULL,
        lease_expires_at = NULL,
        holds_slot = false,
        limit_held = false,
        queue_limit_held = false,
        finished_at = CASE WHEN g.state = 'QUEUED' THEN NULL ELSE statement_timestamp() END,
        updated_at = now()
    FROM giving AS g
    WHERE j.job_id = g.job_id
    RETURNING g.job_id, g.state, g.queue, g.tenant, g.priority, j.run_after, g.attempt,
              g.lease_generation, g.worker, g.ready_at, g.started_at, g.held_slot,
              'SHUTDOWN'::text AS error_code,
              CASE WHEN g.state = 'QUEUED'
                   THEN 'given back as its worker stopped; the attempt was refunded'
                   ELSE 'the worker stopped while a cancel was requested' END AS error_message,
              NULL::text AS traceback
), {lease_ended("returned")}, unreturned AS (
    SELECT * FROM h WHERE h.job_id NOT IN (SELECT job_id FROM returned)
)
SELECT job_id, state FROM returned
UNION ALL
SELECT h.job_id, 'LOCKED'
FROM unreturned AS h JOIN jobs AS j ON {fence("unreturned")}
"""

# The sweeper: leases that expired without a report. A crashed or frozen worker
# looks exactly like this. RUNNING becomes RETRY_WAIT after the handler's backoff
# (fixed at claim in expiry_backoff), like any failed attempt, so a job that kills
# its worker does not take the next one down at once; or FAILED once the attempts
# are spent (counted at claim, so such a job still stops); CANCEL_REQUESTED becomes
# CANCELLED. The lost attempt gets what every end of a lease gets (lease_ended).
# SKIP LOCKED passes over a row whose worker is heartbeating it right now. The
# worker is noted as having let a lease lapse: not live (LIVE_WORKER) until it is
# heard from again, so its free slots draw no wake-ups meanwhile. A workers row
# another transaction holds is skipped too: its worker writing it now is alive, and
# the relay's expiry of silent workers deletes them in an order of its own.
JOB_SWEEP_EXPIRED: Final = f"""
WITH expired AS (
    SELECT j.job_id, j.queue, j.tenant, j.priority, j.attempt_count AS attempt,
           j.lease_generation, j.lease_owner AS worker, j.run_after AS ready_at, j.started_at,
           j.holds_slot AS held_slot,
           COALESCE(j.expiry_backoff, %(default_backoff)s) AS backoff,
           CASE
               WHEN j.state = 'CANCEL_REQUESTED' THEN 'CANCELLED'
               WHEN j.attempt_count >= {BUDGET} THEN 'FAILED'
               ELSE 'RETRY_WAIT'
           END AS state
    FROM jobs AS j
    WHERE j.state IN ({LEASED_SQL}) AND j.lease_expires_at <= now()
    ORDER BY j.lease_expires_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), swept AS (
    UPDATE jobs AS j
    SET state = e.state,
        -- counted from the attempt's recorded end (the history's finished_at, the
        -- statement's time): the sweep's transaction may have begun earlier, and
        -- from now() the retry came that much before its whole backoff was over
        run_after = CASE WHEN e.state = 'RETRY_WAIT'
                         THEN statement_timestamp() + make_interval(secs => e.backoff)
                         ELSE j.run_after END,
        lease_owner = NULL,
        lease_expires_at = NULL,
        holds_slot = false,
        limit_held = false,
        queue_limit_held = false,
        last_error_code = 'LEASE_EXPIRED',
        last_error_message = 'the lease of ' || e.worker || ' expired without a report',
        finished_at = CASE WHEN e.state = 'RETRY_WAIT' THEN NULL ELSE statement_timestamp() END,
        updated_at = now()
    FROM expired AS e
    WHERE j.job_id = e.job_id
    RETURNING e.job_id, e.state, e.queue, e.tenant, e.priority, j.run_after, e.attempt,
              e.lease_generation, e.worker, e.ready_at, e.started_at, e.held_slot,
              'LEASE_EXPIRED'::text AS error_code, j.last_error_message AS error_message,
              NULL::text AS traceback
), {lease_ended("swept", expired=True)}, lapsed AS (
    UPDATE workers AS w SET lease_lapsed_at = now()
    WHERE w.worker_id IN (SELECT x.worker_id FROM workers AS x
                          WHERE x.worker_id IN (SELECT worker FROM swept)
                          FOR NO KEY UPDATE SKIP LOCKED)
)
SELECT job_id, state, worker, run_after FROM swept
"""
