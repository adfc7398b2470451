"""The pieces every statement is built from, named once so they are the same
everywhere: the fence a worker's write carries, the end of a lease, what an untaken
wake-up is, a live consumer, the skip scan of a queue's tenants."""

from __future__ import annotations

from typing import Final

from hybrid_jobs import defaults
from hybrid_jobs.schema.gates import HELD_GATES
from hybrid_jobs.schema.states import DelayReason
from hybrid_jobs.schema.tables import (
    CLAIMABLE_SQL,
    DEFAULT_MAX_ATTEMPTS,
    LEASED_SQL,
    RESOURCE_REFUSALS_SQL,
)

# Who acted, when the caller does not say: the database role, and the client's
# application_name when it set one ("app (jobctl)").
WHO = "current_user || COALESCE(' (' || NULLIF(current_setting('application_name'), '') || ')', '')"

# The attempt budget in force: the row's, else the default.
BUDGET = f"COALESCE(j.max_attempts, {DEFAULT_MAX_ATTEMPTS})"


# The fence every worker write carries: the row is still this worker's lease, of
# the generation the worker was given at claim (``h`` names the worker's handle).
#
# Written so that the plan can only look the handles up by their ids, whatever the
# statistics say: the ids also as an array (an index condition on the primary key,
# of a few rows by the planner's guess), and the state test "IS TRUE" (the same
# test: state is never NULL), which the planner cannot match to jobs_leased_idx.
# That index keeps an entry for every lease taken since the last vacuum, dead ones
# included, and the planner does not know it: as a plain join, the fence was planned
# as a read of all of it, with statistics taken while few jobs ran as without any
# (an outcome of 50 took 18 ms midway through a drain of 60,000, against 1.3); with
# only the state test hidden, as a scan of the whole table where none were taken
# (tests/test_fence_plan.py).
def fence(handles: str = "h") -> str:
    """The fence for the handles of the CTE ``handles`` (job_id, generation), joined
    as ``h``."""
    return (
        f"j.job_id = ANY(ARRAY(SELECT job_id FROM {handles}))"
        " AND j.job_id = h.job_id AND j.lease_generation = h.generation"
        f" AND j.lease_owner = %(worker)s AND (j.state IN ({LEASED_SQL})) IS TRUE"
    )


FENCE: Final = fence()

# Whether job ``j`` waits to be claimed, for a statement that names its jobs by id
# (the claims): written "IS TRUE", the same test, so that the planner cannot match
# it to jobs_claimable_idx. On a table never analyzed (a new database, or one
# autovacuum has not reached), the claim of 25 named jobs was planned as a bitmap
# AND of that index, read whole (an entry per waiting job), with their 25 primary
# keys: 2.7-4.1 ms a claim with 100,000 waiting, 0.84-1.14 ms by the keys alone
# (tests/test_claim_plan.py).
WAITING_BY_ID: Final = f"(j.state IN ({CLAIMABLE_SQL})) IS TRUE"

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

# The backstop of a refused wake-up. The relay brings it forward as soon as a
# consumer with the handler has a free slot (OUTBOX_WAKE_REFUSED); sent back at once,
# it met a consumer that could not run it either, round and round (about 870
# wake-ups per job in 10 s).
REFUSAL_BACKSTOP_SECONDS: Final = defaults.REFUSAL_BACKSTOP_SECONDS

# A weighed job turned down for its tenant's cap asks again after this long. The
# relay sends a capped tenant's wake-up once the tenant has one free slot; sent back
# at once, a job that needs more than that met the same cap round and round until
# enough leases ended.
WEIGHED_CAP_RETRY_SECONDS: Final = 1

# Bound (%(worker_ttl)s), not formatted in, because the relay takes it as a flag; its
# default, the consumer's, and the figure explain and jobctl use (which cannot know a
# relay's flag) are this one constant (its docstring in defaults says why one).
WORKER_TTL_SECONDS: Final = defaults.WORKER_TTL_SECONDS

# A consumer ``w`` a lease of which lapsed (the sweeper took it back) since it was
# last heard from: killed, or frozen.
LEASE_LAPSED: Final = "COALESCE(w.lease_lapsed_at >= w.last_seen_at, false)"

# A live consumer: heartbeating within the given number of seconds, not stopping,
# and heard from since the sweeper last took a lease of it back.
LIVE_WORKER = (
    "NOT w.stopping AND w.last_seen_at > now() - make_interval(secs => %(worker_ttl)s)"
    f" AND NOT {LEASE_LAPSED}"
)


# An ordered job ``{x}`` that a later one of its key waits behind: still waiting or
# running, or FAILED under ``ordered="strict"`` (until replayed). Exactly the
# predicate of jobs_key_order_idx, so the walk reads only such jobs.
KEY_AHEAD: Final = (
    f"({{x}}.state IN ({CLAIMABLE_SQL}, {LEASED_SQL})"
    " OR ({x}.state = 'FAILED' AND {x}.key_order = 'strict'))"
)


def no_pending_wakeup(job_id: str) -> str:
    """True when the job ``job_id`` (a column) has no unsent wake-up, as of now, not as
    of the statement's snapshot. The hand-offs ask it while they end a lease, and a
    snapshot can be stale there: the relay may since have sent the wake-up it shows
    unsent, and a claim turned the job down with the key or resource still held and
    deleted it; skipping the job then left it with none. So its wake-ups are locked
    (FOR SHARE), which reads each at its latest version (one sent meanwhile is not
    pending, one deleted is gone); one the relay is sending right now (SKIP LOCKED)
    counts as not pending either: the job gets another, and a duplicate wake-up
    settles harmlessly. One the lock holds stays unsent until this statement
    commits, and the claim it brings then sees the key or resource free.

    Read through the job's own index (outbox_job_id_idx) alone, fenced by OFFSET 0:
    left to itself, a generic plan guessed the backlog small and ANDed in the whole
    unsent index (outbox_due_idx), a scan of every waiting wake-up for each job woken
    (5 ms a job under a 20,000-job backlog: a keyed outcome of 67 jobs spent 347 of
    its 440 ms there)."""
    return (
        "NOT EXISTS (SELECT 1 FROM (SELECT o.sent_at FROM outbox AS o"
        f" WHERE o.job_id = {job_id} OFFSET 0 FOR SHARE OF o SKIP LOCKED) AS o"
        " WHERE o.sent_at IS NULL)"
    )


# A waiting job ``w`` whose queue is not paused: the relay sends its wake-up now.
QUEUE_RUNS: Final = "NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.queue = w.queue AND p.paused)"

# Whether any queue is paused: one read of the queues' rows for the whole statement
# (a test that depends on no row, so the plan makes it once), without which the
# step it guards finds nothing the step before it did not.
SOME_QUEUE_PAUSED: Final = "EXISTS (SELECT 1 FROM queues AS p WHERE p.paused)"


def key_wake_next(source: str) -> str:
    """A CTE ``key_woken``: for the jobs of ``source`` (a CTE with job_id) that no
    longer hold or wait for their key, a wake-up for the first due waiting jobs of
    each key, as many as left it, unless one is pending for them already. A job
    turned down for its key (KEY_BUSY, KEY_ORDER) got no wake-up back: this is
    what starts it, the next in key order first, so nothing polls a busy key. One
    probe of jobs_key_waiting_idx per key, and, while any queue is paused, a second
    for the waiters of paused queues: an unordered key's turn goes to a job whose
    queue runs, before one of a paused queue (whose wake-up the relay holds until
    the resume: the key would idle while the others wait); an ordered key's goes to
    the next in order, whatever its queue (none after it could run before it). A
    job whose refusal races with this statement still gets its wake-up: it had one
    in flight, so none pending, and is woken; a duplicate wake-up settles
    harmlessly."""
    return f"""key_left AS (
    SELECT j.key, count(*)::int AS n
    FROM {source} AS s JOIN jobs AS j ON j.job_id = s.job_id
    WHERE j.key IS NOT NULL
    GROUP BY j.key
), key_woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT n.job_id, n.queue, COALESCE(n.tenant, ''), n.priority, now()
    FROM key_left AS k
    CROSS JOIN LATERAL (
        SELECT c.job_id, c.queue, c.tenant, c.priority
        FROM (
            SELECT DISTINCT ON (c.job_id) c.*
            FROM (
                (SELECT w.job_id, w.queue, w.tenant, w.priority, w.key_seq, 1 AS pass
                 FROM jobs AS w
                 WHERE w.key = k.key AND w.state IN ({CLAIMABLE_SQL}) AND w.run_after <= now()
                   AND w.job_id NOT IN (SELECT job_id FROM {source})
                   AND (w.key_seq IS NOT NULL OR {QUEUE_RUNS})
                 ORDER BY w.key_seq, w.job_id
                 LIMIT k.n)
                UNION ALL
                (SELECT w.job_id, w.queue, w.tenant, w.priority, w.key_seq, 2 AS pass
                 FROM jobs AS w
                 WHERE w.key = k.key AND w.state IN ({CLAIMABLE_SQL}) AND w.run_after <= now()
                   AND w.job_id NOT IN (SELECT job_id FROM {source})
                   AND {SOME_QUEUE_PAUSED}
                 ORDER BY w.key_seq, w.job_id
                 LIMIT k.n)
            ) AS c
            ORDER BY c.job_id, c.pass
        ) AS c
        ORDER BY c.pass, c.key_seq, c.job_id
        LIMIT k.n
    ) AS n
    WHERE {no_pending_wakeup("n.job_id")}
)"""


def resource_wake_next(released: str) -> str:
    """A CTE ``resource_woken``: for each resource of ``released`` (a CTE with a
    resource column) that is free again, a wake-up for one due job waiting for it,
    unless one is pending for it already. A job turned down for its resource
    (RESOURCE_BUSY, RESOURCE_UNCERTAIN) got no wake-up back: this is what starts it,
    so nothing polls a held resource. The oldest of those turned down for it goes
    first (jobs_resource_refused_idx), else the oldest waiting (a job this
    statement's snapshot shows with another reason may have met the resource in a
    claim that has not committed, and its wake-up, in flight, is not pending; a
    duplicate wake-up settles harmlessly); either of a queue that runs, else the
    oldest of a paused one, whose wake-up waits for the resume. At most three probes
    of an index in its order, however many wait (past those of paused queues, while
    one is paused). The one woken, once it ends, wakes the next, and so does any
    end of it before it ran (jobs_hand_on)."""
    return f"""resource_woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT n.job_id, n.queue, COALESCE(n.tenant, ''), n.priority, now()
    FROM (SELECT DISTINCT resource FROM {released}) AS r
    CROSS JOIN LATERAL (
        SELECT c.* FROM (
            (SELECT w.job_id, w.queue, w.tenant, w.priority
             FROM jobs AS w
             WHERE w.resource = r.resource AND w.state IN ({CLAIMABLE_SQL})
               AND w.delay_reason IN ({RESOURCE_REFUSALS_SQL}) AND w.run_after <= now()
               AND {QUEUE_RUNS}
             ORDER BY w.job_id
             LIMIT 1)
            UNION ALL
            (SELECT w.job_id, w.queue, w.tenant, w.priority
             FROM jobs AS w
             WHERE w.resource = r.resource AND w.state IN ({CLAIMABLE_SQL})
               AND w.run_after <= now() AND {QUEUE_RUNS}
             ORDER BY w.job_id
             LIMIT 1)
            UNION ALL
            (SELECT w.job_id, w.queue, w.tenant, w.priority
             FROM jobs AS w
             WHERE w.resource = r.resource AND w.state IN ({CLAIMABLE_SQL})
               AND w.run_after <= now()
             ORDER BY w.job_id
             LIMIT 1)
        ) AS c
        LIMIT 1
    ) AS n
    WHERE {no_pending_wakeup("n.job_id")}
)"""


def limit_wake_next(source: str, slots: str = "count(*)") -> str:
    """CTEs ending in ``limit_woken``: for the leases of ``source`` that held a slot
    of their type's concurrency limit (jobs.limit_held, as the statement's snapshot
    shows it: the ending statement clears it), the slots given back and a wake-up
    for as many of the type's jobs turned down for it (CONCURRENCY_LIMIT), oldest
    first, unless one is pending for them already. Such a job got no wake-up back:
    this is what starts it, so nothing polls a full limit. The waiters are read by
    concurrency_limit_waiters (migration 0033) once the type's row is locked, with a
    snapshot of the function's own: the statement's, taken before it waited for the
    row, misses a job a claim holding the row turned down meanwhile. One probe of
    jobs_limit_waiting_idx per type, and a second for the waiters of paused queues:
    a job whose queue runs goes first (a paused queue's wake-up waits for the
    resume). A waiter heavier than the slots free once these come back is passed
    over: waking it would use up the turn of a lighter one that fits, and a later
    end that frees enough wakes it. The rows are locked in type order before the
    tenants', as the claim locks them. ``slots``: what each lease gives back (one;
    or its weight, read from ``j``), and as many waiters are woken as slots came
    back."""
    return f"""limit_left AS (
    SELECT j.job_type, {slots}::int AS n
    FROM {source} AS s JOIN jobs AS j ON j.job_id = s.job_id
    WHERE j.limit_held
    GROUP BY j.job_type
), limit_releasing AS MATERIALIZED (
    -- free: the slots free once these come back
    SELECT c.job_type, k.n, c.max_running - GREATEST(c.running - k.n, 0) AS free
    FROM concurrency_limits AS c JOIN limit_left AS k USING (job_type)
    ORDER BY c.job_type
    FOR NO KEY UPDATE OF c
), limit_released AS (
    -- never below zero, as the tenants' slots
    UPDATE concurrency_limits AS c SET running = GREATEST(c.running - r.n, 0)
    FROM limit_releasing AS r
    WHERE c.job_type = r.job_type
), limit_woken AS (
    -- the waiters as they are now, not as this statement's snapshot has them: a
    -- claim that held the row turned one down meanwhile (migration 0033)
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT n.job_id, n.queue, COALESCE(n.tenant, ''), n.priority, now()
    FROM limit_releasing AS k
    CROSS JOIN LATERAL concurrency_limit_waiters(
        k.job_type, k.n, k.free, ARRAY(SELECT s.job_id FROM {source} AS s)) AS n
    WHERE {no_pending_wakeup("n.job_id")}
)"""


def queue_limit_wake_next(source: str, slots: str = "count(*)", after: str = "") -> str:
    """CTEs ending in ``queue_limit_woken``: :func:`limit_wake_next` for the leases
    of ``source`` that held a slot of their queue's concurrency limit
    (jobs.queue_limit_held): the slots given back and a wake-up for as many of the
    queue's jobs turned down for it (QUEUE_CONCURRENCY_LIMIT), oldest first, that
    fit the slots free then. The waiters are read by queue_limit_waiters (migration
    0034) once the queue's row is locked, with a snapshot taken then: a claim
    holding the row may have turned one down meanwhile. The rows are locked in
    queue order after the types' limits (``after``, their CTE, when this statement
    releases some) and before the tenants', as the claim locks them."""
    first = f"\n    WHERE (SELECT count(*) FROM {after}) >= 0" if after else ""
    return f"""queue_limit_left AS (
    SELECT j.queue, {slots}::int AS n
    FROM {source} AS s JOIN jobs AS j ON j.job_id = s.job_id
    WHERE j.queue_limit_held
    GROUP BY j.queue
), queue_limit_releasing AS MATERIALIZED (
    -- free: the slots free once these come back
    SELECT c.queue, k.n, c.max_running - GREATEST(c.running - k.n, 0) AS free
    FROM queue_limits AS c JOIN queue_limit_left AS k USING (queue){first}
    ORDER BY c.queue
    FOR NO KEY UPDATE OF c
), queue_limit_released AS (
    -- never below zero, as the tenants' slots
    UPDATE queue_limits AS c SET running = GREATEST(c.running - r.n, 0)
    FROM queue_limit_releasing AS r
    WHERE c.queue = r.queue
), queue_limit_woken AS (
    -- the waiters as they are now, not as this statement's snapshot has them
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT n.job_id, n.queue, COALESCE(n.tenant, ''), n.priority, now()
    FROM queue_limit_releasing AS k
    CROSS JOIN LATERAL queue_limit_waiters(
        k.queue, k.n, k.free, ARRAY(SELECT s.job_id FROM {source} AS s)) AS n
    WHERE {no_pending_wakeup("n.job_id")}
)"""


def turns_passed_on_at_pause(queue: str) -> str:
    """CTEs ending in ``limit_woken``, for the statement that pauses the queue
    ``queue`` (a parameter): the turns its waiting jobs hold are passed on. A free
    key, resource or slot of a type's concurrency limit that woke one of its jobs
    would otherwise idle until the resume (the relay holds a paused queue's
    wake-ups), while jobs of queues that run wait for it with none. For each
    unordered key with waiting jobs of the queue that have a wake-up, as many of
    its waiting jobs of running queues are woken, first in key order; for each free
    resource with one, its first of a running queue (one it turned down first); for
    each type's limit with free slots, as many of the jobs of running queues it
    turned down, oldest first, that fit. The paused queue's jobs keep their wake-ups
    for the resume; a job woken for a key or resource that turns out busy is turned
    down and waits for the next hand-off. An ordered key's turn stays with the next
    in order, whatever its queue. The statement's snapshot does not see the pause,
    so the queue is left out by name. Read through the partial indexes of jobs
    waiting with a key, a resource or a limit's refusal: 8-18 ms with a million
    waiting jobs in the queue, a thousand of them keyed."""
    return f"""held AS MATERIALIZED (
    -- the queue's waiting jobs with a wake-up that wait for a key, a resource or
    -- their type's concurrency limit
    SELECT j.job_id, j.key, j.key_seq, j.resource, j.job_type,
           j.delay_reason = '{DelayReason.CONCURRENCY_LIMIT}' AS limited
    FROM outbox AS o JOIN jobs AS j ON j.job_id = o.job_id
    WHERE o.queue = {queue} AND j.state IN ({CLAIMABLE_SQL})
      AND (j.key IS NOT NULL OR j.resource IS NOT NULL
           OR j.delay_reason = '{DelayReason.CONCURRENCY_LIMIT}')
), key_passed AS (
    SELECT h.key, count(DISTINCT h.job_id)::int AS n
    FROM held AS h WHERE h.key IS NOT NULL AND h.key_seq IS NULL
    GROUP BY h.key
), key_woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT n.job_id, n.queue, COALESCE(n.tenant, ''), n.priority, now()
    FROM key_passed AS k
    CROSS JOIN LATERAL (
        SELECT w.job_id, w.queue, w.tenant, w.priority FROM jobs AS w
        WHERE w.key = k.key AND w.state IN ({CLAIMABLE_SQL}) AND w.run_after <= now()
          AND w.queue <> {queue} AND {QUEUE_RUNS}
        ORDER BY w.key_seq, w.job_id
        LIMIT k.n
    ) AS n
    WHERE {no_pending_wakeup("n.job_id")}
), resource_woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT n.job_id, n.queue, COALESCE(n.tenant, ''), n.priority, now()
    FROM (SELECT DISTINCT h.resource FROM held AS h
          WHERE h.resource IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM resource_holds AS r WHERE r.resource = h.resource))
         AS r
    CROSS JOIN LATERAL (
        SELECT w.job_id, w.queue, w.tenant, w.priority FROM jobs AS w
        WHERE w.resource = r.resource AND w.state IN ({CLAIMABLE_SQL})
          AND w.run_after <= now() AND w.queue <> {queue} AND {QUEUE_RUNS}
        ORDER BY (w.delay_reason IN ({RESOURCE_REFUSALS_SQL})) IS TRUE DESC, w.job_id
        LIMIT 1
    ) AS n
    WHERE {no_pending_wakeup("n.job_id")}
), limit_woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT n.job_id, n.queue, COALESCE(n.tenant, ''), n.priority, now()
    FROM (SELECT c.job_type, count(DISTINCT h.job_id)::int AS n,
                 c.max_running - c.running AS free
          FROM held AS h JOIN concurrency_limits AS c USING (job_type)
          WHERE h.limited AND c.running < c.max_running
          GROUP BY c.job_type, c.max_running, c.running) AS k
    CROSS JOIN LATERAL (
        SELECT w.job_id, w.queue, w.tenant, w.priority FROM jobs AS w
        WHERE w.job_type = k.job_type AND w.state IN ({CLAIMABLE_SQL})
          AND w.delay_reason = '{DelayReason.CONCURRENCY_LIMIT}'
          AND w.run_after <= now() AND COALESCE(w.weight, 1) <= k.free
          AND w.queue <> {queue} AND {QUEUE_RUNS}
        ORDER BY w.job_id
        LIMIT k.n
    ) AS n
    WHERE {no_pending_wakeup("n.job_id")}
)"""


def lease_ended(source: str, *, expired: bool = False, gates: frozenset[str] = HELD_GATES) -> str:
    """The tail of every statement that ends a lease (outcome, give-back, sweep):
    the attempt's history row, a wake-up for a job that will run again, and the
    release of the tenant slot the lease held and of its key (key_usage, whose row
    goes once no lease holds the key) with a wake-up for the key's next waiting
    job, all in the statement that ended it, so none can happen twice or be
    forgotten. (Every leased job with a key holds it: the claim takes a lease only
    with its key. A key never changes, so the statement's snapshot of jobs says
    which.) The hold of its resource (resource_holds), if it has one, is deleted
    and the resource's next waiting job woken; but for a lease that ``expired``
    (the sweeper) it stays, marked uncertain_since: the holder vanished mid-work,
    and nobody knows what it did to the target, so nothing of the resource starts
    until :data:`~schema.queries.resource.RESOURCE_RESOLVE`. Only the hold of the
    very lease that ended (job and generation) is touched: a late outcome of an
    expired lease matches no fence, so it cannot free the uncertain hold.

    ``source`` names a CTE of the rows that left the lease, with the columns
    job_id, state (the new one), queue, tenant, priority, run_after, attempt,
    lease_generation, worker, ready_at, started_at, held_slot, error_code,
    error_message and traceback.

    ``gates``: what the leases of ``source`` may hold (of :data:`HELD_GATES`; the
    caller's statement made sure they hold nothing else): the steps of the others
    are left out, so a lease that held nothing ends with the tenant slots. A lease
    that held a slot of its type's concurrency limit gives it back, first
    (:func:`limit_wake_next`), and one of its queue's limit next
    (:func:`queue_limit_wake_next`).
    """
    limit = "concurrency" in gates
    queue_limited = "queue_limit" in gates
    # A weighed lease gives back its weight of every slot it took (jobs.weight never
    # changes, so the statement's snapshot says it).
    slots = "sum(COALESCE(j.weight, 1))" if "weight" in gates else "count(*)"
    held = (
        f"SELECT s.tenant, {slots} AS slots FROM {source} AS s"
        " JOIN jobs AS j ON j.job_id = s.job_id WHERE s.held_slot GROUP BY s.tenant"
        if "weight" in gates
        else f"SELECT tenant, count(*) AS slots FROM {source} WHERE held_slot GROUP BY tenant"
    )
    # the limits' rows before the tenants' (the scalar subquery makes them go first)
    last_limit = "queue_limit_releasing" if queue_limited else "limit_releasing" if limit else ""
    limits_first = f" AND (SELECT count(*) FROM {last_limit}) >= 0" if last_limit else ""
    queue_wake = (
        queue_limit_wake_next(source, slots, "limit_releasing" if limit else "") + ", "
        if queue_limited
        else ""
    )
    ended = f"""history AS (
    INSERT INTO job_attempts (job_id, attempt, lease_generation, worker, ready_at, started_at,
                              finished_at, outcome, error_code, error_message, traceback)
    SELECT job_id, attempt, lease_generation, worker, ready_at, started_at,
           statement_timestamp(), state, error_code, error_message, traceback
    FROM {source}
), woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT job_id, queue, COALESCE(tenant, ''), priority, run_after
    FROM {source} WHERE state IN ({CLAIMABLE_SQL})
), {limit_wake_next(source, slots) + ", " if limit else ""}{queue_wake}releasing AS MATERIALIZED (
    -- Locked in tenant order, as the claim locks them: two statements that touch
    -- several tenants never wait for each other in a circle.
    SELECT u.tenant, r.slots
    FROM tenant_usage AS u
    JOIN ({held}) AS r
      ON r.tenant = u.tenant{limits_first}
    ORDER BY u.tenant
    FOR NO KEY UPDATE OF u
), released AS (
    -- never below zero: drift is the reconciler's to repair, never a reason to
    -- refuse an outcome
    UPDATE tenant_usage AS u SET running = GREATEST(u.running - r.slots, 0)
    FROM releasing AS r
    WHERE u.tenant = r.tenant
)"""
    if "key" in gates:
        ended = f"""{ended}, {_key_end(source)}"""
    if "resource" in gates:
        after = "key_releasing" if "key" in gates else "releasing"
        ended = f"""{ended}, {_resource_end(source, after, expired)}"""
    return ended


def _key_end(source: str) -> str:
    return f"""{key_wake_next(source)}, key_releasing AS MATERIALIZED (
    -- after the tenants (the scalar subquery makes them go first), in key order,
    -- as the claim takes them
    SELECT u.key, u.running, k.n
    FROM key_usage AS u JOIN key_left AS k ON k.key = u.key
    WHERE (SELECT count(*) FROM releasing) >= 0
    ORDER BY u.key
    FOR UPDATE OF u
), key_released AS (
    UPDATE key_usage AS u SET running = r.running - r.n
    FROM key_releasing AS r
    WHERE u.key = r.key AND r.running > r.n
), key_freed AS (
    -- the last lease of the key: no row kept for an idle key
    DELETE FROM key_usage AS u USING key_releasing AS r
    WHERE u.key = r.key AND r.running <= r.n
)"""


def _resource_end(source: str, after: str, expired: bool) -> str:
    return f"""resource_left AS (
    -- the leases that ended with a resource (none: one probe per job, of rows
    -- already read for the keys)
    SELECT j.resource, s.job_id, s.lease_generation
    FROM {source} AS s JOIN jobs AS j ON j.job_id = s.job_id
    WHERE j.resource IS NOT NULL
), resource_releasing AS MATERIALIZED (
    -- after the tenants and the keys (the scalar subquery), in resource order, as the
    -- claim takes them; only this lease's own hold
    SELECT h.resource
    FROM resource_holds AS h
    JOIN resource_left AS l
      ON l.resource = h.resource AND l.job_id = h.job_id
     AND l.lease_generation = h.lease_generation
    WHERE (SELECT count(*) FROM {after}) >= 0 AND h.uncertain_since IS NULL
    ORDER BY h.resource
    FOR UPDATE OF h
), {_resource_freed(expired)}"""


def _resource_freed(expired: bool) -> str:
    if expired:
        return """resource_uncertain AS (
    -- the holder vanished: the hold stays, and says since when
    UPDATE resource_holds AS h SET uncertain_since = now()
    FROM resource_releasing AS r
    WHERE h.resource = r.resource
)"""
    return f"""resource_freed AS (
    DELETE FROM resource_holds AS h USING resource_releasing AS r
    WHERE h.resource = r.resource
    RETURNING h.resource
), {resource_wake_next("resource_freed")}"""


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
