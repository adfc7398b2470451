"""A lease's life: the claim that starts it, the heartbeat that extends it, and every
statement that ends it (the holder's outcome, a give-back at a graceful stop, the
sweeper). Each one that ends a lease carries :func:`~schema.queries.fragments.lease_ended`."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.queries.fragments import (
    BUDGET,
    FENCE,
    KEY_AHEAD,
    LIVE_WORKER,
    REFUSAL_BACKSTOP_SECONDS,
    WAITING_BY_ID,
    key_wake_next,
    lease_ended,
)
from hybrid_jobs.schema.states import DelayReason
from hybrid_jobs.schema.tables import LEASED_SQL, TERMINAL_SQL

# What this worker can run, as the consumer binds it: its handlers' types, with their
# budget, backoff, kind (a plain function needs a thread) and rate limit.
_HANDLERS: Final = """types AS (
    -- 1a. what this worker can run: its handlers, with their budget and backoff
    SELECT *
    FROM jsonb_to_recordset(%(types)s::jsonb) AS t(
        job_type text, max_attempts int, backoff_base double precision,
        backoff_cap double precision, backoff_jitter double precision, sync boolean,
        rate_limit text)
)"""


def _claimed(admitted: str) -> str:
    """Step 4 of both claims: the jobs of ``admitted`` (job_id, holds) made RUNNING
    under this worker's lease, the next generation, one more attempt."""
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
        holds_slot = a.holds,
        delay_reason = NULL,
        delay_since = NULL,
        started_at = now(),
        updated_at = now()
    FROM {admitted} AS a, types AS t
    WHERE j.job_id = a.job_id AND t.job_type = j.job_type
    RETURNING j.job_id, j.job_type, j.queue, j.tenant, j.payload, j.attempt_count,
              j.max_attempts, j.lease_generation, j.created_at, j.scheduled_for,
              j.trace_context
)"""


def _tenant_slots(runnable: str) -> str:
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


def _slots_taken(admitted: str) -> str:
    """Step 2c of both claims: the slots of ``admitted`` (tenant, holds) taken."""
    return f"""reserved AS (
    -- 2c. their slots taken, in this same statement
    UPDATE tenant_usage AS u
    SET running = u.running + a.slots, claimed = u.claimed + a.taken
    FROM (SELECT a.tenant, count(*) FILTER (WHERE a.holds) AS slots, count(*) AS taken
          FROM {admitted} AS a JOIN usage AS s USING (tenant) GROUP BY a.tenant) AS a
    WHERE u.tenant = a.tenant
)"""


# Refusals for want of a consumer that could take the job: one with its handler
# (NO_HANDLER), or one naming its dedicated tenant (NO_AUTHORIZED_RUNNER). Their
# wake-ups go only where such a consumer has room.
_WANTING_RUNNER: Final = f"'{DelayReason.NO_HANDLER}', '{DelayReason.NO_AUTHORIZED_RUNNER}'"

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
JOB_CLAIM_MANY: Final = f"""
WITH {_HANDLERS}, locked AS (
    -- 1b. the named jobs of this worker's queues that may be claimed now, locked
    -- (others' rows skipped)
    SELECT j.job_id, j.queue, j.tenant, j.job_type, j.priority, j.delay_reason, j.delay_since,
           j.key, j.key_limit, j.key_seq, j.resource, j.lease_generation,
           t.job_type IS NOT NULL AS known,
           COALESCE(j.expires_at <= now(), false) AS expired,
           COALESCE(j.rate_limit, t.rate_limit) AS rate_name,
           COALESCE(t.sync, false) AS sync,
           EXISTS (SELECT 1 FROM queues AS q WHERE q.queue = j.queue AND q.paused) AS paused,
           -- a dedicated tenant (tenant_limits.runners) this worker does not name
           -- (%(tenants)s, consumer --tenant): its jobs are not this worker's to take.
           -- One probe of the tenant's row per job, however many tenants are dedicated.
           COALESCE(EXISTS (SELECT 1 FROM tenant_limits AS d
                            WHERE d.tenant = j.tenant AND d.runners = 'dedicated'
                              AND d.tenant <> ALL(%(tenants)s::text[])), false) AS unauthorized
    FROM jobs AS j LEFT JOIN types AS t ON t.job_type = j.job_type
    -- (the ids through a sub-select, as in JOB_CLAIM_PLAIN_MANY: on a table never
    -- analyzed, a plan made for the values took a scan of every job over 25 lookups)
    WHERE j.job_id = ANY((SELECT %(job_ids)s::uuid[])::uuid[])
      AND j.queue = ANY(%(queues)s::text[])
      AND {WAITING_BY_ID}
      AND j.run_after <= now()
      AND (j.max_attempts IS NULL OR j.attempt_count < j.max_attempts)
    ORDER BY j.job_id
    FOR NO KEY UPDATE OF j SKIP LOCKED
), runnable AS (
    -- 1c. of those, the ones with a handler, an unpaused queue, a tenant this worker
    -- may serve and, for a plain function, a free thread
    SELECT r.*
    FROM (SELECT l.*, row_number() OVER (PARTITION BY l.sync ORDER BY l.priority DESC, l.job_id)
                 AS thread_rank
          FROM locked AS l
          WHERE l.known AND NOT l.paused AND NOT l.expired AND NOT l.unauthorized) AS r
    WHERE NOT r.sync OR r.thread_rank <= %(free_threads)s
), key_behind AS (
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
), rate_wanted AS (
    -- 1d. each runnable job under a rate limit: its bucket (its own name) and the limit
    -- that governs it, the name's own or else the longest 'prefix:*' that covers it,
    -- and its turn for a token (rate_limits is the operator's short list).
    SELECT r.job_id, r.rate_name AS bucket, m.rate / m.per_seconds AS per_second, m.burst,
           row_number() OVER (PARTITION BY r.rate_name ORDER BY r.priority DESC, r.job_id)
               AS token_rank
    FROM runnable AS r
    CROSS JOIN LATERAL (
        SELECT x.rate, x.per_seconds, x.burst
        FROM rate_limits AS x
        WHERE x.name = r.rate_name
           OR (right(x.name, 2) = ':*' AND starts_with(r.rate_name, left(x.name, -1)))
        ORDER BY x.name = r.rate_name DESC, length(x.name) DESC
        LIMIT 1
    ) AS m
    WHERE r.rate_name IS NOT NULL
      -- one waiting for its key takes no token
      AND r.job_id NOT IN (SELECT job_id FROM key_waiting)
), rate_level AS MATERIALIZED (
    -- 1e. their buckets, locked in bucket order before anything else is (as a claim
    -- always takes them), at their latest version (committed or not yet seen by this
    -- snapshot): the level refilled at per_second since refilled_at, up to the burst,
    -- as of now(), and the whole tokens it holds. Nothing is taken here: a token goes
    -- only to a job every gate admits (rate_spent). A bucket this snapshot does not
    -- show has no row here: its jobs wait for the next claim, which finds it
    -- (rate_created makes it, full).
    SELECT b.name, w.per_second, w.burst, e.elapsed, a.level,
           floor(GREATEST(0, a.level))::int AS whole
    FROM rate_buckets AS b
    JOIN (SELECT bucket, max(per_second) AS per_second, max(burst) AS burst
          FROM rate_wanted GROUP BY bucket) AS w ON w.bucket = b.name
    CROSS JOIN LATERAL (
        SELECT EXTRACT(EPOCH FROM now() - b.refilled_at)::float8 AS elapsed) AS e
    CROSS JOIN LATERAL (
        SELECT LEAST(w.burst, b.tokens + w.per_second * e.elapsed) AS level) AS a
    ORDER BY b.name
    FOR UPDATE OF b
), rate_refused AS (
    -- 1f. the jobs past their bucket's whole tokens, in their turn: no token for them
    -- in this claim (a job ahead that another gate turns down leaves its token in the
    -- bucket, untaken). One whose bucket is unseen is not turned down, only not
    -- taken: it comes back 'locked', for the worker to try again in a moment.
    SELECT w.job_id, w.bucket, w.per_second,
           w.token_rank - COALESCE(l.whole, 0) AS short_by, l.name IS NULL AS unseen
    FROM rate_wanted AS w LEFT JOIN rate_level AS l ON l.name = w.bucket
    WHERE w.token_rank > COALESCE(l.whole, 0)
), rated AS (
    -- 1g. the runnable jobs with a token to have, or under no limit
    SELECT r.* FROM runnable AS r WHERE r.job_id NOT IN (SELECT job_id FROM rate_refused)
), {_tenant_slots("rated")}, admitted AS (
    -- 2b. the runnable jobs not waiting for their key that fit their tenant's free
    -- slots, by priority
    SELECT a.job_id, a.tenant, u.free IS NOT NULL AS holds, a.key, a.key_limit, a.resource,
           a.lease_generation, a.priority
    FROM (SELECT r.*, row_number() OVER (PARTITION BY r.tenant ORDER BY r.priority DESC, r.job_id)
                 AS slot_rank
          FROM rated AS r WHERE r.job_id NOT IN (SELECT job_id FROM key_waiting)) AS a
    LEFT JOIN usage AS u ON u.tenant = a.tenant
    WHERE u.free IS NULL OR a.slot_rank <= u.free
), key_wanted AS (
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
), resource_ranked AS (
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
), {_slots_taken("resource_admitted")}, rate_spent AS MATERIALIZED (
    -- 2d. the tokens of the jobs every gate admitted, taken from the buckets locked
    -- in 1e: tokens spent are starts. A claim whose now() is earlier than the
    -- bucket's time (a claim that began later wrote it first) finds the level less
    -- the refill between the two and leaves the bucket's time as it was: the
    -- bucket's level at its time is the least slack of every window ending then, so
    -- the starts stay within burst + rate x t in every window of the claims' own
    -- clock. taken is what this claim took.
    SELECT l.name, l.per_second, l.level - COALESCE(n.n, 0) AS left_tokens,
           COALESCE(n.n, 0) AS n, l.elapsed
    FROM rate_level AS l
    LEFT JOIN (SELECT w.bucket, count(*)::int AS n
               FROM rate_wanted AS w JOIN resource_admitted AS a USING (job_id)
               GROUP BY w.bucket) AS n ON n.bucket = l.name
), rate_taken AS (
    UPDATE rate_buckets AS b
    SET tokens = s.left_tokens + s.per_second * GREATEST(0, -s.elapsed), taken = s.n,
        refilled_at = GREATEST(b.refilled_at, now())
    FROM rate_spent AS s
    WHERE b.name = s.name AND s.n > 0
), rate_created AS (
    -- 2e. a bucket first used (a 'prefix:*''s name; RATE_LIMIT_SET makes an exact
    -- name's): made full, for the next claim, after every other gate's lock, as the
    -- last thing this claim takes
    INSERT INTO rate_buckets (name, tokens, taken, refilled_at)
    SELECT r.bucket, max(w.burst), 0, now()
    FROM rate_refused AS r JOIN rate_wanted AS w USING (job_id)
    WHERE r.unseen
    GROUP BY r.bucket
    ORDER BY r.bucket
    ON CONFLICT (name) DO NOTHING
), refused AS (
    -- 3a. the jobs turned down, and why (deadline passed, paused queue, no handler,
    -- no token, key, tenant's cap)
    SELECT l.job_id, l.queue, l.tenant, l.priority, l.job_type, l.rate_name,
           CASE WHEN l.expired THEN 'EXPIRED'
                WHEN l.paused THEN '{DelayReason.QUEUE_PAUSED}'
                WHEN l.unauthorized THEN '{DelayReason.NO_AUTHORIZED_RUNNER}'
                WHEN NOT l.known THEN '{DelayReason.NO_HANDLER}'
                WHEN l.job_id IN (SELECT job_id FROM rate_refused)
                THEN '{DelayReason.RATE_LIMITED}'
                WHEN l.job_id IN (SELECT job_id FROM key_behind) THEN '{DelayReason.KEY_ORDER}'
                -- its resource held (by this batch's first, or a lease): uncertain
                -- when its hold says so, as far as this snapshot sees it
                WHEN l.resource IS NOT NULL AND l.job_id IN (SELECT job_id FROM key_admitted)
                THEN CASE WHEN EXISTS (SELECT 1 FROM resource_holds AS x
                                       WHERE x.resource = l.resource
                                         AND x.uncertain_since IS NOT NULL)
                          THEN '{DelayReason.RESOURCE_UNCERTAIN}'
                          ELSE '{DelayReason.RESOURCE_BUSY}' END
                WHEN l.job_id IN (SELECT job_id FROM key_waiting)
                     OR l.job_id IN (SELECT job_id FROM admitted) THEN '{DelayReason.KEY_BUSY}'
                ELSE '{DelayReason.TENANT_CAP}' END AS reason,
           -- turned down for want of a handler (or of a runner naming its tenant) less
           -- than a second ago already
           COALESCE(l.delay_reason IN ({_WANTING_RUNNER})
                    AND l.delay_since > now() - interval '1 second', false) AS refused_lately
    FROM locked AS l
    WHERE l.job_id NOT IN (SELECT job_id FROM resource_admitted)
      AND l.job_id NOT IN (SELECT job_id FROM rate_refused WHERE unseen)
      AND (l.expired OR l.paused OR l.unauthorized OR NOT l.known
           OR l.job_id IN (SELECT job_id FROM runnable))
), noted AS (
    -- 3b. the reason recorded on the job. delay_since is when a consumer last
    -- turned it down: it marks the wake-up used (see UNTAKEN), so it moves on every
    -- refusal, which is rare (the relay wakes a job only when it can run).
    UPDATE jobs AS j SET delay_reason = r.reason, delay_since = now(), updated_at = now(),
        -- the handler's rate limit, for explain to name
        rate_limit = CASE WHEN r.reason = '{DelayReason.RATE_LIMITED}' THEN r.rate_name
                          ELSE j.rate_limit END
    FROM refused AS r
    WHERE j.job_id = r.job_id AND r.reason <> 'EXPIRED'
), expired_ended AS (
    -- 3g. past its deadline: never started, it ends here (it holds no slot while it
    -- waits), and its pending wake-ups go; the used one goes with used_up.
    UPDATE jobs AS j
    SET state = 'CANCELLED', last_error_code = 'EXPIRED',
        last_error_message = 'not started by its deadline, ' || j.expires_at::text,
        delay_reason = NULL, delay_since = NULL,
        finished_at = statement_timestamp(), updated_at = now()
    FROM refused AS r
    WHERE j.job_id = r.job_id AND r.reason = 'EXPIRED'
    RETURNING j.job_id
), {key_wake_next("expired_ended")}, expired_unwoken AS (
    -- 3h. its pending wake-ups deleted
    DELETE FROM outbox AS o
    WHERE EXISTS (SELECT 1 FROM refused WHERE reason = 'EXPIRED')
      AND o.job_id = ANY(ARRAY(SELECT job_id FROM refused WHERE reason = 'EXPIRED'))
      AND o.sent_at IS NULL
), used_up AS (
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
           CASE WHEN r.reason = '{DelayReason.RATE_LIMITED}'
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
), {_claimed("resource_admitted")}
-- 5. one row per requested id: the claimed job, or why it was not claimed
SELECT 'claimed' AS status, c.* FROM claimed AS c
UNION ALL
SELECT CASE
           WHEN j.job_id IS NULL THEN 'missing'
           WHEN j.queue <> ALL(%(queues)s::text[]) THEN 'other_queue'
           WHEN r.reason IS NOT NULL THEN r.reason
           -- its rate limit's bucket made by this claim, for the next
           WHEN l.job_id IN (SELECT job_id FROM rate_refused WHERE unseen) THEN 'locked'
           WHEN l.job_id IS NOT NULL THEN 'no_thread'
           -- this worker's already: a claim of it that committed, whose answer was lost
           WHEN j.state IN ({LEASED_SQL}) AND j.lease_owner = %(worker)s THEN 'held_here'
           WHEN j.state IN ({LEASED_SQL}) THEN 'running'
           WHEN j.state IN ({TERMINAL_SQL}) THEN 'finished'
           WHEN j.run_after > now() THEN 'early'
           WHEN j.max_attempts IS NOT NULL AND j.attempt_count >= j.max_attempts THEN 'exhausted'
           ELSE 'locked'
       END,
       ids.job_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM unnest(%(job_ids)s::uuid[]) AS ids(job_id)
LEFT JOIN jobs AS j ON j.job_id = ids.job_id
LEFT JOIN refused AS r ON r.job_id = ids.job_id
LEFT JOIN locked AS l ON l.job_id = ids.job_id
WHERE ids.job_id NOT IN (SELECT job_id FROM claimed)
"""

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
      AND NOT EXISTS (SELECT 1 FROM queues AS q WHERE q.queue = j.queue AND q.paused)
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
), {_tenant_slots("runnable")}, admitted AS (
    -- 2b. the runnable jobs that fit their tenant's free slots, by priority
    SELECT a.job_id, a.tenant, u.free IS NOT NULL AS holds
    FROM (SELECT r.*, row_number() OVER (PARTITION BY r.tenant ORDER BY r.priority DESC, r.job_id)
                 AS slot_rank
          FROM runnable AS r) AS a
    LEFT JOIN usage AS u ON u.tenant = a.tenant
    WHERE u.free IS NULL OR a.slot_rank <= u.free
), {_slots_taken("admitted")}, {_claimed("admitted")}
-- 5. one row per requested id: the claimed job, or 'full' for JOB_CLAIM_MANY to decide
SELECT 'claimed' AS status, c.* FROM claimed AS c
UNION ALL
SELECT 'full', ids.job_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM unnest(%(job_ids)s::uuid[]) AS ids(job_id)
WHERE ids.job_id NOT IN (SELECT job_id FROM claimed)
"""

# After a claim whose commit was ambiguous (the connection dropped while it ran): the
# named jobs this worker holds. Worker ids are unique per process, so a job held
# under ours that the process does not know about came from that claim.
JOB_HELD_BY: Final = f"""
SELECT 'claimed', job_id, job_type, queue, tenant, payload, attempt_count, max_attempts,
       lease_generation, created_at, scheduled_for, trace_context
FROM jobs
WHERE job_id = ANY(%(job_ids)s::uuid[]) AND lease_owner = %(worker)s AND state IN ({LEASED_SQL})
"""

# Extends the leases this worker holds, through the fence and only while they have
# not expired (once expired the sweeper may have moved the job on; a late heartbeat
# must not revive it). One row per handle: the renewed job's state (so the worker
# sees CANCEL_REQUESTED), 'LOCKED' for a lease still ours whose row another
# transaction holds (try again alone), or NULL for a lease that is gone.
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
    RETURNING j.job_id, j.state
)
SELECT h.job_id,
       COALESCE(r.state, CASE WHEN j.lease_expires_at > now() THEN 'LOCKED' END)
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
# The new state is decided on the locked row, so a concurrent cancel request is seen.
# Returns the applied ones' new states, and 'LOCKED' for outcomes whose row another
# transaction holds (still ours: try again alone). A stale outcome (generation or
# owner no longer match) matches no row, changes nothing and is absent.
def _finish(lock: str, *, plain: bool = False) -> str:
    # The plain outcome takes only leases that hold no key and no resource (the
    # rest come back 'full', for the whole statement), and ends them without the
    # steps that would find nothing to release.
    holds_nothing = "j.key IS NULL AND j.resource IS NULL"
    only_plain = f"\n    WHERE {holds_nothing}" if plain else ""
    left = f"CASE WHEN {holds_nothing} THEN 'LOCKED' ELSE 'full' END" if plain else "'LOCKED'"
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
               WHEN j.attempt_count >= {BUDGET} THEN 'FAILED'
               ELSE 'RETRY_WAIT'
           END AS state
    FROM h JOIN jobs AS j ON {FENCE}{only_plain}
    ORDER BY j.job_id
    FOR NO KEY UPDATE OF j {lock}
), finished AS (
    UPDATE jobs AS j
    SET state = d.state,
        run_after = CASE WHEN d.state = 'RETRY_WAIT'
                         THEN now() + make_interval(secs => d.delay_seconds)
                         ELSE j.run_after END,
        lease_owner = NULL,
        lease_expires_at = NULL,
        holds_slot = false,
        last_error_code = COALESCE(d.error_code, j.last_error_code),
        last_error_message = CASE WHEN d.error_code IS NULL THEN j.last_error_message
                                  ELSE d.error_message END,
        result = CASE WHEN d.state = 'SUCCEEDED' THEN d.result ELSE j.result END,
        progress = COALESCE(d.progress, j.progress),
        progress_at = CASE WHEN d.progress IS NULL THEN j.progress_at
                           ELSE statement_timestamp() END,
        finished_at = CASE WHEN d.state = 'RETRY_WAIT' THEN NULL ELSE statement_timestamp() END,
        updated_at = now()
    FROM decided AS d
    WHERE j.job_id = d.job_id
    RETURNING d.job_id, d.state, d.queue, d.tenant, d.priority, j.run_after, d.attempt,
              d.lease_generation, d.worker, d.ready_at, d.started_at, d.held_slot,
              d.error_code, d.error_message, d.traceback
), {lease_ended("finished", plain=plain)}
SELECT job_id, state FROM finished
UNION ALL
SELECT h.job_id, {left}
FROM h JOIN jobs AS j ON {FENCE}
WHERE h.job_id NOT IN (SELECT job_id FROM finished)
"""


JOB_FINISH_MANY: Final = _finish("SKIP LOCKED")

# The same for the outcomes of leases that hold no key and no resource (most): the
# others come back 'full', untouched, for JOB_FINISH_MANY.
JOB_FINISH_PLAIN_MANY: Final = _finish("SKIP LOCKED", plain=True)

# The same, from inside the job's own transaction (job.transaction()), which waits
# for a row lock rather than skip it: it cannot be retried alone later.
JOB_FINISH_MANY_IN_TX: Final = _finish("")

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
        finished_at = CASE WHEN g.state = 'QUEUED' THEN NULL ELSE statement_timestamp() END,
        updated_at = now()
    FROM giving AS g
    WHERE j.job_id = g.job_id
    RETURNING g.job_id, g.state, g.queue, g.tenant, g.priority, j.run_after, g.attempt,
              g.lease_generation, g.worker, g.ready_at, g.started_at, g.held_slot,
              'SHUTDOWN'::text AS error_code,
              CASE WHEN g.state = 'QUEUED'
                   THEN 'given back at a graceful stop; the attempt was refunded'
                   ELSE 'the worker stopped while a cancel was requested' END AS error_message,
              NULL::text AS traceback
), {lease_ended("returned")}
SELECT job_id, state FROM returned
UNION ALL
SELECT h.job_id, 'LOCKED'
FROM h JOIN jobs AS j ON {FENCE}
WHERE h.job_id NOT IN (SELECT job_id FROM returned)
"""

# The sweeper: leases that expired without a report. A crashed or frozen worker
# looks exactly like this. RUNNING becomes RETRY_WAIT after the handler's backoff
# (fixed at claim in expiry_backoff), like any failed attempt, so a job that kills
# its worker does not take the next one down at once; or FAILED once the attempts
# are spent (counted at claim, so such a job still stops); CANCEL_REQUESTED becomes
# CANCELLED. The lost attempt gets what every end of a lease gets (lease_ended).
# SKIP LOCKED passes over a row whose worker is heartbeating it right now.
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
        run_after = CASE WHEN e.state = 'RETRY_WAIT'
                         THEN now() + make_interval(secs => e.backoff) ELSE j.run_after END,
        lease_owner = NULL,
        lease_expires_at = NULL,
        holds_slot = false,
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
), {lease_ended("swept", expired=True)}
SELECT job_id, state, worker, run_after FROM swept
"""
