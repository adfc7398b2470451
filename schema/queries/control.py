"""The operator's actions, through the caller's transaction like the producer's
(replay, pause, resume); the reads behind "why is my job waiting?"; and the relay's
retention chore. Each read is index lookups bounded by the backlog, never by the
history; bench/control_plans.py shows the plans on a table of many finished jobs."""

from __future__ import annotations

from typing import Final

from hybrid_jobs import defaults
from hybrid_jobs.schema.queries.fragments import (
    KEY_AHEAD,
    LIVE_WORKER,
    PENDING_TENANTS,
    UNTAKEN,
    WHO,
    key_wake_next,
    resource_wake_next,
    turns_passed_on_at_pause,
)
from hybrid_jobs.schema.queries.policy import forbids
from hybrid_jobs.schema.queries.worker import RELAY_LIVE_SECONDS
from hybrid_jobs.schema.states import DelayReason
from hybrid_jobs.schema.tables import (
    APPROVAL_HOLD,
    CLAIMABLE_SQL,
    LEASED_SQL,
    OUTBOX_CHANNEL,
    REPLAYABLE_SQL,
    TERMINAL_SQL,
    channel_sql,
)

_WHO = WHO

# The size of a failed or cancelled job's own attempt budget: its max_attempts less
# the attempts it had made before its latest replay (its first run: all of them).
# NULL for a job no handler ever claimed: the handler's budget applies at claim.
# (GREATEST would skip a NULL, hence the CASE.)
_OWN_BUDGET = """CASE WHEN j.max_attempts IS NOT NULL THEN GREATEST(1, j.max_attempts - COALESCE(
    (SELECT r.attempts_before FROM job_replays AS r
     WHERE r.job_id = j.job_id ORDER BY r.id DESC LIMIT 1), 0)) END"""


def _replay(target: str, *, before: str = "", answer: str = "SELECT job_id FROM replayed") -> str:
    """Replays the jobs ``target`` selects and locks (job_id, state,
    attempt_count, budget, forced: whether the replay overrides the type's policy),
    each still FAILED or CANCELLED (``before``: CTEs the target reads from; ``answer``:
    what the statement returns, read from ``replayed``): back to QUEUED, due now
    (one that waited for approval, or was rejected, waits for approval again: held,
    without a wake-up),
    with a fresh budget of the job's own size on top of the attempts it made (so
    attempt_count <= max_attempts holds and the history keeps numbering on), what
    belonged to the finished run cleared (and the deadline of one that ended for it,
    CANCELLED with code EXPIRED), a wake-up (the outbox trigger notifies the
    relay at commit), and a job_replays row saying who asked, when, from what, and
    whether it overrode the policy."""
    return f"""
WITH RECURSIVE {before}target AS ({target}
), replayed AS (
    UPDATE jobs AS j
    SET state = 'QUEUED',
        max_attempts = j.attempt_count + t.budget,
        -- one whose parents have not all settled (cancelled with PARENT_FAILED, the
        -- parent not replayed yet, or replayed and not done) waits for them again
        run_after = CASE WHEN j.approval IN ('REQUIRED', 'REJECTED') OR j.parents_pending > 0
                         THEN {APPROVAL_HOLD} ELSE now() END,
        approval = CASE WHEN j.approval = 'REJECTED' THEN 'REQUIRED' ELSE j.approval END,
        approval_by = CASE WHEN j.approval = 'REJECTED' THEN NULL ELSE j.approval_by END,
        approval_at = CASE WHEN j.approval = 'REJECTED' THEN NULL ELSE j.approval_at END,
        finished_at = NULL,
        result = NULL,
        progress = NULL,
        progress_at = NULL,
        delay_reason = CASE WHEN j.parents_pending > 0 THEN '{DelayReason.DEPENDENCY}' END,
        delay_since = CASE WHEN j.parents_pending > 0 THEN now() END,
        cancel_requested_at = NULL,
        cancel_forced_at = NULL,
        cancel_override_by = NULL,
        -- a key held while waiting or active was freed when the job left its scope,
        -- and another job may hold it by now: the replayed one comes back without it
        -- (a period's key stays: its window is part of it, held whatever the state)
        unique_key = CASE WHEN j.unique_scope = 'period' THEN j.unique_key END,
        unique_scope = CASE WHEN j.unique_scope = 'period' THEN j.unique_scope END,
        -- one that ended for its deadline (CANCELLED, EXPIRED) runs without it: kept,
        -- the relay's next round would end it again, never started
        expires_at = CASE WHEN j.state = 'CANCELLED' AND j.last_error_code = 'EXPIRED'
                          THEN NULL ELSE j.expires_at END,
        updated_at = now()
    FROM target AS t
    -- The array hands the planner the ids as one pkey probe each; joined alone, it
    -- may read every failed job (jobs_unsuccessful_idx) to hash-join a few.
    WHERE j.job_id = ANY(ARRAY(SELECT job_id FROM target)) AND j.job_id = t.job_id
      AND j.state IN ({REPLAYABLE_SQL})
    RETURNING j.job_id, j.queue, j.tenant, j.priority, j.run_after,
              t.state AS from_state, t.attempt_count, j.approval, j.parents_pending, t.forced
), woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT job_id, queue, COALESCE(tenant, ''), priority, run_after FROM replayed
    WHERE approval IS DISTINCT FROM 'REQUIRED' AND parents_pending = 0
), recorded AS (
    INSERT INTO job_replays (job_id, replayed_by, from_state, attempts_before, forced)
    SELECT job_id, COALESCE(%(by)s::text, {_WHO}), from_state, attempt_count, forced
    FROM replayed
)
{answer}
"""


# One job, by id. It waits for a lock another transaction holds on the row (a
# worker's outcome, retention), then decides on what that left. A job whose type's
# policy forbids replay is left as it is, unless %(override)s (then recorded as
# forced); a type without a policy costs one probe of its primary key.
JOB_REPLAY: Final = _replay(f"""
    SELECT j.job_id, j.state, j.attempt_count, {_OWN_BUDGET} AS budget,
           %(override)s AND {forbids("replay")} AS forced
    FROM jobs AS j
    WHERE j.job_id = %(job_id)s AND j.state IN ({REPLAYABLE_SQL})
      AND (%(override)s OR NOT {forbids("replay")})
    FOR NO KEY UPDATE""")

# Failed and cancelled jobs matching the filters (NULL: any; `states` picks FAILED,
# CANCELLED or both), oldest finished first, at most `limit`. Everything is read from
# jobs_unsuccessful_idx (queue, finished_at), whose predicate is exactly this state
# list: the given queue, or the queues that have such jobs by a loose index scan; then
# each queue's oldest `limit` from its range of the index (finished_after narrows the
# range), merged. PostgreSQL may instead walk jobs_finished_idx in time order when
# failures are common enough that it meets `limit` of them soon
# (bench/control_plans.py shows both). Rows another transaction holds are skipped: the
# next call gets them.
# The types whose policy forbids replay are read once (a small table): their jobs
# are passed over, so `limit` counts jobs replayed, and counted (at most
# MAX_REPLAY_BATCH per queue) unless %(override)s, which replays them too, recorded
# as forced. With no such type the count reads nothing.
_UNSUCCESSFUL_QUEUE = f"SELECT j.queue FROM jobs AS j WHERE j.state IN ({REPLAYABLE_SQL})"
_MATCHES = f"""j.state IN ({REPLAYABLE_SQL}) AND j.queue = q.queue
          AND j.state = ANY(%(states)s::text[])
          AND (%(finished_after)s::timestamptz IS NULL
               OR j.finished_at > %(finished_after)s::timestamptz)
          AND (%(job_type)s::text IS NULL OR j.job_type = %(job_type)s::text)
          AND (%(error_code)s::text IS NULL OR j.last_error_code = %(error_code)s::text)"""
_FORBIDDEN_TYPE = "j.job_type = ANY((SELECT job_types FROM forbidding)::text[])"

JOB_REPLAY_MATCHING: Final = _replay(
    f"""
    SELECT j.job_id, j.state, j.attempt_count, {_OWN_BUDGET} AS budget,
           %(override)s AND {_FORBIDDEN_TYPE} AS forced
    FROM jobs AS j
    WHERE j.job_id = ANY(ARRAY(SELECT job_id FROM candidates)) AND j.state IN ({REPLAYABLE_SQL})
    FOR NO KEY UPDATE OF j SKIP LOCKED""",
    before=f"""forbidding AS (
    SELECT COALESCE(array_agg(job_type), '{{}}') AS job_types
    FROM job_type_policies WHERE NOT replay
), found AS (
    ({_UNSUCCESSFUL_QUEUE} AND %(queue)s::text IS NULL ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT ({_UNSUCCESSFUL_QUEUE} AND j.queue > f.queue ORDER BY j.queue LIMIT 1)
    FROM found AS f WHERE f.queue IS NOT NULL
), queues AS (
    SELECT %(queue)s::text AS queue WHERE %(queue)s::text IS NOT NULL
    UNION ALL
    SELECT queue FROM found WHERE queue IS NOT NULL
), candidates AS (
    SELECT c.job_id
    FROM queues AS q
    CROSS JOIN LATERAL (
        SELECT j.job_id, j.finished_at
        FROM jobs AS j
        WHERE {_MATCHES}
          AND (%(override)s OR NOT {_FORBIDDEN_TYPE})
        ORDER BY j.finished_at
        LIMIT %(limit)s
    ) AS c
    ORDER BY c.finished_at
    LIMIT %(limit)s
), refused AS (
    SELECT count(*) AS n
    FROM queues AS q
    CROSS JOIN LATERAL (
        SELECT 1 FROM jobs AS j
        WHERE {_MATCHES}
          AND {_FORBIDDEN_TYPE}
        LIMIT {defaults.MAX_REPLAY_BATCH}
    ) AS r
    WHERE NOT %(override)s AND cardinality((SELECT job_types FROM forbidding)) > 0
), """,
    answer="SELECT ARRAY(SELECT job_id FROM replayed), (SELECT n FROM refused)",
)

# An operator approves a job that waits for approval: due now, with its wake-up
# (the outbox trigger notifies the relay at commit), and who and when recorded,
# in one statement guarded by "still QUEUED and not decided yet". Returns nothing
# for a job that was not waiting for approval: the caller reads why.
JOB_APPROVE: Final = f"""
WITH approved AS (
    UPDATE jobs
    SET approval = 'APPROVED',
        approval_by = COALESCE(%(by)s::text, {_WHO}),
        approval_at = now(),
        run_after = now(),
        updated_at = now()
    WHERE job_id = %(job_id)s AND state = 'QUEUED' AND approval = 'REQUIRED'
    RETURNING job_id, queue, tenant, priority, run_after
), woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT job_id, queue, COALESCE(tenant, ''), priority, run_after FROM approved
)
SELECT job_id FROM approved
"""

# An operator rejects a job that waits for approval: CANCELLED, with last_error_code
# REJECTED and the reason, who and when; guarded like JOB_APPROVE. It never had a
# wake-up to take back; the next job of its key (in order) is woken by the trigger
# jobs_hand_on, as at every end of a waiting job.
JOB_REJECT: Final = f"""
WITH rejected AS (
    UPDATE jobs
    SET state = 'CANCELLED',
        approval = 'REJECTED',
        approval_by = COALESCE(%(by)s::text, {_WHO}),
        approval_at = now(),
        last_error_code = 'REJECTED',
        last_error_message = COALESCE(%(reason)s::text, 'rejected'),
        finished_at = statement_timestamp(),
        updated_at = now()
    WHERE job_id = %(job_id)s AND state = 'QUEUED' AND approval = 'REQUIRED'
    RETURNING job_id, state
)
SELECT state FROM rejected
"""

# Why an approval or rejection changed nothing: the job's state and approval.
JOB_APPROVAL: Final = """
SELECT state, approval, approval_by, approval_at FROM jobs WHERE job_id = %(job_id)s
"""

# An operator (or the application) edits a job that has not started: each field
# given (NULL: left as it is; a JSON null payload is 'null', not NULL) in one
# statement guarded by "still waiting". A claim holds the row while it starts the
# job, so the edit waits for it and then finds it RUNNING: one or the other wins,
# and the claim reads the old values or the new, never some of each. A new start
# (run_after, or delay_seconds from now) is refused for a job held for approval or
# for its parents (their end decides it), at or past its deadline, and replaces
# its wake-ups with one due then, carrying its priority, as a debounced enqueue
# does (JOB_DEBOUNCE_MANY): one sent already would find it not due and be
# settled, leaving it none. A job without a wake-up (waiting for its key or
# resource) gets one too: turned down again, it waits as before. A new priority
# alone moves its pending wake-ups' priority, which orders the relay's choice. A
# max_attempts at or below the attempts made is refused: the claim would never
# take the job again, nor anything end it. Returns nothing when it changed
# nothing: JOB_EDIT_REFUSAL reads why.
JOB_EDIT: Final = f"""
WITH given AS (
    SELECT COALESCE(%(run_after)s::timestamptz,
                    now() + make_interval(secs => %(delay_seconds)s::double precision))
           AS run_after
), edited AS (
    UPDATE jobs AS j
    SET payload = COALESCE(%(payload)s::jsonb, j.payload),
        priority = COALESCE(%(priority)s::smallint, j.priority),
        max_attempts = COALESCE(%(max_attempts)s::integer, j.max_attempts),
        run_after = COALESCE(g.run_after, j.run_after),
        -- a new start is why it waits now, not what turned it down before (its key,
        -- its resource, a snooze): explain reads it as scheduled until a claim says
        delay_reason = CASE WHEN g.run_after IS NULL THEN j.delay_reason END,
        delay_since = CASE WHEN g.run_after IS NULL THEN j.delay_since END,
        updated_at = now()
    FROM given AS g
    WHERE j.job_id = %(job_id)s AND j.state IN ({CLAIMABLE_SQL})
      AND (g.run_after IS NULL
           OR (j.approval IS DISTINCT FROM 'REQUIRED' AND j.parents_pending = 0
               AND (j.expires_at IS NULL OR g.run_after < j.expires_at)))
      AND (%(max_attempts)s::integer IS NULL OR j.attempt_count < %(max_attempts)s::integer)
      -- a job on a stored input runs on its content: a payload of its own would be
      -- written and never read
      AND (%(payload)s::jsonb IS NULL OR j.payload_ref IS NULL)
    RETURNING j.job_id, j.queue, j.tenant, j.priority, j.run_after,
              g.run_after IS NOT NULL AS moved
), unwoken AS (
    DELETE FROM outbox AS o USING edited AS e WHERE o.job_id = e.job_id AND e.moved
), woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT job_id, queue, COALESCE(tenant, ''), priority, run_after FROM edited WHERE moved
), reordered AS (
    UPDATE outbox AS o SET priority = e.priority
    FROM edited AS e
    WHERE o.job_id = e.job_id AND NOT e.moved AND o.sent_at IS NULL
      AND o.priority <> e.priority
)
SELECT job_id, run_after FROM edited
"""

# After an edit that moved a job's start into the future: the job a freed key or
# resource woke may have been this one, and the others it passed over got no
# wake-up back (KEY_BUSY, RESOURCE_BUSY). The turn goes on to the next due waiter,
# as it would had the job ended (jobs_hand_on): a key's if it has room, a
# resource's if no hold stands; one pending already is left as it is, and one woken
# for a gate that is taken meanwhile is turned down and waits, as before.
JOB_EDIT_HAND_ON: Final = f"""
WITH moved AS (
    SELECT job_id, key, resource FROM jobs
    WHERE job_id = %(job_id)s AND run_after > now()
      AND (key IS NOT NULL OR resource IS NOT NULL)
), roomy AS (
    SELECT m.job_id FROM moved AS m
    WHERE m.key IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM key_usage AS u WHERE u.key = m.key AND u.running >= u.key_limit)
), {key_wake_next("roomy")}, released AS (
    SELECT m.resource FROM moved AS m
    WHERE m.resource IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM resource_holds AS h WHERE h.resource = m.resource)
), {resource_wake_next("released")}
SELECT count(*) FROM moved
"""

# Why an edit changed nothing: the job's state, and what holds its start.
JOB_EDIT_REFUSAL: Final = """
SELECT state, approval, parents_pending, attempt_count, expires_at, payload_ref FROM jobs
WHERE job_id = %(job_id)s
"""


# Pausing a paused queue keeps who paused it first, and when. The claim refuses
# the queue's jobs (QUEUE_PAUSED) and the relay sends none of its wake-ups while the
# row says paused; jobs already running finish. The turns of keys, resources and
# concurrency limits its waiting jobs hold pass on to jobs of running queues
# (fragments.turns_passed_on_at_pause).
QUEUE_PAUSE: Final = f"""
WITH paused AS (
    INSERT INTO queues AS q (queue, paused, paused_at, paused_by, updated_at)
    VALUES (%(queue)s, true, now(), COALESCE(%(by)s::text, {_WHO}), now())
    ON CONFLICT (queue) DO UPDATE
    SET paused = true,
        paused_at = CASE WHEN q.paused THEN q.paused_at ELSE EXCLUDED.paused_at END,
        paused_by = CASE WHEN q.paused THEN q.paused_by ELSE EXCLUDED.paused_by END,
        updated_at = now()
    RETURNING q.queue, q.paused_at, q.paused_by
), {turns_passed_on_at_pause("%(queue)s")}
SELECT queue, paused_at, paused_by FROM paused
"""

# Returns the queue if it was paused. The notification reaches the relay when the
# caller commits, so the queue's waiting wake-ups go out at once, not at a poll.
# The last pause (paused_at, paused_by) stays on the row beside who resumed it.
QUEUE_RESUME: Final = f"""
WITH resumed AS (
    UPDATE queues
    SET paused = false, resumed_at = now(), resumed_by = COALESCE(%(by)s::text, {_WHO}),
        updated_at = now()
    WHERE queue = %(queue)s AND paused
    RETURNING queue, paused_at, paused_by, resumed_at, resumed_by
)
SELECT r.queue, r.paused_at, r.paused_by, r.resumed_at, r.resumed_by,
       (SELECT pg_notify({channel_sql(OUTBOX_CHANNEL)}, '')) IS NULL
FROM resumed AS r
"""

QUEUE_PAUSED_LIST: Final = """
SELECT queue, paused_at, paused_by FROM queues WHERE paused ORDER BY queue
"""

# Whether anything uses a queue: a job waiting, running, failed or cancelled in it
# (each through the partial index of its states), a wake-up for it, a consumer
# that serves it (live or not), a schedule that enqueues into it, or a pause. Each
# probe is one index lookup or a scan of a small table; a queue whose only jobs
# succeeded long ago counts as unused (no index leads with their queue).
QUEUE_IN_USE: Final = f"""
SELECT EXISTS (SELECT 1 FROM jobs WHERE queue = %(queue)s AND state IN ({CLAIMABLE_SQL}))
    OR EXISTS (SELECT 1 FROM jobs WHERE queue = %(queue)s AND state IN ({LEASED_SQL}))
    OR EXISTS (SELECT 1 FROM jobs
               WHERE queue = %(queue)s AND state IN ({REPLAYABLE_SQL}))
    OR EXISTS (SELECT 1 FROM outbox WHERE queue = %(queue)s AND sent_at IS NULL)
    OR EXISTS (SELECT 1 FROM outbox WHERE queue = %(queue)s AND sent_at IS NOT NULL)
    OR EXISTS (SELECT 1 FROM workers WHERE %(queue)s = ANY(queues))
    OR EXISTS (SELECT 1 FROM schedules WHERE queue = %(queue)s)
    OR EXISTS (SELECT 1 FROM queues WHERE queue = %(queue)s)
"""

# Everything "why is my job waiting?" needs about one job, by key lookups: the row
# (its approval too); its queue's pause; its tenant's cap and slots in use; why the
# relay last held the tenant's wake-ups back in that queue; its wake-up (one in
# flight that was not taken up yet, else the pending one); how many live consumers
# serve its queue, how many of them have its handler (the workers table holds one
# row per consumer process) and, for a dedicated tenant, how many of those name it;
# when its lease holder last heartbeat; how many relays are live and connected to
# RabbitMQ (the relays table: a row per relay process), and when one was last seen.
# statement_timestamp(), not now(): the caller's transaction may have begun long ago.
JOB_EXPLAIN: Final = f"""
SELECT j.job_id, j.job_type, j.state, j.queue, j.tenant, j.priority, j.attempt_count,
       j.max_attempts, j.run_after, j.last_error_code, j.last_error_message, j.finished_at,
       j.lease_owner, j.lease_expires_at, j.lease_generation, j.started_at,
       j.progress::text AS progress,
       j.progress_at, j.cancel_requested_at, j.cancel_forced_at, j.delay_reason, j.delay_since,
       j.approval, j.approval_by, j.approval_at, j.created_at, j.parents_pending,
       j.on_parent_failure, j.payload_ref,
       j.expires_at, j.rate_limit, rb.tokens AS rate_tokens, rb.refilled_at AS rate_refilled_at,
       statement_timestamp() AS db_now,
       q.paused_at, q.paused_by,
       l.max_running, COALESCE(u.running, 0) AS running,
       f.held_reason, f.held_since,
       o.id AS wakeup_id, o.available_at AS wakeup_due, o.sent_at AS wakeup_sent_at,
       (SELECT count(*) FROM workers AS w
        WHERE j.queue = ANY(w.queues) AND {LIVE_WORKER})::int AS workers_on_queue,
       (SELECT count(*) FROM workers AS w
        WHERE j.queue = ANY(w.queues) AND j.job_type = ANY(w.job_types)
          AND {LIVE_WORKER})::int AS handlers_on_queue,
       COALESCE(l.runners = 'dedicated', false) AS dedicated,
       (SELECT count(*) FROM workers AS w
        WHERE l.runners = 'dedicated' AND j.queue = ANY(w.queues)
          AND j.job_type = ANY(w.job_types) AND j.tenant = ANY(w.tenants)
          AND {LIVE_WORKER})::int AS runners_on_queue,
       (SELECT w.last_seen_at FROM workers AS w WHERE w.worker_id = j.lease_owner) AS owner_seen_at,
       r.relays_live, r.relays_publishing, r.relay_seen_at,
       j.key, j.key_limit, j.key_order, j.key_seq,
       k.key_running, k.key_running_limit, k.key_holder,
       a.job_id AS key_ahead, a.state AS key_ahead_state,
       j.resource, rh.job_id AS resource_holder, rh.held_since AS resource_held_since,
       rh.uncertain_since AS resource_uncertain_since,
       cl.max_running AS limit_max_running, cl.running AS limit_running,
       ql.max_running AS queue_limit_max_running, ql.running AS queue_limit_running,
       COALESCE(j.weight, 1) AS weight,
       -- the most slots a live consumer with its handler has, for a weighed job
       (SELECT max(w.concurrency) FROM workers AS w
        WHERE j.weight IS NOT NULL AND j.queue = ANY(w.queues)
          AND j.job_type = ANY(w.job_types) AND {LIVE_WORKER})::int AS largest_concurrency
FROM jobs AS j
-- its type's concurrency limit, when its last claim turned it down for it
LEFT JOIN concurrency_limits AS cl
  ON cl.job_type = j.job_type AND j.delay_reason = 'CONCURRENCY_LIMIT'
-- its queue's concurrency limit, when its last claim turned it down for it
LEFT JOIN queue_limits AS ql
  ON ql.queue = j.queue AND j.delay_reason = 'QUEUE_CONCURRENCY_LIMIT'
-- the hold of its resource, if another job has it (or it does, uncertain)
LEFT JOIN resource_holds AS rh
  ON rh.resource = j.resource
 AND (rh.job_id <> j.job_id OR rh.uncertain_since IS NOT NULL)
LEFT JOIN LATERAL (
    -- the leases its key holds (jobs_key_leased_idx), and the oldest of them
    SELECT count(*)::int AS key_running, min(x.key_limit) AS key_running_limit,
           (array_agg(x.job_id ORDER BY x.started_at, x.job_id))[1] AS key_holder
    FROM jobs AS x
    WHERE x.key = j.key AND x.state IN ({LEASED_SQL}) AND x.job_id <> j.job_id
) AS k ON j.key IS NOT NULL
LEFT JOIN LATERAL (
    -- the ordered job of its key right before it that it waits for
    SELECT x.job_id, x.state FROM jobs AS x
    WHERE x.key = j.key AND x.key_seq < j.key_seq AND {KEY_AHEAD.format(x="x")}
    ORDER BY x.key_seq DESC
    LIMIT 1
) AS a ON j.key_seq IS NOT NULL
LEFT JOIN queues AS q ON q.queue = j.queue AND q.paused
LEFT JOIN tenant_limits AS l ON l.tenant = j.tenant
LEFT JOIN tenant_usage AS u ON u.tenant = j.tenant
LEFT JOIN fair_shares AS f ON f.queue = j.queue AND f.tenant = COALESCE(j.tenant, '')
LEFT JOIN rate_buckets AS rb ON rb.name = j.rate_limit AND j.delay_reason = 'RATE_LIMITED'
LEFT JOIN LATERAL (
    SELECT o.id, o.available_at, o.sent_at
    FROM outbox AS o
    WHERE o.job_id = j.job_id AND (o.sent_at IS NULL OR ({UNTAKEN}))
    ORDER BY o.sent_at IS NULL, o.available_at
    LIMIT 1
) AS o ON true
CROSS JOIN LATERAL (
    SELECT (count(*) FILTER (WHERE live))::int AS relays_live,
           (count(*) FILTER (WHERE live AND broker_connected))::int AS relays_publishing,
           max(last_seen_at) AS relay_seen_at
    FROM (SELECT last_seen_at, broker_connected,
                 last_seen_at > statement_timestamp()
                                - make_interval(secs => {RELAY_LIVE_SECONDS}) AS live
          FROM relays) AS rs
) AS r
WHERE j.job_id = %(job_id)s
"""

# For a due job with a wake-up, the queue in front of it:
# - in_flight: wake-ups of its queue sent and not yet taken up, ahead of its own
#   (all of them, if its own is still pending): about a window's worth;
# - pending_ahead: due pending wake-ups that the relay sends before its own (higher
#   priority, or the same priority and older), counted per tenant over two ranges
#   of outbox_pending_idx each, so only the entries ahead are read, at most `cap`+1
#   of them per tenant (fair share between tenants is not modelled: an estimate);
# - drain: the queue's attempts that ended in the last `drain_window` seconds,
#   from the newest `drain_sample` attempts of all queues (job_attempts_finished_idx,
#   then a key lookup each), when the earliest of them started, and how far back
#   the sample reaches;
# - oldest_due: the queue's oldest due pending wake-up, read from outbox_due_idx no
#   further than its own (the queue's outbox lag).
JOB_EXPLAIN_BACKLOG: Final = f"""
WITH RECURSIVE {PENDING_TENANTS}, ahead AS (
    SELECT x.n
    FROM tenants AS t
    CROSS JOIN LATERAL (
        SELECT (SELECT count(*) FROM (
                    SELECT 1 FROM outbox AS o
                    WHERE o.queue = %(queue)s AND o.tenant = t.tenant AND o.sent_at IS NULL
                      AND o.priority > %(priority)s AND o.available_at <= %(now)s
                    LIMIT %(cap)s + 1) AS hi)
             + (SELECT count(*) FROM (
                    SELECT 1 FROM outbox AS o
                    WHERE o.queue = %(queue)s AND o.tenant = t.tenant AND o.sent_at IS NULL
                      AND o.priority = %(priority)s
                      AND (o.available_at, o.id) < (%(due)s::timestamptz, %(wakeup_id)s::bigint)
                    LIMIT %(cap)s + 1) AS eq) AS n
    ) AS x
    WHERE t.tenant IS NOT NULL AND %(pending)s
), sampled AS (
    -- the queue of each sampled attempt by a key lookup (a subquery per row: a
    -- join could be planned as a scan of all jobs when the limit is a parameter)
    SELECT s.started_at, s.finished_at,
           (SELECT j.queue FROM jobs AS j WHERE j.job_id = s.job_id) = %(queue)s AS ours
    FROM (SELECT a.job_id, a.started_at, a.finished_at FROM job_attempts AS a
          WHERE a.finished_at > %(now)s - make_interval(secs => %(drain_window)s)
            AND a.outcome <> 'QUEUED'
          ORDER BY a.finished_at DESC
          LIMIT %(drain_sample)s) AS s
), drained AS (
    SELECT count(*) FILTER (WHERE ours) AS n, count(*) AS sampled,
           min(finished_at) AS since, min(started_at) FILTER (WHERE ours) AS first_start
    FROM sampled
)
SELECT (SELECT count(*) FROM (
            SELECT 1 FROM outbox AS o JOIN jobs AS j ON j.job_id = o.job_id
            WHERE o.queue = %(queue)s AND o.sent_at IS NOT NULL
              AND (%(pending)s OR (o.sent_at, o.id) < (%(sent_at)s::timestamptz,
                                                       %(wakeup_id)s::bigint))
              AND {UNTAKEN}
            LIMIT %(cap)s + 1) AS f) AS in_flight,
       (SELECT COALESCE(sum(n), 0) FROM ahead)::bigint AS pending_ahead,
       d.n AS drained, d.sampled, d.since, d.first_start,
       (SELECT o.available_at FROM outbox AS o
        WHERE %(pending)s AND o.sent_at IS NULL AND o.available_at <= %(due)s::timestamptz
          AND o.queue = %(queue)s
        ORDER BY o.available_at LIMIT 1) AS oldest_due
FROM drained AS d
"""

# Retention: a batch of jobs finished longer ago than keep_seconds, oldest first
# (jobs_finished_idx); attempts, wake-ups and replays go by ON DELETE CASCADE. Effect
# keys stay (EFFECT_RETENTION_DELETE is theirs): a key must outlive the job that
# marked it, or a later job with the same key would do the effect again. A row
# another transaction holds (an operator replaying it) is skipped, and the state is
# checked again on the locked row, so a job replayed meanwhile is never deleted.
# Deleting the job frees its dedup key. The delete takes the batch as an array, so
# it is a key lookup per id whatever the batch size (joined, a generic plan could
# scan all of jobs).
# Retention never changes what a waiting job waits for. Two kinds of finished job
# stay, however old:
# - a FAILED job of a strict key, until it is replayed: the key's later jobs wait
#   behind it (KEY_ORDER), and with it deleted they would run as if it had
#   succeeded. Asked as KEY_AHEAD, the one definition of what holds a key (IS NOT
#   TRUE: key_order is NULL for a job without an order);
# - a job that a job not finished yet depends on, until every such child has
#   finished: a child replayed while this parent is FAILED waits for it again, and
#   deleting the parent would take the edge with it (ON DELETE CASCADE), leaving the
#   child's parents_pending above 0 for ever (a waiting child also reads its
#   parents' results). has_dependants is the guard: a job nobody named in after= is
#   never looked up; one that was costs a probe of job_dependencies_parent_idx and
#   one pkey lookup per child.
# The jobs kept are walked again by every pass (they stay in jobs_finished_idx):
# as many as there are held keys and parents of waiting children.
JOB_RETENTION_DELETE: Final = f"""
WITH doomed AS (
    SELECT j.job_id
    FROM jobs AS j
    WHERE j.state IN ({TERMINAL_SQL})
      AND j.finished_at < now() - make_interval(secs => %(keep_seconds)s)
      -- not what a later job of its key waits behind (of finished jobs: a FAILED
      -- one of a strict key), nor a parent a job not finished waits for or reads
      AND ({KEY_AHEAD.format(x="j")}) IS NOT TRUE
      AND NOT (j.has_dependants AND EXISTS (
          SELECT 1
          FROM job_dependencies AS d JOIN jobs AS c ON c.job_id = d.child_id
          WHERE d.parent_id = j.job_id AND c.state NOT IN ({TERMINAL_SQL})
          -- a probe per parent: left to itself PostgreSQL hashed the edges of every
          -- waiting child once instead, reading all of job_dependencies and jobs
          OFFSET 0))
    ORDER BY j.finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM jobs AS j
    WHERE j.job_id = ANY(ARRAY(SELECT job_id FROM doomed)) AND j.state IN ({TERMINAL_SQL})
    RETURNING j.job_id
)
SELECT count(*) FROM deleted
"""

# The effect keys' own retention (relay --keep-effects; by default none): a batch of
# keys marked longer ago than keep_seconds, oldest first (job_effects_created_idx),
# whether or not their job is still there. A key a handler is marking again right
# now is skipped.
EFFECT_RETENTION_DELETE: Final = """
WITH doomed AS (
    SELECT e.effect_key
    FROM job_effects AS e
    WHERE e.created_at < now() - make_interval(secs => %(keep_seconds)s)
    ORDER BY e.created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM job_effects AS e
    WHERE e.effect_key = ANY(ARRAY(SELECT effect_key FROM doomed))
    RETURNING 1
)
SELECT count(*) FROM deleted
"""
