"""The outbox: the relay's decision of what to wake, and the repair of wake-ups that
were lost or never written."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.locks import INSTANCE_SEED, WAKE_LOCK_PREFIX
from hybrid_jobs.schema.queries.fragments import KEY_AHEAD, LIVE_WORKER, UNTAKEN
from hybrid_jobs.schema.states import DelayReason, HeldReason
from hybrid_jobs.schema.tables import CLAIMABLE_SQL, CLOCK_ROW, LEASED_SQL

# Jobs that waited for a consumer that knows their type, or (NO_AUTHORIZED_RUNNER)
# for one that names their dedicated tenant: woken when one announces itself (and by
# the re-waker, as a backstop), without waiting for the periodic re-wake. Each
# branch reads its own partial index (jobs_no_handler_idx, jobs_no_runner_idx).
JOB_WAKE_PARKED: Final = f"""
INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
SELECT p.job_id, p.queue, COALESCE(p.tenant, ''), p.priority, now()
FROM (SELECT j.job_id, j.queue, j.tenant, j.priority
      FROM jobs AS j
      WHERE j.delay_reason = '{DelayReason.NO_HANDLER}' AND j.state IN ({CLAIMABLE_SQL})
        AND j.queue = ANY(%(queues)s::text[]) AND j.job_type = ANY(%(job_types)s::text[])
      UNION ALL
      SELECT j.job_id, j.queue, j.tenant, j.priority
      FROM jobs AS j
      WHERE j.delay_reason = '{DelayReason.NO_AUTHORIZED_RUNNER}'
        AND j.state IN ({CLAIMABLE_SQL})
        AND j.tenant = ANY(%(tenants)s::text[]) AND j.queue = ANY(%(queues)s::text[])
        AND j.job_type = ANY(%(job_types)s::text[])) AS p
WHERE NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.job_id = p.job_id)
RETURNING job_id
"""

# Jobs turned down as heavier than the whole concurrency of the consumer that
# claimed them (WEIGHT_OVER_CONCURRENCY) ask again after the refusal backstop. A
# consumer that starts with room for them (its --concurrency at least their weight;
# a job enqueued without one takes its handler's, unknown here, so it is woken and
# its claim decides) brings their wake-ups forward: each one waiting in the backlog
# is replaced by one due now, whose insert tells the relay. Reads jobs_too_heavy_idx,
# which holds only such jobs.
JOB_WAKE_HEAVY: Final = f"""
WITH later AS (
    DELETE FROM outbox AS o
    USING jobs AS j
    WHERE j.delay_reason = '{DelayReason.WEIGHT_OVER_CONCURRENCY}' AND j.state IN ({CLAIMABLE_SQL})
      AND j.queue = ANY(%(queues)s::text[]) AND j.job_type = ANY(%(job_types)s::text[])
      AND (j.weight IS NULL OR j.weight <= %(concurrency)s)
      AND o.job_id = j.job_id AND o.sent_at IS NULL AND o.available_at > now()
    RETURNING o.job_id, o.queue, o.tenant, o.priority
)
INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
SELECT job_id, queue, tenant, priority, now() FROM later
RETURNING job_id
"""

# The wake-ups of a batch of plain jobs written by JOB_COPY, one a job, due when the
# job is (its run_after); a tenant's as its name, a job of no tenant's as ''. The
# outbox's trigger notifies the relay as for an insert.
OUTBOX_COPY: Final = "COPY outbox (job_id, queue, tenant, priority, available_at) FROM STDIN"

# Wake-ups a consumer turned down for want of a handler (or of a runner naming the
# job's dedicated tenant, NO_AUTHORIZED_RUNNER: the same walk by tenant and queue)
# wait the backstop
# (REFUSAL_BACKSTOP_SECONDS, see JOB_CLAIM_MANY): run by the relay every
# --refusal-interval, this brings them forward once a live consumer that has the
# handler has a free slot (its concurrency, less the leases it holds), at most as
# many as there are such slots, in one statement. What changes the answer is room
# at a consumer that can run the job; until then nothing is sent, and a wake-up
# sent because of it goes, like any, to whichever consumer RabbitMQ picks.
#
# Bounded by what waits: the kinds (queue, job type) of refused jobs come from a
# skip scan of jobs_no_handler_idx (empty, one probe, when nothing waits), the room
# from the leased jobs (at most the fleet's concurrency) and the workers, and the
# rows per kind stop at its room. Returns the queue of each wake-up moved, then a
# row with a NULL queue if any refused job waits at all (the relay looks more often
# while some do).
OUTBOX_WAKE_REFUSED: Final = f"""
WITH RECURSIVE kinds AS (
    (SELECT j.queue, j.job_type FROM jobs AS j
     WHERE j.delay_reason = '{DelayReason.NO_HANDLER}' AND j.state IN ({CLAIMABLE_SQL})
     ORDER BY j.queue, j.job_type LIMIT 1)
    UNION ALL
    SELECT n.queue, n.job_type
    FROM kinds AS k
    CROSS JOIN LATERAL (
        SELECT j.queue, j.job_type FROM jobs AS j
        WHERE j.delay_reason = '{DelayReason.NO_HANDLER}' AND j.state IN ({CLAIMABLE_SQL})
          AND (j.queue, j.job_type) > (k.queue, k.job_type)
        ORDER BY j.queue, j.job_type LIMIT 1
    ) AS n
), tenant_kinds AS (
    -- the same for jobs refused for want of a consumer naming their dedicated
    -- tenant (jobs_no_runner_idx): their kinds are (tenant, queue)
    (SELECT j.tenant, j.queue FROM jobs AS j
     WHERE j.delay_reason = '{DelayReason.NO_AUTHORIZED_RUNNER}' AND j.state IN ({CLAIMABLE_SQL})
     ORDER BY j.tenant, j.queue LIMIT 1)
    UNION ALL
    SELECT n.tenant, n.queue
    FROM tenant_kinds AS k
    CROSS JOIN LATERAL (
        SELECT j.tenant, j.queue FROM jobs AS j
        WHERE j.delay_reason = '{DelayReason.NO_AUTHORIZED_RUNNER}' AND j.state IN ({CLAIMABLE_SQL})
          AND (j.tenant, j.queue) > (k.tenant, k.queue)
        ORDER BY j.tenant, j.queue LIMIT 1
    ) AS n
), held AS (
    SELECT j.lease_owner AS worker_id, count(*)::int AS n
    FROM jobs AS j
    WHERE j.state IN ({LEASED_SQL})
      AND (EXISTS (SELECT 1 FROM kinds) OR EXISTS (SELECT 1 FROM tenant_kinds))
    GROUP BY j.lease_owner
), room AS (
    SELECT k.queue, k.job_type,
           (SELECT COALESCE(sum(w.concurrency - COALESCE(h.n, 0)), 0)::int
            FROM workers AS w LEFT JOIN held AS h USING (worker_id)
            WHERE {LIVE_WORKER} AND k.queue = ANY(w.queues) AND k.job_type = ANY(w.job_types)
              AND w.concurrency > COALESCE(h.n, 0)) AS free
    FROM kinds AS k
), chosen AS (
    SELECT c.id
    FROM room AS r
    CROSS JOIN LATERAL (
        SELECT o.id FROM jobs AS j JOIN outbox AS o ON o.job_id = j.job_id
        WHERE j.delay_reason = '{DelayReason.NO_HANDLER}' AND j.state IN ({CLAIMABLE_SQL})
          AND j.queue = r.queue AND j.job_type = r.job_type
          AND o.sent_at IS NULL AND o.available_at > now()
        ORDER BY j.queue, j.job_type  -- the index's order: a walk that stops at the room
        LIMIT r.free
    ) AS c
    WHERE r.free > 0
), tenant_room AS (
    SELECT k.tenant, k.queue,
           (SELECT COALESCE(sum(w.concurrency - COALESCE(h.n, 0)), 0)::int
            FROM workers AS w LEFT JOIN held AS h USING (worker_id)
            WHERE {LIVE_WORKER} AND k.queue = ANY(w.queues) AND k.tenant = ANY(w.tenants)
              AND w.concurrency > COALESCE(h.n, 0)) AS free
    FROM tenant_kinds AS k
), tenant_chosen AS (
    SELECT c.id
    FROM tenant_room AS r
    CROSS JOIN LATERAL (
        SELECT o.id FROM jobs AS j JOIN outbox AS o ON o.job_id = j.job_id
        WHERE j.delay_reason = '{DelayReason.NO_AUTHORIZED_RUNNER}' AND j.state IN ({CLAIMABLE_SQL})
          AND j.tenant = r.tenant AND j.queue = r.queue
          AND o.sent_at IS NULL AND o.available_at > now()
        ORDER BY j.tenant, j.queue
        LIMIT r.free
    ) AS c
    WHERE r.free > 0
), moved AS (
    SELECT o.id FROM outbox AS o
    WHERE (o.id IN (SELECT id FROM chosen) OR o.id IN (SELECT id FROM tenant_chosen))
      AND o.sent_at IS NULL AND o.available_at > now()
    FOR UPDATE SKIP LOCKED
), brought AS (
    UPDATE outbox AS o SET available_at = now()
    FROM moved WHERE o.id = moved.id
    RETURNING o.queue
)
SELECT queue FROM brought
UNION ALL
SELECT NULL WHERE EXISTS (SELECT 1 FROM kinds) OR EXISTS (SELECT 1 FROM tenant_kinds)
"""

# The queues that have wake-ups due, by a loose index scan of the backlog (a few
# index probes, however long the backlog).
OUTBOX_DUE_QUEUES: Final = """
WITH RECURSIVE q AS (
    (SELECT queue FROM outbox WHERE sent_at IS NULL ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT o.queue FROM outbox AS o
            WHERE o.sent_at IS NULL AND o.queue > q.queue ORDER BY o.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL
)
SELECT q.queue FROM q
WHERE q.queue IS NOT NULL
  AND EXISTS (SELECT 1 FROM outbox AS o
              WHERE o.sent_at IS NULL AND o.queue = q.queue AND o.available_at <= now())
"""


# Pieces of the decision below.
def _fetch(limit: str, short: str) -> str:
    """Each contender's (``quotas AS q``) first due wake-ups in its own order, at most
    ``limit`` and one more (the spare, fetched to tell that more waits), with each
    one's virtual start; ``short``: whether a spare marks a horizon (the limit was
    a quota, short of what the tenant could get)."""
    return f"""SELECT c.id, c.job_id, c.priority, c.available_at, q.tenant, c.k,
           q.start + (c.k - 1) / q.weight AS vstart,
           c.k > {limit} AS spare,
           {short} AS short
    FROM quotas AS q
    CROSS JOIN LATERAL (
        SELECT o.id, o.job_id, o.priority, o.available_at,
               row_number() OVER (ORDER BY o.priority DESC, o.available_at, o.id) AS k
        FROM outbox AS o
        WHERE o.queue = %(queue)s AND o.tenant = q.tenant AND o.sent_at IS NULL
          AND o.available_at <= now()
        ORDER BY o.priority DESC, o.available_at, o.id
        LIMIT {limit} + 1
    ) AS c"""


def _horizon(candidates: str) -> str:
    """The earliest spare of a tenant cut short by its quota, in the decision's
    order: every wake-up before it was fetched."""
    return f"""SELECT -c.priority AS p, c.vstart, c.available_at, c.id
    FROM {candidates} AS c
    WHERE c.spare AND c.short
    ORDER BY 1, 2, 3, 4
    LIMIT 1"""


def _probed_shares(firsts: str) -> str:
    """The shares of the tenants of ``firsts`` (``d``), each row of their limits,
    usage and pass looked up by its key."""
    return f"""SELECT {_share_columns()}
    FROM {firsts} AS d
    LEFT JOIN LATERAL (SELECT weight, max_running FROM tenant_limits AS l
                       WHERE l.tenant = d.tenant LIMIT 1) AS l ON true
    LEFT JOIN LATERAL (SELECT running FROM tenant_usage AS u
                       WHERE u.tenant = d.tenant LIMIT 1) AS u ON true
    LEFT JOIN LATERAL (SELECT vpass, held_reason FROM fair_shares AS s
                       WHERE s.queue = %(queue)s AND s.tenant = d.tenant LIMIT 1) AS s ON true
    LEFT JOIN inflight AS f ON f.tenant = d.tenant"""


# Up to this many tenants with due wake-ups, a pass that reads every tenant looks
# their limits, usage and passes up one by one; past it, it reads those tables
# whole (a probe costs about what reading 15 of their rows does).
PROBED_SHARES_AT_MOST: Final = 64


def _share_columns() -> str:
    """The columns of a tenant's share (``shares``, ``near_shares``), of its first due
    wake-up ``d``, its limits ``l``, usage ``u``, pass ``s`` and wake-ups in flight ``f``."""
    return """d.tenant,
           COALESCE(l.weight, 1) AS weight,
           GREATEST(COALESCE(s.vpass, 0), (SELECT v FROM clock)) AS start,
           -- A capped tenant's room: its free slots, less its wake-ups in flight in
           -- this queue (those of other queues are theirs to count; the claim holds
           -- the cap exactly whatever the relay sends).
           CASE WHEN l.max_running IS NULL THEN NULL
                ELSE GREATEST(0, l.max_running - COALESCE(u.running, 0) - COALESCE(f.n, 0))
           END AS cap_room,
           s.held_reason,
           -- its first due wake-up (none: nothing of it is due)
           d.priority, d.available_at, d.id"""


# Steps 1 and 2 of both decisions (the whole one and the one for a queue whose
# wake-ups have no tenant): the queue's lock, the settling of the wake-ups in
# flight whose job was taken up, and the room left in the window.
_ROOM: Final = f"""gate AS (
    -- 1a. the queue's lock: without it this pass settles, reads and sends nothing
    SELECT pg_try_advisory_xact_lock(
        hashtextextended('{WAKE_LOCK_PREFIX}' || %(queue)s, {INSTANCE_SEED})) AS ok
), settled AS (
    -- 1b. settle the wake-ups in flight whose job was taken up since. (Each job is
    -- looked up by its id in a sub-select: joined, with the jobs table's statistics
    -- stale (a burst of enqueues since its last analyze), it was planned as a hash
    -- join over a scan of every job, 3.5 ms a pass at 20,000.)
    DELETE FROM outbox AS o
    WHERE (SELECT ok FROM gate) AND o.queue = %(queue)s AND o.sent_at IS NOT NULL
      AND (SELECT NOT ({UNTAKEN}) FROM jobs AS j WHERE j.job_id = o.job_id)
    RETURNING o.id
), capacity AS (
    -- 2a. the window: given, or twice the live consumers' capacity and the slack
    -- the relay adds for what they take while its decision runs
    SELECT COALESCE(%(window)s::int, GREATEST(%(min_window)s::int, (
               SELECT 2 * sum(w.concurrency)::int FROM workers AS w
               WHERE %(queue)s = ANY(w.queues) AND {LIVE_WORKER}))
               + %(slack)s::int) AS size
), pause AS (
    -- 2b. whether the queue is paused
    SELECT EXISTS (SELECT 1 FROM queues WHERE queue = %(queue)s AND paused) AS paused
), room AS (
    -- 2c. room: the window less the wake-ups still in flight (none while paused)
    SELECT CASE
               WHEN NOT (SELECT ok FROM gate) THEN 0
               WHEN (SELECT paused FROM pause) THEN 0
               ELSE GREATEST(0, LEAST(%(limit)s::int, (SELECT size FROM capacity)
                   - (SELECT count(*) FROM outbox AS i
                      WHERE i.queue = %(queue)s AND i.sent_at IS NOT NULL)::int
                   + (SELECT count(*) FROM settled)::int))
           END AS n
)"""


# Step 4a of both decisions: the wake-ups of ``chosen`` locked, each by its id.
_MARKED: Final = """marked AS (
    -- 4a. the chosen ones, locked (one another transaction holds is skipped, and
    -- not replaced: it goes in a later pass) ...
    -- (Each looked up by its id, and marked in 4b by the array of their ids: joined
    -- to the chosen rows, whose number the planner cannot know, they were planned as
    -- a hash join over a scan of every unsent wake-up, twice, 23 ms a pass with
    -- 50,000 due. A lock in a lateral sub-select is a loop over the chosen rows.)
    SELECT l.id
    FROM chosen AS c
    CROSS JOIN LATERAL (
        SELECT o.id FROM outbox AS o
        WHERE o.id = c.id AND o.sent_at IS NULL
        FOR UPDATE SKIP LOCKED
    ) AS l
)"""


# The relay's one decision: which of a queue's due wake-ups to send now. In the
# relay's transaction, under a per-queue advisory lock (another relay skips the
# queue meanwhile), in one statement:
#
# 1. settle: wake-ups in flight whose job has been taken up since (claimed, finished,
#    or turned down: the claim deletes those) leave the table;
# 2. room: the queue's window (given, or twice the capacity of its live consumers,
#    at least min_window, plus the relay's slack) minus the wake-ups still in
#    flight; none while paused;
# 3. order: higher priority first; within a priority, weighted fair share between
#    the queue's tenants by start-time fair queuing: a tenant's k-th wake-up gets the
#    virtual start max(its pass, the queue's clock) + (k-1)/weight, so a tenant of
#    weight 2 gets twice the share of a busy queue, and an idle tenant, whose pass
#    has fallen behind the clock, banks no credit; then age. A capped tenant gets
#    no more than its free slots minus its wake-ups in flight;
# 4. mark the chosen ones sent (the caller publishes them before it commits), move
#    the passes and the clock on, and note per tenant why wake-ups were held back
#    (QUEUE_PAUSED, TENANT_CAP, WINDOW, FAIR_SHARE), only when that changed.
#
# What a pass reads is bounded by the room it fills, plus, per tenant with a
# backlog, one index probe or, where tenants have few wake-ups each, a few index
# rows:
#
# - with no room (a full window, an ongoing pause) or without the lock it reads no
#   tenant at all. The tenants' reasons stay as the last pass with room left them,
#   except that the start and the end of a pause are noted for every tenant (the
#   clock row remembers whether the queue was paused, to tell);
# - each tenant's first unsent wake-up is its first due one unless that one is not
#   due yet. They are found by one read of the queue's first unsent wake-ups in
#   tenant order, as many as the relay asks for (about four per tenant the last
#   pass found: a pass reads about as many rows as a probe per tenant would cost,
#   or fewer), and past where that read was cut short, by a skip scan (one probe
#   per tenant). The in-flight wake-ups are counted per tenant once;
# - where a queue has many tenants, the relay asks (near) for the next tenants only:
#   the first wake-ups across tenants in the order they go (outbox_turn_idx), a few
#   times the room, give the tenants whose first due one is among them. When those
#   are the contenders all tenants' heads would give (see 3c8), the pass reads,
#   orders and notes reasons for them alone, and costs the room, not the tenants.
#   Otherwise it reads every tenant as above. The tenants it did not read keep the
#   reasons the last full read noted; while passes with room go on, the relay reads
#   every tenant once a second, or less often where that read takes long
#   (relay/wake.py);
# - only the tenants whose first due wake-up would go first can be sent anything:
#   a tenant's first wake-up goes before its others, so `room` tenants whose first
#   ones go before a tenant's first leave it nothing. At most `room` tenants
#   contend, and each fetches only about its share of the room (its quota: the
#   room spread by weight from the tenants' virtual starts, twice over), plus one
#   to tell that more waits. A tenant cut short by its quota marks a horizon:
#   every wake-up before its first unfetched one was fetched, so choosing only
#   wake-ups before the earliest such horizon sends exactly the first ones in the
#   order above, never one out of turn. When the horizon leaves room unfilled
#   (quotas guess wrong when priorities are mixed), the contenders are fetched
#   again, each as many as it could get: exact, and dearer, so only then.
#
# Returns the sent wake-ups with their turn (1 goes first: the order above, which
# the publisher keeps, so a pass's urgent wake-up is not packed behind the others),
# then one summary row (id NULL): the room there was, whether the lock was had,
# whether due wake-ups were held back, how many tenants had a backlog (when the
# pass read them all), and, when it tried the next tenants only, whether they were
# enough (NULL: it did not try).
OUTBOX_WAKE_QUEUE: Final = f"""
WITH RECURSIVE {_ROOM}, clock AS (
    -- 3a. the queue's virtual clock, and whether the last pass that looked saw it paused
    SELECT COALESCE(max(vpass), 0) AS v, max(held_reason) AS held_reason
    FROM fair_shares WHERE queue = %(queue)s AND tenant = '{CLOCK_ROW}'
), look AS (
    -- 3b. the queue's own reason (a pause) ...
    SELECT (SELECT ok FROM gate) AS ok,
           CASE WHEN (SELECT paused FROM pause) THEN '{HeldReason.QUEUE_PAUSED}' END AS reason
), looking AS (
    -- 3c. ... and whether to read the tenants at all (a probe per tenant with a
    -- backlog): for room to fill, or to note that a pause started or ended. Under
    -- load the window is nearly full and room appears a slot at a time as consumers
    -- claim; reading a thousand tenants to fill one slot made the decision cost
    -- tenants per job sent, and at an eighth of the window 1,000 tenants still cost
    -- a 20 ms read per 25 wake-ups. So wait until a quarter of the window (or the
    -- batch) is free: consumers still hold three quarters of twice their capacity,
    -- one and a half times what they can run, meanwhile.
    SELECT l.ok AND ((SELECT n FROM room)
                         >= LEAST(%(limit)s::int, GREATEST(1, (SELECT size FROM capacity) / 4))
                     OR l.reason IS DISTINCT FROM (SELECT held_reason FROM clock)) AS yes
    FROM look AS l
), near_try AS (
    -- 3c2. whether to look at the next tenants only, as the relay asks where a queue
    -- has many: a pass with room that notes no start or end of a pause
    SELECT (SELECT yes FROM looking) AND %(near)s::bool
           AND (SELECT reason FROM look) IS NOT DISTINCT FROM (SELECT held_reason FROM clock)
           AS yes
), scan AS MATERIALIZED (
    -- 3c3. the queue's first unsent wake-ups of jobs that have a tenant, in the order
    -- they go across tenants (outbox_turn_idx), as many as the relay asks (a few
    -- times the room). A tenant's first one among them that is due is its first due
    -- one: every wake-up before it in its own order is before it here too.
    SELECT o.tenant, o.priority, o.available_at, o.id
    FROM outbox AS o
    WHERE (SELECT yes FROM near_try) AND o.queue = %(queue)s AND o.sent_at IS NULL
      AND o.tenant <> ''
    ORDER BY o.priority DESC, o.available_at, o.id
    LIMIT %(scan)s::int
), near AS (
    -- 3c4. the next tenants: those with a due wake-up in the scan, each with its first,
    -- and the jobs of no tenant with theirs (one probe of outbox_pending_idx)
    (SELECT DISTINCT ON (c.tenant) c.tenant, c.priority, c.available_at, c.id
     FROM scan AS c WHERE c.available_at <= now()
     ORDER BY c.tenant, c.priority DESC, c.available_at, c.id)
    UNION ALL
    (SELECT o.tenant, o.priority, o.available_at, o.id FROM outbox AS o
     WHERE (SELECT yes FROM near_try) AND o.queue = %(queue)s AND o.tenant = ''
       AND o.sent_at IS NULL AND o.available_at <= now()
     ORDER BY o.priority DESC, o.available_at, o.id
     LIMIT 1)
), near_shares AS MATERIALIZED (
    -- 3c5. their shares, as 3f has them, each row looked up by its key (a join of
    -- the whole tables would read every tenant)
    {_probed_shares("near")}
), near_contenders AS (
    -- 3c6. the contenders among them, as 3g picks them
    SELECT s.priority, s.start, s.available_at, s.id FROM near_shares AS s
    WHERE s.id IS NOT NULL AND (s.cap_room IS NULL OR s.cap_room > 0)
    ORDER BY s.priority DESC, s.start, s.available_at, s.id
    LIMIT (SELECT n FROM room)
), scan_end AS (
    -- 3c7. the scan's last row, in the order it read
    SELECT -c.priority AS p, c.available_at, c.id FROM scan AS c
    ORDER BY c.priority, c.available_at DESC, c.id DESC
    LIMIT 1
), near_enough AS (
    -- 3c8. whether they are the contenders every tenant's would give. A tenant the
    -- scan did not reach has its first due wake-up after the scan's last row: a
    -- priority no higher than that row's and, at that priority, a later one. So a
    -- contender goes before it if its own first one has a higher priority than that
    -- row's, or if it starts at the queue's clock (no virtual start is earlier, and
    -- the tie goes by age) with its first one before that row (every tenant met in
    -- the scan; the jobs of no tenant, probed apart, only when theirs is). When the
    -- scan read the whole backlog, or filled the room with such contenders, they
    -- are; otherwise every tenant is read (3d).
    SELECT (SELECT yes FROM near_try)
           AND ((SELECT count(*) FROM scan) < %(scan)s::int
                OR ((SELECT count(*) FROM near_contenders) >= (SELECT n FROM room)
                    AND NOT EXISTS (
                        SELECT 1 FROM near_contenders AS c
                        WHERE -c.priority >= (SELECT p FROM scan_end)
                          AND (c.start > (SELECT v FROM clock)
                               OR (-c.priority, c.available_at, c.id)
                                  > (SELECT p, available_at, id FROM scan_end))))) AS ok
), bulk AS MATERIALIZED (
    -- 3d1. the heads among the queue's first unsent wake-ups in tenant order (as many
    -- as the relay asks: about four per tenant the last pass found), in one read of
    -- outbox_pending_idx; a tenant's first row in that order is its head. Where
    -- tenants have few wake-ups each, a row read costs a small part of a probe.
    -- DISTINCT ON follows the read's order: no sort.
    SELECT DISTINCT ON (r.tenant) r.tenant, r.priority, r.available_at, r.id
    FROM (SELECT o.tenant, o.priority, o.available_at, o.id FROM outbox AS o
          WHERE (SELECT yes FROM looking) AND NOT (SELECT ok FROM near_enough)
            AND o.queue = %(queue)s AND o.sent_at IS NULL
          ORDER BY o.tenant, o.priority DESC, o.available_at, o.id
          LIMIT %(bulk)s::int) AS r
    ORDER BY r.tenant, r.priority DESC, r.available_at, r.id
), probed AS (
    -- 3d2. the tenants after the last one the read reached (its head it found), by a
    -- skip scan of outbox_pending_idx: one probe per tenant, and one that finds
    -- nothing when the read was not cut short
    (SELECT o.tenant, o.priority, o.available_at, o.id FROM outbox AS o
     WHERE o.queue = %(queue)s AND o.sent_at IS NULL
       AND o.tenant > (SELECT max(tenant) FROM bulk)
     ORDER BY o.tenant, o.priority DESC, o.available_at, o.id
     LIMIT 1)
    UNION ALL
    SELECT nx.tenant, nx.priority, nx.available_at, nx.id
    FROM probed AS h
    CROSS JOIN LATERAL (
        SELECT o.tenant, o.priority, o.available_at, o.id FROM outbox AS o
        WHERE o.queue = %(queue)s AND o.sent_at IS NULL AND o.tenant > h.tenant
        ORDER BY o.tenant, o.priority DESC, o.available_at, o.id
        LIMIT 1
    ) AS nx
), heads AS (
    -- 3d. each tenant with unsent wake-ups and its first one
    SELECT tenant, priority, available_at, id FROM bulk
    UNION ALL
    SELECT tenant, priority, available_at, id FROM probed
), firsts AS (
    -- 3d3. each tenant's first due wake-up: its head, or when that one is not due
    -- yet, a probe of its due ones (none: nothing of it is due)
    SELECT tenant, priority, available_at, id FROM heads WHERE available_at <= now()
    UNION ALL
    SELECT h.tenant, d.priority, d.available_at, d.id
    FROM heads AS h
    LEFT JOIN LATERAL (
        SELECT o.priority, o.available_at, o.id FROM outbox AS o
        WHERE o.queue = %(queue)s AND o.tenant = h.tenant
          AND o.sent_at IS NULL AND o.available_at <= now()
        ORDER BY o.priority DESC, o.available_at, o.id
        LIMIT 1
    ) AS d ON true
    WHERE h.available_at > now()
), inflight AS (
    -- 3e. each tenant's wake-ups in flight
    SELECT i.tenant, count(*)::int AS n
    FROM outbox AS i
    WHERE (SELECT yes FROM looking) AND i.queue = %(queue)s AND i.sent_at IS NOT NULL
      AND i.id NOT IN (SELECT id FROM settled)
    GROUP BY i.tenant
), shares AS MATERIALIZED (
    -- 3f. per tenant: weight, virtual start, capped room, first due wake-up (of the
    -- next tenants only, when they were enough)
    SELECT * FROM near_shares WHERE (SELECT ok FROM near_enough)
    UNION ALL
    -- of a few tenants, each row looked up by its key (joined, the prepared
    -- statement's plan read all three tables whole, however few tenants waited:
    -- at 200 jobs/s over 1,000 capped tenants, 0.85 ms of a 1.4 ms pass) ...
    SELECT * FROM ({_probed_shares("firsts")}) AS p
    WHERE (SELECT count(*) FROM firsts) <= {PROBED_SHARES_AT_MOST}
    UNION ALL
    -- ... of many, the tables read whole
    SELECT {_share_columns()}
    FROM firsts AS d
    LEFT JOIN tenant_limits AS l ON l.tenant = d.tenant
    LEFT JOIN tenant_usage AS u ON u.tenant = d.tenant
    LEFT JOIN fair_shares AS s ON s.queue = %(queue)s AND s.tenant = d.tenant
    LEFT JOIN inflight AS f ON f.tenant = d.tenant
    WHERE (SELECT count(*) FROM firsts) > {PROBED_SHARES_AT_MOST}
), contenders AS (
    -- 3g. the tenants whose first due wake-up would go within the room
    SELECT s.*, LEAST((SELECT n FROM room), COALESCE(s.cap_room, (SELECT n FROM room))) AS most
    FROM shares AS s
    WHERE s.id IS NOT NULL AND (s.cap_room IS NULL OR s.cap_room > 0)
    ORDER BY s.priority DESC, s.start, s.available_at, s.id
    LIMIT (SELECT n FROM room)
), level AS (
    -- 3h. the virtual time by which the contenders' shares add up to twice the room
    SELECT min(priority) AS priority,
           (2 * (SELECT n FROM room) + sum(start * weight)) / sum(weight) AS v
    FROM contenders
), quotas AS (
    -- 3i. each contender's quota: its share of the room up to that time
    SELECT c.tenant, c.start, c.weight, c.most,
           -- one whose first wake-up outranks the lowest contender's by priority
           -- may take the whole room
           CASE WHEN c.priority > (SELECT priority FROM level) THEN c.most
                ELSE LEAST(c.most, GREATEST(1, ceil(((SELECT v FROM level) - c.start)
                                                   * c.weight)))::int
           END AS quota
    FROM contenders AS c
), first_pick AS (
    -- 3j. each contender's first wake-ups, up to its quota, and one more
    {_fetch("q.quota", "q.quota < q.most")}
), first_horizon AS (
    -- 3k. the earliest spare of a tenant its quota cut short
    {_horizon("first_pick")}
), again AS (
    -- 3l. whether to fetch again. The quotas cut some tenant short before the room
    -- was filled (a tenant's wake-ups of a lower priority waited behind another's
    -- of a higher one, say): fetch again, each contender as many as it could get,
    -- which marks no horizon.
    SELECT EXISTS (SELECT 1 FROM first_horizon)
           AND (SELECT count(*) FROM first_pick AS c
                WHERE NOT c.spare
                  AND (-c.priority, c.vstart, c.available_at, c.id)
                      < (SELECT p, vstart, available_at, id FROM first_horizon))
               < (SELECT n FROM room) AS yes
), candidates AS (
    -- 3m. the wake-ups fetched, by quota or (again) exactly
    SELECT * FROM first_pick WHERE NOT (SELECT yes FROM again)
    UNION ALL
    SELECT * FROM ({_fetch("q.most", "false")}) AS exact WHERE (SELECT yes FROM again)
), horizon AS (
    -- 3n. their horizon: nothing at or after it may be chosen
    {_horizon("candidates")}
), chosen AS (
    -- 3o. the chosen wake-ups, in the decision's order (their turn), up to the room
    SELECT c.*,
           row_number() OVER (ORDER BY c.priority DESC, c.vstart, c.available_at, c.id) AS turn
    FROM candidates AS c
    WHERE NOT c.spare
      AND (NOT EXISTS (SELECT 1 FROM horizon)
           OR (-c.priority, c.vstart, c.available_at, c.id)
              < (SELECT p, vstart, available_at, id FROM horizon))
    ORDER BY c.priority DESC, c.vstart, c.available_at, c.id
    LIMIT (SELECT n FROM room)
), {_MARKED}, marking AS (
    -- 4b. ... and marked sent
    UPDATE outbox AS o SET sent_at = now()
    WHERE o.id = ANY(ARRAY(SELECT id FROM marked))
    RETURNING o.id, o.job_id, o.priority
), sent AS (
    SELECT k.id, k.job_id, k.priority, c.tenant, c.vstart, c.turn
    FROM marking AS k JOIN chosen AS c USING (id)
), tally AS (
    -- 4c. per tenant, how many it wanted and got
    SELECT c.tenant, count(*) AS wanted, count(*) FILTER (WHERE c.chosen) AS got
    FROM (SELECT c.tenant, ch.id IS NOT NULL AS chosen
          FROM candidates AS c LEFT JOIN chosen AS ch USING (id)) AS c
    GROUP BY c.tenant
), moved AS (
    -- 4d. per tenant, the last virtual start sent: its new pass
    SELECT tenant, max(vstart) AS last_vstart FROM sent GROUP BY tenant
), reasons AS (
    -- 4e. per tenant, why wake-ups were held back
    SELECT s.tenant, s.weight, s.held_reason, m.last_vstart,
           -- QUEUE_PAUSED: any wake-up waiting, due or not (one that comes due
           -- later in the pause finds no pass with room to note it); WINDOW: the
           -- window had no room, or this tenant got what room there was and
           -- wanted more; FAIR_SHARE: others went first (by priority or share) and
           -- left it none. One that did not contend wanted its first.
           CASE WHEN (SELECT paused FROM pause) THEN '{HeldReason.QUEUE_PAUSED}'
                WHEN COALESCE(t.got, 0) >= COALESCE(t.wanted, (s.id IS NOT NULL)::int) THEN NULL
                WHEN s.cap_room IS NOT NULL AND COALESCE(t.got, 0) >= s.cap_room
                     THEN '{HeldReason.TENANT_CAP}'
                WHEN (SELECT n FROM room) = 0 OR t.got > 0 THEN '{HeldReason.WINDOW}'
                ELSE '{HeldReason.FAIR_SHARE}'
           END AS reason
    FROM shares AS s LEFT JOIN tally AS t USING (tenant) LEFT JOIN moved AS m USING (tenant)
), shared AS (
    -- 4f. move the passes and the clock on, and note the reasons that changed
    INSERT INTO fair_shares AS f (queue, tenant, vpass, held_reason, held_since)
    SELECT %(queue)s, r.tenant, COALESCE(r.last_vstart + 1 / r.weight, 0), r.reason,
           CASE WHEN r.reason IS NULL THEN NULL ELSE now() END
    FROM reasons AS r
    WHERE r.last_vstart IS NOT NULL OR r.reason IS DISTINCT FROM r.held_reason
    UNION ALL
    SELECT %(queue)s, '{CLOCK_ROW}',
           COALESCE((SELECT max(vstart) FROM sent), 0),
           l.reason, CASE WHEN l.reason IS NULL THEN NULL ELSE now() END
    FROM look AS l
    WHERE (SELECT yes FROM looking)
      AND (EXISTS (SELECT 1 FROM sent) OR l.reason IS DISTINCT FROM (SELECT held_reason FROM clock))
    ON CONFLICT (queue, tenant) DO UPDATE
    SET vpass = GREATEST(f.vpass, EXCLUDED.vpass),
        held_reason = EXCLUDED.held_reason,
        held_since = CASE WHEN f.held_reason IS NOT DISTINCT FROM EXCLUDED.held_reason
                          THEN f.held_since ELSE EXCLUDED.held_since END
)
-- 5. the sent wake-ups in turn, then the summary row (id NULL)
SELECT s.id, s.job_id, s.priority, NULL::int AS room, NULL::bool AS locked, NULL::bool AS held,
       s.turn, NULL::int AS tenants, NULL::bool AS near
FROM sent AS s
UNION ALL
SELECT NULL, NULL, NULL, (SELECT n FROM room), (SELECT ok FROM gate),
       CASE WHEN (SELECT yes FROM looking)
            -- the next tenants only, when the scan did not reach the end of the
            -- backlog: a due wake-up of a tenant not read, if one is left unsent
            -- (what this pass sent still reads as unsent here: at most the room)
            THEN EXISTS (SELECT 1 FROM reasons WHERE reason IS NOT NULL)
                 OR ((SELECT ok FROM near_enough) AND (SELECT count(*) FROM scan) >= %(scan)s::int
                     AND EXISTS (SELECT 1 FROM outbox AS o
                                 WHERE o.queue = %(queue)s AND o.sent_at IS NULL
                                   AND o.available_at <= now()
                                   AND o.id NOT IN (SELECT id FROM sent)))
            ELSE EXISTS (SELECT 1 FROM outbox AS o
                         WHERE o.queue = %(queue)s AND o.sent_at IS NULL
                           AND o.available_at <= now())
       END,
       NULL,
       -- the tenants with a backlog, when the pass read them all (the next pass's read)
       CASE WHEN (SELECT yes FROM looking) AND NOT (SELECT ok FROM near_enough)
            THEN (SELECT count(*) FROM heads)::int END,
       -- asked for the next tenants only: whether they were enough (NULL: not tried)
       CASE WHEN (SELECT yes FROM near_try) THEN (SELECT ok FROM near_enough) END
"""

# The decision for a queue whose unsent wake-ups have no tenant (every job of a
# plain queue): OUTBOX_WAKE_QUEUE's steps without the fair share, which one
# tenant does not need. The same lock, settling, room, quarter-window rule and
# order (higher priority first, then age), and the same notes of why wake-ups were
# held back (QUEUE_PAUSED, WINDOW; the jobs of no tenant are never held for a cap
# or a share). It moves no virtual pass: with one tenant there is no share to
# keep, and when tenants arrive an idle pass starts at the clock anyway.
#
# If some tenant has an unsent wake-up in the queue (one probe of
# outbox_turn_idx), it sends and notes nothing and says so (the summary's last
# column): the caller then runs OUTBOX_WAKE_QUEUE in the same transaction. One not
# due yet counts too (a tenant's job scheduled an hour ahead has the queue decided
# whole until its wake-up is sent): the two statements then agree on every pass,
# with no pass moved by one that the other would have moved.
# Returns the columns OUTBOX_WAKE_QUEUE does, and that one more.
OUTBOX_WAKE_PLAIN: Final = f"""
WITH {_ROOM}, tenanted AS (
    -- 3a. whether a tenant has an unsent wake-up here: then this is not the decision.
    -- (The first in outbox_turn_idx's order, one probe of it: as EXISTS, it may be
    -- planned as a scan of the table, which on a queue of no tenant finds nothing
    -- and so reads every row.)
    SELECT (SELECT o.id FROM outbox AS o
            WHERE o.queue = %(queue)s AND o.sent_at IS NULL AND o.tenant <> ''
            ORDER BY o.priority DESC, o.available_at, o.id
            LIMIT 1) IS NOT NULL AS yes
), clock AS (
    -- 3b. whether the last pass that looked saw the queue paused
    SELECT max(held_reason) AS held_reason
    FROM fair_shares WHERE queue = %(queue)s AND tenant = '{CLOCK_ROW}'
), look AS (
    SELECT (SELECT ok FROM gate) AND NOT (SELECT yes FROM tenanted) AS ok,
           CASE WHEN (SELECT paused FROM pause) THEN '{HeldReason.QUEUE_PAUSED}' END AS reason
), looking AS (
    -- 3c. whether to look, as OUTBOX_WAKE_QUEUE's 3c: a quarter of the window (or
    -- the batch) free, or a pause that started or ended
    SELECT l.ok AND ((SELECT n FROM room)
                         >= LEAST(%(limit)s::int, GREATEST(1, (SELECT size FROM capacity) / 4))
                     OR l.reason IS DISTINCT FROM (SELECT held_reason FROM clock)) AS yes
    FROM look AS l
), fetched AS MATERIALIZED (
    -- 3d. the first due wake-ups in the order they go (outbox_pending_idx, no
    -- sort), up to the room, and one more: whether due ones are left beyond it
    SELECT o.id, o.priority, o.available_at FROM outbox AS o
    WHERE (SELECT yes FROM looking) AND o.queue = %(queue)s AND o.tenant = ''
      AND o.sent_at IS NULL AND o.available_at <= now()
    ORDER BY o.priority DESC, o.available_at, o.id
    LIMIT (SELECT n FROM room) + 1
), chosen AS (
    SELECT f.id FROM fetched AS f
    ORDER BY f.priority DESC, f.available_at, f.id
    LIMIT (SELECT n FROM room)
), {_MARKED}, sent AS (
    -- 4b. ... and marked sent
    UPDATE outbox AS o SET sent_at = now()
    WHERE o.id = ANY(ARRAY(SELECT id FROM marked))
    RETURNING o.id, o.job_id, o.priority, o.available_at
), waiting AS (
    -- 4c. whether due wake-ups are left beyond those chosen (when it looked, the
    -- one fetched past the room; else the first due one), and whether any wait at
    -- all, due or not. In outbox_pending_idx's order, so that each is a walk of that index:
    -- as EXISTS, each was planned as a scan of the table, a row at a time.
    SELECT CASE WHEN (SELECT yes FROM looking)
                THEN (SELECT count(*) FROM fetched) > (SELECT n FROM room)
                ELSE (SELECT o.id FROM outbox AS o
                      WHERE o.queue = %(queue)s AND o.tenant = '' AND o.sent_at IS NULL
                        AND o.available_at <= now()
                      ORDER BY o.priority DESC, o.available_at, o.id
                      LIMIT 1) IS NOT NULL END AS due,
           (SELECT o.id FROM outbox AS o
            WHERE o.queue = %(queue)s AND o.tenant = '' AND o.sent_at IS NULL
            ORDER BY o.priority DESC, o.available_at, o.id
            LIMIT 1) IS NOT NULL AS backlog
), reason AS (
    -- 4d. why wake-ups were held back: QUEUE_PAUSED (any waiting, due or not), or
    -- WINDOW (due ones the room left)
    SELECT CASE WHEN (SELECT paused FROM pause) THEN '{HeldReason.QUEUE_PAUSED}'
                WHEN (SELECT due FROM waiting) THEN '{HeldReason.WINDOW}'
           END AS reason
    WHERE (SELECT yes FROM looking) AND (SELECT backlog FROM waiting)
), shared AS (
    -- 4e. note the reasons that changed: the jobs of no tenant's, and the clock
    -- row's (a pause's start or end)
    INSERT INTO fair_shares AS f (queue, tenant, vpass, held_reason, held_since)
    SELECT %(queue)s, '', 0, r.reason, CASE WHEN r.reason IS NULL THEN NULL ELSE now() END
    FROM reason AS r
    WHERE r.reason IS DISTINCT FROM (SELECT s.held_reason FROM fair_shares AS s
                                     WHERE s.queue = %(queue)s AND s.tenant = '')
    UNION ALL
    SELECT %(queue)s, '{CLOCK_ROW}', 0, l.reason,
           CASE WHEN l.reason IS NULL THEN NULL ELSE now() END
    FROM look AS l
    WHERE (SELECT yes FROM looking) AND l.reason IS DISTINCT FROM (SELECT held_reason FROM clock)
    ON CONFLICT (queue, tenant) DO UPDATE
    SET held_reason = EXCLUDED.held_reason,
        held_since = CASE WHEN f.held_reason IS NOT DISTINCT FROM EXCLUDED.held_reason
                          THEN f.held_since ELSE EXCLUDED.held_since END
)
-- 5. the sent wake-ups in turn, then the summary row (id NULL), as OUTBOX_WAKE_QUEUE's,
-- and whether a tenant's wake-up waits (then nothing else was done)
SELECT s.id, s.job_id, s.priority, NULL::int AS room, NULL::bool AS locked, NULL::bool AS held,
       row_number() OVER (ORDER BY s.priority DESC, s.available_at, s.id) AS turn,
       NULL::int AS tenants, NULL::bool AS near, NULL::bool AS tenanted
FROM sent AS s
UNION ALL
SELECT NULL, NULL, NULL, (SELECT n FROM room), (SELECT ok FROM gate),
       CASE WHEN (SELECT yes FROM looking)
            THEN EXISTS (SELECT 1 FROM reason WHERE reason IS NOT NULL)
            ELSE (SELECT due FROM waiting) END,
       NULL,
       -- one tenant read (the jobs of none), when it looked
       CASE WHEN (SELECT yes FROM looking) THEN 1 END,
       NULL,
       -- (only with the lock: without it the whole decision could do nothing either)
       (SELECT ok FROM gate) AND (SELECT yes FROM tenanted)
"""

# Wake-ups in flight whose job has been taken up since, in every queue: the wake
# statement settles its own queue as it goes; this catches queues that got no new
# work since. Rows a wake statement holds are skipped. Each job is looked up by its
# id, as the wake statement's settling does (a join may be planned as a scan of
# every job).
OUTBOX_SETTLE: Final = f"""
DELETE FROM outbox AS o
WHERE o.id IN (SELECT id FROM outbox WHERE sent_at IS NOT NULL
               ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
  AND (SELECT NOT ({UNTAKEN}) FROM jobs AS j WHERE j.job_id = o.job_id)
"""

# Wake-ups in flight longer than the grace whose job still waits untaken, per queue:
# their message may have been lost. Read under the re-waker's lock. (What counts as
# lost is this WHERE clause and OUTBOX_REWAKE_LOST's, kept the same: a condition
# that excludes ids some live consumer still holds belongs in both.)
OUTBOX_LOST_QUEUES: Final = f"""
SELECT o.queue, count(*)
FROM outbox AS o JOIN jobs AS j ON j.job_id = o.job_id
WHERE o.sent_at IS NOT NULL
  AND o.sent_at < now() - make_interval(secs => %(grace_seconds)s)
  AND {UNTAKEN}
GROUP BY o.queue
"""

# The re-waker: such wake-ups in the given queues (those the broker holds no ready
# message for, so none is on its way) go back to the backlog, to be sent again. In
# a transaction of its own: it touches at most the queues' windows, and nothing
# slow may roll it back.
OUTBOX_REWAKE_LOST: Final = f"""
UPDATE outbox AS o SET sent_at = NULL, available_at = now()
FROM jobs AS j
WHERE o.queue = ANY(%(queues)s::text[])
  AND o.sent_at IS NOT NULL
  AND o.sent_at < now() - make_interval(secs => %(grace_seconds)s)
  AND j.job_id = o.job_id AND {UNTAKEN}
RETURNING o.job_id
"""

# A backstop, run by the relay's orphan walk: a due job that waits to run and has no
# wake-up at all (none pending, none in flight) gets one. Nothing in this project
# leaves a job so; a row edited by hand might. Jobs parked for a handler nobody runs
# are left parked until someone can run them.
#
# One bounded slice per call: the next %(slice)s jobs by primary key after
# %(after)s, whatever their state, so a call costs the same with ten waiting jobs or
# ten million (a scan of every waiting job outgrew the statement timeout under a
# large backlog). The relay keeps the cursor and starts over when a slice comes back
# short. No index of its own: the primary key orders the walk, and writers pay
# nothing for it.
#
# Returns ('woken', job_id, queue) per wake-up written, then ('slice', the slice's
# last job id (NULL if it was empty), NULL, the jobs it read).
JOB_WAKE_ORPHANS: Final = f"""
WITH slice AS MATERIALIZED (
    SELECT j.job_id, j.job_type, j.queue, j.tenant, j.priority, j.state, j.run_after,
           j.delay_reason, j.key, j.key_limit, j.key_seq, j.resource, j.weight
    FROM jobs AS j
    WHERE j.job_id > %(after)s::uuid
    ORDER BY j.job_id
    LIMIT %(slice)s
), woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT s.job_id, s.queue, COALESCE(s.tenant, ''), s.priority, now()
    FROM slice AS s
    WHERE s.state IN ({CLAIMABLE_SQL})
      AND s.run_after <= now() - make_interval(secs => %(grace_seconds)s)
      AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.job_id = s.job_id)
      AND (s.delay_reason IS DISTINCT FROM '{DelayReason.NO_HANDLER}'
           OR EXISTS (SELECT 1 FROM workers AS w
                      WHERE {LIVE_WORKER} AND s.queue = ANY(w.queues)
                        AND s.job_type = ANY(w.job_types)))
      -- one refused for its dedicated tenant, once a consumer naming it is live, or
      -- once the tenant is shared again
      AND (s.delay_reason IS DISTINCT FROM '{DelayReason.NO_AUTHORIZED_RUNNER}'
           OR NOT EXISTS (SELECT 1 FROM tenant_limits AS d
                          WHERE d.tenant = s.tenant AND d.runners = 'dedicated')
           OR EXISTS (SELECT 1 FROM workers AS w
                      WHERE {LIVE_WORKER} AND s.queue = ANY(w.queues)
                        AND s.job_type = ANY(w.job_types) AND s.tenant = ANY(w.tenants)))
      -- one waiting for its key is woken by the end of the lease ahead of it: an
      -- orphan only once nothing holds it back any more
      AND NOT (s.delay_reason = '{DelayReason.KEY_BUSY}'
               AND EXISTS (SELECT 1 FROM key_usage AS u
                           WHERE u.key = s.key
                             AND u.running >= LEAST(u.key_limit, s.key_limit)))
      AND NOT (s.delay_reason = '{DelayReason.KEY_ORDER}'
               AND EXISTS (SELECT 1 FROM jobs AS x
                           WHERE x.key = s.key AND x.key_seq < s.key_seq
                             AND {KEY_AHEAD.format(x="x")}))
      -- and one waiting for its resource, by the end of the hold (or its resolution)
      -- (the holds read once, hashed: a few rows, one per resource held)
      AND NOT (COALESCE(s.delay_reason IN ('{DelayReason.RESOURCE_BUSY}',
                                           '{DelayReason.RESOURCE_UNCERTAIN}'), false)
               AND s.resource IN (SELECT h.resource FROM resource_holds AS h))
      -- and one waiting for its type's concurrency limit, by the end of a lease of
      -- its type, while the limit has fewer free slots than it weighs (woken for
      -- one, a heavy job would be turned down again on every pass)
      AND NOT (s.delay_reason = '{DelayReason.CONCURRENCY_LIMIT}'
               AND EXISTS (SELECT 1 FROM concurrency_limits AS c
                           WHERE c.job_type = s.job_type
                             AND c.max_running - c.running < COALESCE(s.weight, 1)))
      -- and one waiting for its queue's concurrency limit, likewise (a limit removed,
      -- max_running NULL, holds nothing back)
      AND NOT (s.delay_reason = '{DelayReason.QUEUE_CONCURRENCY_LIMIT}'
               AND EXISTS (SELECT 1 FROM queue_limits AS c
                           WHERE c.queue = s.queue
                             AND c.max_running - c.running < COALESCE(s.weight, 1)))
    RETURNING job_id, queue
)
SELECT 'woken' AS kind, job_id, queue, NULL::int AS read FROM woken
UNION ALL
SELECT 'slice', (SELECT job_id FROM slice ORDER BY job_id DESC LIMIT 1), NULL,
       (SELECT count(*) FROM slice)::int
"""

# The backlog per queue, for the relay's stats line: wake-ups waiting (due or
# later) and in flight.
OUTBOX_BACKLOG: Final = """
SELECT queue,
       count(*) FILTER (WHERE sent_at IS NULL AND available_at <= now()) AS due,
       count(*) FILTER (WHERE sent_at IS NOT NULL) AS in_flight,
       EXTRACT(EPOCH FROM now() - min(available_at) FILTER (WHERE sent_at IS NULL
                                                            AND available_at <= now()))
FROM outbox
GROUP BY queue
ORDER BY queue
"""

# A consumer hands back wake-ups it will not hold (it has no room for them soon, or
# no thread for them): for each named job that still waits to run and is due, its
# wake-ups become one pending wake-up, due in delay_seconds (0: now), for the relay
# to decide on again (priority, fair share, the window) and send to a consumer with
# room. Its rows are deleted without looking at sent_at first, so a relay marking one
# sent right now (its publish can reach the consumer before its commit) is waited for
# rather than missed: no mark lands after the hand-back. The insert notifies the
# relay (outbox_notify). Returns the jobs handed back; the others need no wake-up
# (running, finished, not due).
OUTBOX_HAND_BACK: Final = f"""
WITH named AS (
    SELECT j.job_id, j.queue, j.tenant, j.priority
    FROM jobs AS j
    WHERE j.job_id = ANY(%(job_ids)s::uuid[])
      AND j.state IN ({CLAIMABLE_SQL}) AND j.run_after <= now()
), dropped AS (
    DELETE FROM outbox AS o USING named AS n
    WHERE o.job_id = n.job_id
)
INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
SELECT job_id, queue, COALESCE(tenant, ''), priority,
       now() + make_interval(secs => %(delay_seconds)s)
FROM named
RETURNING job_id
"""

# The wake-ups a live consumer holds (delivered, not claimed yet: no slot is free
# yet) are refreshed as sent now, at least every few seconds, so the re-waker does
# not take them for lost and send them again (OUTBOX_LOST_QUEUES: sent longer ago
# than its grace and untaken). Once the consumer is gone its channel's messages go
# back to the queue, and its marks age like any other. Only wake-ups still untaken
# are touched (judged by the old mark); rows another transaction holds are skipped.
OUTBOX_HELD_REFRESH: Final = f"""
UPDATE outbox AS o SET sent_at = now()
FROM jobs AS j
WHERE o.id IN (SELECT i.id FROM outbox AS i
               WHERE i.job_id = ANY(%(job_ids)s::uuid[]) AND i.sent_at IS NOT NULL
               FOR UPDATE SKIP LOCKED)
  AND j.job_id = o.job_id AND {UNTAKEN}
"""
