"""A job's statements outside its lease: enqueue, cancel, an effect done once, the
handler's progress and finished steps, the API request behind a job."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.locks import INSTANCE_SEED, KEY_LOCK_PREFIX
from hybrid_jobs.schema.queries.fragments import FENCE, WHO
from hybrid_jobs.schema.queries.policy import forbids
from hybrid_jobs.schema.states import DelayReason
from hybrid_jobs.schema.tables import (
    APPROVAL_HOLD,
    CLAIMABLE_SQL,
    LEASED_SQL,
    unique_held,
    unique_window_end,
)


# Inserts a batch of jobs and their wake-ups in one statement (scheduled_for is given
# only by the relay, for a schedule's occurrence; approval 'REQUIRED' by an enqueue
# with needs_approval: held never due, without a wake-up). A job whose
# (job_type, dedup_key) exists already inserts nothing, and gets no wake-up; the
# caller then looks its id up with JOB_FIND_BY_DEDUP_MANY. The outbox trigger
# notifies the relay when the caller's transaction commits. A job's tags go to
# jobs.tags and, one row each, to job_tags (the search's index); a job without
# tags gives that insert no row.
#
# Composed, as the claim is, of what the batch uses: the tags' and the parents'
# inserts are left out of a batch with no tags and no after= (most), which would
# otherwise pay for both on every job, with nothing to insert; and the scoped keys'
# columns (enqueue's unique=) out of a batch that has none.
def job_insert_many(
    *, tags: bool = True, parents: bool = True, unique: bool = False, refs: bool = False
) -> str:
    """JOB_INSERT_MANY, with the steps for tags and for parents (``after=``) only
    when the batch has them, with ``unique`` the scoped keys' columns, and with
    ``refs`` the column naming a stored input (``payload_ref=``)."""
    tagged = _INSERT_TAGGED if tags else ""
    edges = _INSERT_EDGES if parents else ""
    unique_input = unique_columns = unique_values = ""
    # a job's key conflicts in jobs_dedup_idx ('forever') or in jobs_unique_idx (a
    # scope): only one index can be named, so none is, and a conflict in either skips
    # the job (the job_id, new, conflicts in no other)
    conflict = "(job_type, dedup_key) WHERE dedup_key IS NOT NULL "
    if unique:
        unique_input = (
            ",\n        unique_key text, unique_scope text, unique_seconds double precision"
        )
        unique_columns = ", unique_key, unique_scope, unique_until"
        unique_values = (
            ", unique_key, unique_scope,\n           CASE WHEN unique_seconds IS NOT NULL"
            f" THEN {unique_window_end('unique_seconds')} END"
        )
        conflict = ""
    ref_input = ", payload_ref uuid" if refs else ""
    ref_column = ", payload_ref" if refs else ""
    return f"""
WITH input AS (
    SELECT *
    FROM jsonb_to_recordset(%(jobs)s::jsonb) AS i(
        job_id uuid, job_type text, queue text, tenant text, payload jsonb, dedup_key text,
        max_attempts integer, priority smallint, run_after timestamptz,
        delay_seconds double precision, scheduled_for timestamptz, approval text,
        trace_context jsonb, expires_at timestamptz, expires_seconds double precision,
        rate_limit text, key text, key_limit integer, key_order text, resource text,
        weight integer, parents jsonb, parents_pending integer, on_parent_failure text, tags text[],
        meta jsonb{unique_input}{ref_input})
), inserted AS (
    INSERT INTO jobs AS j
        (job_id, job_type, queue, tenant, payload, dedup_key, max_attempts, priority, run_after,
         scheduled_for, approval, trace_context, expires_at, rate_limit, key, key_limit,
         key_order, key_seq, resource, weight, parents_pending, on_parent_failure,
         delay_reason, delay_since, tags, meta{unique_columns}{ref_column})
    -- jsonb_to_recordset reads a JSON null payload as SQL NULL; it is JSON null
    SELECT job_id, job_type, queue, tenant, COALESCE(payload, 'null'::jsonb), dedup_key,
           max_attempts, priority,
           CASE WHEN approval = 'REQUIRED' OR parents_pending > 0 THEN {APPROVAL_HOLD} ELSE
           COALESCE(run_after, now() + make_interval(secs => COALESCE(delay_seconds, 0))) END,
           scheduled_for, approval, trace_context,
           COALESCE(expires_at, now() + make_interval(secs => expires_seconds)),
           rate_limit, key, key_limit, key_order,
           -- numbered under the key's lock (JOB_KEYS_LOCK), in the batch's order
           CASE WHEN key_order IS NOT NULL THEN nextval('jobs_key_seq') END,
           resource, weight,
           COALESCE(parents_pending, 0), on_parent_failure,
           CASE WHEN parents_pending > 0 THEN '{DelayReason.DEPENDENCY}' END,
           CASE WHEN parents_pending > 0 THEN now() END,
           COALESCE(tags, '{{}}'), meta{unique_values}{ref_column}
    FROM input
    ON CONFLICT {conflict}DO NOTHING
    RETURNING j.job_id, j.queue, j.tenant, j.priority, j.run_after, j.approval,
              j.parents_pending, j.tags
{tagged}{edges}), woken AS (
    -- one that waits for approval gets its wake-up from outbox.approve, one that
    -- waits for parents from the end of the last (jobs_release_dependants)
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT job_id, queue, COALESCE(tenant, ''), priority, run_after FROM inserted
    WHERE approval IS NULL AND parents_pending = 0
)
SELECT job_id FROM inserted
"""


_INSERT_TAGGED = """), tagged AS (
    INSERT INTO job_tags (tag, job_id)
    SELECT t.tag, n.job_id FROM inserted AS n CROSS JOIN LATERAL unnest(n.tags) AS t(tag)
"""
_INSERT_EDGES = """), edges AS (
    -- only for jobs inserted: a dedup_key taken already means no new job to wait
    -- an edge to a parent that ended already is settled and counted here
    -- (parents_pending left it out), so jobs_count_dependants never counts it
    INSERT INTO job_dependencies (child_id, parent_id, position, done, counted)
    SELECT i.job_id, e.parent_id, e.position, e.done, e.done
    FROM input AS i
    JOIN inserted AS n ON n.job_id = i.job_id
    CROSS JOIN LATERAL jsonb_to_recordset(i.parents)
        AS e(parent_id uuid, position integer, done boolean)
"""

JOB_INSERT_MANY: Final = job_insert_many()
# A batch of jobs with no tags and no parents.
JOB_INSERT_PLAIN_MANY: Final = job_insert_many(tags=False, parents=False)
# A batch with a job whose dedup key has a scope (enqueue's unique=).
JOB_INSERT_UNIQUE_MANY: Final = job_insert_many(unique=True)
# A batch with a job whose payload is a stored input (payload_ref=), and one that also
# has a scoped key: the only inserts that name the column.
JOB_INSERT_REF_MANY: Final = job_insert_many(refs=True)
JOB_INSERT_UNIQUE_REF_MANY: Final = job_insert_many(unique=True, refs=True)

# A large batch of plain jobs (outbox.bulk): for jobs with none of the insert's
# steps, the rows JOB_INSERT_PLAIN_MANY writes, by COPY (their wake-ups follow by
# OUTBOX_COPY). The columns are every one such a job can set; the rest keep their
# defaults, as in the insert.
_COPIED = """job_id, job_type, queue, tenant, payload, max_attempts, priority, run_after,
           trace_context, expires_at, rate_limit, key, key_limit, resource, weight, meta"""
JOB_COPY: Final = f"COPY jobs ({_COPIED}) FROM STDIN"
# A batch with tags: the column too (a batch without pays nothing for it: an empty
# array a row cost 7% of the COPY's rate), and then a row each in job_tags, the
# search's index, as JOB_INSERT_MANY's tagged step writes them.
JOB_COPY_TAGGED: Final = f"COPY jobs ({_COPIED}, tags) FROM STDIN"
JOB_TAGS_COPY: Final = "COPY job_tags (tag, job_id) FROM STDIN"
# The transaction's now(), which the insert's defaults and spans count from: a
# COPY's start and deadline are counted from it too.
JOB_COPY_NOW: Final = "SELECT now()"


# Before a batch with after= is inserted: its parents' states, the parents locked
# FOR KEY SHARE in id order, which keeps retention from deleting them until the
# producer commits and leaves their leases alone (a heartbeat, an outcome and the
# sweeper take a weaker lock than it conflicts with). A parent that ended already
# is settled from the state returned. One that is running may end before the
# producer commits, its end blind to the new edge: the edge's own check at commit
# (trigger job_dependencies_check) marks the parent has_dependants, under its row
# lock for that instant, and settles the edge if the parent ended meanwhile. A
# parent that is not returned does not exist (or is not visible to this
# transaction).
JOB_PARENTS_LOCK: Final = """
SELECT job_id, state FROM jobs
WHERE job_id = ANY(%(ids)s::uuid[])
ORDER BY job_id
FOR KEY SHARE
"""

# job.parent_results(): the results of the job's parents, in the order of after=,
# in one read (the pkey's prefix finds the edges). A parent deleted by retention
# has no row.
JOB_PARENT_RESULTS: Final = """
SELECT d.parent_id, p.state, p.result::text AS result
FROM job_dependencies AS d
JOIN jobs AS p ON p.job_id = d.parent_id
WHERE d.child_id = %(job_id)s
ORDER BY d.position
"""

# outbox.explain's DEPENDENCY: the parents a job still waits for, with their state.
JOB_PARENTS_PENDING: Final = """
SELECT d.parent_id, p.state
FROM job_dependencies AS d
JOIN jobs AS p ON p.job_id = d.parent_id
WHERE d.child_id = %(job_id)s AND NOT d.done
ORDER BY d.position
LIMIT 100
"""

# Taken before JOB_INSERT_MANY when the batch has ordered jobs: the
# transaction-scoped advisory lock of each of their keys, in key order (two
# batches never wait for each other in a circle). A second producer of the key
# waits here until the first commits, so it draws its key_seq after the first's:
# the numbers follow the commit order, and a claim never sees a later number of a
# key before an earlier one. Keys whose hashes collide only wait for each other.
JOB_KEYS_LOCK: Final = f"""
SELECT count(pg_advisory_xact_lock(hashtextextended('{KEY_LOCK_PREFIX}' || k.key, {INSTANCE_SEED})))
FROM (SELECT DISTINCT key FROM unnest(%(keys)s::text[]) AS u(key) ORDER BY key) AS k
"""

# Debounced jobs (enqueue(..., dedup_key=, debounce=)): a job whose key no job
# that has not started yet holds is inserted, due debounce from now, with its
# wake-up; one whose key such a job holds replaces that job's payload and moves
# its start to debounce from now, never past debounce_until (debounce_max after the
# first enqueue), and its wake-up with it (delete and insert, as OUTBOX_HAND_BACK
# does: a wake-up already sent would find the job not due, and be settled). The
# key is held by jobs_debounce_idx only while its job is QUEUED and never started,
# so a claim that starts it frees the key (the conflict is decided on the latest
# row, the update fenced by the same state), and a later enqueue makes a new job.
# One row per key: the caller sends each (job_type, key) once. Returns each key's
# job (the one it replaced, for a repeat). A repeat replaces the tags and meta
# too: the job carries what the latest enqueue said of it.
JOB_DEBOUNCE_MANY: Final = """
WITH input AS (
    SELECT *
    FROM jsonb_to_recordset(%(jobs)s::jsonb) AS i(
        job_id uuid, job_type text, queue text, tenant text, payload jsonb, dedup_key text,
        max_attempts integer, priority smallint, expires_at timestamptz,
        expires_seconds double precision, rate_limit text, debounce_seconds double precision,
        debounce_max_seconds double precision, trace_context jsonb, tags text[], meta jsonb,
        weight integer)
), upserted AS (
    INSERT INTO jobs AS j
        (job_id, job_type, queue, tenant, payload, debounce_key, max_attempts, priority,
         run_after, debounce_until, expires_at, rate_limit, trace_context, tags, meta, weight)
    SELECT job_id, job_type, queue, tenant, COALESCE(payload, 'null'::jsonb), dedup_key,
           max_attempts, priority, now() + make_interval(secs => debounce_seconds),
           now() + make_interval(secs => debounce_max_seconds),
           COALESCE(expires_at, now() + make_interval(secs => expires_seconds)), rate_limit,
           trace_context, COALESCE(tags, '{}'), meta, weight
    FROM input
    ON CONFLICT (job_type, debounce_key)
        WHERE debounce_key IS NOT NULL AND state = 'QUEUED' AND started_at IS NULL
    DO UPDATE
    SET payload = EXCLUDED.payload,
        run_after = LEAST(EXCLUDED.run_after, j.debounce_until),
        tags = EXCLUDED.tags,
        meta = EXCLUDED.meta,
        -- (it has never started, so it holds no slot its weight could mistake)
        weight = EXCLUDED.weight,
        updated_at = now()
    WHERE j.state = 'QUEUED' AND j.started_at IS NULL
    RETURNING j.job_id, j.queue, j.tenant, j.priority, j.run_after, j.debounce_key, j.job_type,
              j.tags
), tagged AS (
    -- the new ones come; the ones a replaced job no longer has go in JOB_TAGS_PRUNE
    INSERT INTO job_tags (tag, job_id)
    SELECT t.tag, u.job_id FROM upserted AS u CROSS JOIN LATERAL unnest(u.tags) AS t(tag)
    ON CONFLICT DO NOTHING
), unwoken AS (
    DELETE FROM outbox AS o USING upserted AS u WHERE o.job_id = u.job_id
), woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT job_id, queue, COALESCE(tenant, ''), priority, run_after FROM upserted
)
SELECT job_type, debounce_key, job_id FROM upserted
"""

# After JOB_DEBOUNCE_MANY: the index rows of the tags the replaced jobs no longer
# have. A statement of its own, for a fresh snapshot: a repeat that waited for a
# concurrent one's commit replaced the row that commit wrote, but its own statement's
# snapshot predates the tag rows that commit added. The jobs' rows are still locked
# by this transaction, so no repeat changes their tags meanwhile.
JOB_TAGS_PRUNE: Final = """
DELETE FROM job_tags AS t USING jobs AS j
WHERE j.job_id = ANY(%(ids)s::uuid[]) AND t.job_id = j.job_id AND t.tag <> ALL(j.tags)
"""

# A separate statement from the insert on purpose: under READ COMMITTED it takes a
# fresh snapshot, so it sees the row of a concurrent transaction that won the race on
# the same dedup key (the insert above waited for that transaction to commit).
JOB_FIND_BY_DEDUP_MANY: Final = """
SELECT j.job_type, j.dedup_key, j.job_id
FROM jsonb_to_recordset(%(keys)s::jsonb) AS k(job_type text, dedup_key text)
JOIN jobs j ON j.job_type = k.job_type AND j.dedup_key = k.dedup_key
"""

# The same for scoped keys (enqueue's unique=), after JOB_INSERT_UNIQUE_MANY, in its
# transaction (the same now(), so the same window): the job holding each key now,
# by the number the caller gave it (n). None for a key whose holder left its scope
# since the insert met it (claimed, ended): the key is free, and the caller inserts
# that job again.
JOB_FIND_BY_UNIQUE_MANY: Final = f"""
SELECT k.n, j.job_id
FROM jsonb_to_recordset(%(keys)s::jsonb)
    AS k(n integer, job_type text, unique_key text, unique_seconds double precision)
JOIN jobs AS j
  ON j.job_type = k.job_type AND j.unique_key = k.unique_key
 AND j.unique_until IS NOT DISTINCT FROM
     CASE WHEN k.unique_seconds IS NOT NULL THEN {unique_window_end("k.unique_seconds")} END
 AND {unique_held("j.")}
"""

# A cancel request from outside: a job nobody holds is cancelled at once (and its
# pending wake-ups go); a running one is asked to stop (its worker sees
# CANCEL_REQUESTED on its next heartbeat, and keeps its slot until it stops). With
# %(force)s the request is recorded as forced (cancel_forced_at), which the heartbeat
# hands the worker too, and a running job whose cancel was requested already is made
# forced. A running job whose type's policy forbids cancelling it (cancel_running) is
# left alone, unless %(override)s, recorded as who overrode it (cancel_override_by);
# the policy is probed only for a running job. Returns the new state, or nothing if
# the job is finished already, unknown, refused by its policy, or already asked to
# stop the way this request asks.
JOB_REQUEST_CANCEL: Final = f"""
WITH cancelled AS (
    UPDATE jobs
    SET state = CASE WHEN state IN ({LEASED_SQL}) THEN 'CANCEL_REQUESTED' ELSE 'CANCELLED' END,
        finished_at = CASE WHEN state IN ({LEASED_SQL}) THEN finished_at
                           ELSE statement_timestamp() END,
        -- a request made forced keeps the time of the first (the cancel's latency)
        cancel_requested_at = CASE state WHEN 'CANCEL_REQUESTED' THEN cancel_requested_at
                                         ELSE now() END,
        cancel_forced_at = CASE WHEN %(force)s AND state IN ({LEASED_SQL}) THEN now() END,
        cancel_override_by = CASE
            WHEN state = 'RUNNING' AND %(override)s AND {forbids("cancel_running", "jobs")}
            THEN COALESCE(%(by)s::text, {WHO}) ELSE cancel_override_by END,
        delay_reason = NULL,
        delay_since = NULL,
        updated_at = now()
    -- a second request changes nothing, unless it adds the force the first lacked
    WHERE job_id = %(job_id)s
      AND (state IN ({CLAIMABLE_SQL}, 'RUNNING')
           OR (state = 'CANCEL_REQUESTED' AND %(force)s AND cancel_forced_at IS NULL))
      AND (state <> 'RUNNING' OR %(override)s OR NOT {forbids("cancel_running", "jobs")})
    RETURNING job_id, state
), unwoken AS (
    DELETE FROM outbox AS o USING cancelled AS c
    WHERE o.job_id = c.job_id AND c.state = 'CANCELLED' AND o.sent_at IS NULL
)
-- (a waiting job cancelled: the next of its key or resource is woken by the
-- trigger jobs_hand_on, as for every end of a waiting job)
SELECT state FROM cancelled
"""

JOB_STATE: Final = "SELECT state FROM jobs WHERE job_id = %(job_id)s"

JOB_TRACE_CONTEXTS: Final = """
SELECT job_id, trace_context FROM jobs
WHERE job_id = ANY(%(job_ids)s::uuid[]) AND trace_context IS NOT NULL
"""

# What outbox.wait_for answers with: the job's state and, once it is final, how it
# ended (a handler's result, the last error).
JOB_OUTCOME: Final = """
SELECT state, result, last_error_code, last_error_message, finished_at
FROM jobs WHERE job_id = %(job_id)s
"""

# Marks one effect done, once per key, in the handler's own transaction: true the
# first time, false for every later attempt (whose transaction then skips the effect).
JOB_EFFECT_CLAIM: Final = """
INSERT INTO job_effects (effect_key, job_id)
VALUES (%(effect_key)s, %(job_id)s)
ON CONFLICT (effect_key) DO NOTHING
RETURNING true
"""

# A handler's progress, through the fence. A row another transaction holds is
# skipped: progress is advisory and the next report will land.
JOB_PROGRESS: Final = f"""
WITH h AS (SELECT %(job_id)s::uuid AS job_id, %(generation)s::bigint AS generation),
held AS (
    SELECT j.job_id FROM h JOIN jobs AS j ON {FENCE}
    FOR NO KEY UPDATE OF j SKIP LOCKED
)
UPDATE jobs AS j SET progress = %(progress)s::jsonb, progress_at = now()
FROM held WHERE j.job_id = held.job_id
RETURNING j.job_id
"""

# A finished step of a handler's job (job.step), through the fence: the step's
# result, stamped with the attempt and generation that finished it. A stale worker
# (its lease lost, the job taken over) matches no row and records nothing. The job's
# row is locked FOR SHARE, not read from the snapshot alone: a claim committed
# since the snapshot was taken makes this wait and then see the new generation, so
# a step never lands after its attempt's lease was taken over. A step the job has
# already recorded (the same name run twice at once by one attempt) keeps its first
# result, and that result is returned: a row back means the step is recorded, none
# that the fence turned the write away.
JOB_STEP_RECORD: Final = f"""
WITH h AS (SELECT %(job_id)s::uuid AS job_id, %(generation)s::bigint AS generation),
held AS (
    SELECT j.job_id, j.attempt_count, j.lease_generation FROM h JOIN jobs AS j ON {FENCE}
    FOR SHARE OF j
)
INSERT INTO job_steps AS s (job_id, name, result, attempt, lease_generation, finished_at)
SELECT held.job_id, %(name)s, %(result)s::jsonb, held.attempt_count, held.lease_generation, now()
FROM held
ON CONFLICT (job_id, name) DO UPDATE SET result = s.result
RETURNING s.result::text AS result
"""

# The finished steps of a job, read once per attempt at its first job.step (the
# primary key, job_id first). Results as text: the caller decodes them as it
# decodes a job's result.
JOB_STEP_LIST: Final = """
SELECT name, result::text AS result FROM job_steps WHERE job_id = %(job_id)s
"""

# The finished steps of the jobs a replay has just put back, when the replay asked
# to start them over (retry_job(..., reset_steps=True)): run in the replay's
# transaction, which holds those jobs' rows, so no attempt can record a step of
# theirs in between.
JOB_STEP_CLEAR: Final = """
DELETE FROM job_steps WHERE job_id = ANY(%(job_ids)s::uuid[])
"""


# An API request's Idempotency-Key, the job it made and a hash of what it asked
# for. Inserted after the enqueue, in its transaction: a row that comes back means
# this request holds the key; none means a concurrent request with the key
# committed first (the insert waited for it), and JOB_REQUEST_BY_KEY reads its job.
JOB_REQUEST_RECORD: Final = """
INSERT INTO job_requests (idempotency_key, job_id, fingerprint)
VALUES (%(key)s, %(job_id)s, %(fingerprint)s)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING true
"""

# The request an Idempotency-Key names: its job, its fingerprint, and whether that
# request made the job (the two rows were written in one transaction, so they share
# now()) or found it by its dedup key.
JOB_REQUEST_BY_KEY: Final = """
SELECT r.job_id, r.fingerprint, r.created_at = j.created_at AS made
FROM job_requests AS r JOIN jobs AS j ON j.job_id = r.job_id
WHERE r.idempotency_key = %(key)s
"""

# The test runner's run_until_idle(retries=True) (consumers.testing): every retry
# waiting out its backoff comes due at once. Moves no job: they stay RETRY_WAIT.
JOB_RETRIES_DUE_NOW: Final = """
UPDATE jobs SET run_after = now() WHERE state = 'RETRY_WAIT' AND run_after > now()
"""

# The relay's sweep of deadlines: a waiting job past its expires_at that no claim
# looked at (delayed, parked, backed off: nobody wakes it before it is due) is
# cancelled with code EXPIRED, and its pending wake-ups go (one in flight is
# settled by the relay, as for any cancelled job). The claim ends the ones it is
# woken for itself (JOB_CLAIM_MANY), so this is bounded by %(limit)s soonest first,
# through jobs_expiring_idx. A job that waits holds no tenant slot. Returns each
# job ended, with its queue.
JOB_EXPIRE_WAITING: Final = f"""
WITH due AS (
    SELECT j.job_id
    FROM jobs AS j
    WHERE j.expires_at IS NOT NULL AND j.state IN ({CLAIMABLE_SQL}) AND j.expires_at <= now()
    ORDER BY j.expires_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), expired AS (
    UPDATE jobs AS j
    SET state = 'CANCELLED',
        last_error_code = 'EXPIRED',
        last_error_message = 'not started by its deadline, ' || j.expires_at::text,
        delay_reason = NULL,
        delay_since = NULL,
        finished_at = statement_timestamp(),
        updated_at = now()
    FROM due
    WHERE j.job_id = due.job_id AND j.state IN ({CLAIMABLE_SQL})
    RETURNING j.job_id, j.queue
), unwoken AS (
    DELETE FROM outbox AS o USING expired AS e
    WHERE o.job_id = e.job_id AND o.sent_at IS NULL
)
-- (the next of an expired job's key or resource: the trigger jobs_hand_on)
SELECT job_id, queue FROM expired
"""
