"""The outbox: the relay's decision of what to wake, and the repair of wake-ups that
were lost or never written."""

from __future__ import annotations

from typing import Final

from schema.queries.fragments import LIVE_WORKER, PENDING_TENANTS, UNTAKEN
from schema.tables import CLAIMABLE_SQL, CLOCK_ROW, LEASED_SQL

# Jobs that waited for a consumer that knows their type: woken when one announces it
# (and by the re-waker, as a backstop), without waiting for the periodic re-wake.
JOB_WAKE_PARKED: Final = f"""
INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
SELECT j.job_id, j.queue, COALESCE(j.tenant, ''), j.priority, now()
FROM jobs AS j
WHERE j.delay_reason = 'NO_HANDLER' AND j.state IN ({CLAIMABLE_SQL})
  AND j.queue = ANY(%(queues)s::text[]) AND j.job_type = ANY(%(job_types)s::text[])
  AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.job_id = j.job_id)
RETURNING job_id
"""

# Wake-ups a consumer turned down for want of a handler wait the backstop
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
     WHERE j.delay_reason = 'NO_HANDLER' AND j.state IN ({CLAIMABLE_SQL})
     ORDER BY j.queue, j.job_type LIMIT 1)
    UNION ALL
    SELECT n.queue, n.job_type
    FROM kinds AS k
    CROSS JOIN LATERAL (
        SELECT j.queue, j.job_type FROM jobs AS j
        WHERE j.delay_reason = 'NO_HANDLER' AND j.state IN ({CLAIMABLE_SQL})
          AND (j.queue, j.job_type) > (k.queue, k.job_type)
        ORDER BY j.queue, j.job_type LIMIT 1
    ) AS n
), held AS (
    SELECT j.lease_owner AS worker_id, count(*)::int AS n
    FROM jobs AS j
    WHERE j.state IN ({LEASED_SQL}) AND EXISTS (SELECT 1 FROM kinds)
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
        WHERE j.delay_reason = 'NO_HANDLER' AND j.state IN ({CLAIMABLE_SQL})
          AND j.queue = r.queue AND j.job_type = r.job_type
          AND o.sent_at IS NULL AND o.available_at > now()
        ORDER BY j.queue, j.job_type  -- the index's order: a walk that stops at the room
        LIMIT r.free
    ) AS c
    WHERE r.free > 0
), moved AS (
    SELECT o.id FROM outbox AS o
    WHERE o.id IN (SELECT id FROM chosen) AND o.sent_at IS NULL AND o.available_at > now()
    FOR UPDATE SKIP LOCKED
), brought AS (
    UPDATE outbox AS o SET available_at = now()
    FROM moved WHERE o.id = moved.id
    RETURNING o.queue
)
SELECT queue FROM brought
UNION ALL
SELECT NULL WHERE EXISTS (SELECT 1 FROM kinds)
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

# The relay's one decision: which of a queue's due wake-ups to send now. In the
# relay's transaction, under a per-queue advisory lock (another relay skips the
# queue meanwhile), in one statement:
#
# 1. settle: wake-ups in flight whose job has been taken up since (claimed, finished,
#    or turned down: the claim deletes those) leave the table;
# 2. room: the queue's window (given, or twice the capacity of its live consumers,
#    at least min_window) minus the wake-ups still in flight; none while paused;
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
# Returns the sent wake-ups with their turn (1 goes first: the order above, which
# the publisher keeps, so a pass's urgent wake-up is not packed behind the others),
# then one summary row (id NULL): the room there was, whether the lock was had, and
# whether due wake-ups were held back.
OUTBOX_WAKE_QUEUE: Final = f"""
WITH RECURSIVE gate AS (
    SELECT pg_try_advisory_xact_lock(hashtextextended('hybrid_jobs.wake.' || %(queue)s, 0)) AS ok
), settled AS (
    DELETE FROM outbox AS o USING jobs AS j
    WHERE (SELECT ok FROM gate) AND o.queue = %(queue)s AND o.sent_at IS NOT NULL
      AND j.job_id = o.job_id AND NOT ({UNTAKEN})
    RETURNING o.id
), capacity AS (
    SELECT COALESCE(%(window)s::int, GREATEST(%(min_window)s::int, (
               SELECT 2 * sum(w.concurrency)::int FROM workers AS w
               WHERE %(queue)s = ANY(w.queues) AND {LIVE_WORKER}))) AS size
), pause AS (
    SELECT EXISTS (SELECT 1 FROM queues WHERE queue = %(queue)s AND paused) AS paused
), room AS (
    SELECT CASE
               WHEN NOT (SELECT ok FROM gate) THEN 0
               WHEN (SELECT paused FROM pause) THEN 0
               ELSE GREATEST(0, LEAST(%(limit)s::int, (SELECT size FROM capacity)
                   - (SELECT count(*) FROM outbox AS i
                      WHERE i.queue = %(queue)s AND i.sent_at IS NOT NULL)::int
                   + (SELECT count(*) FROM settled)::int))
           END AS n
), {PENDING_TENANTS}, clock AS (
    SELECT COALESCE((SELECT vpass FROM fair_shares
                     WHERE queue = %(queue)s AND tenant = '{CLOCK_ROW}'), 0) AS v
), shares AS (
    SELECT t.tenant,
           COALESCE(l.weight, 1) AS weight,
           GREATEST(COALESCE(s.vpass, 0), (SELECT v FROM clock)) AS start,
           -- A capped tenant's room: its free slots, less its wake-ups in flight in
           -- this queue (those of other queues are theirs to count; the claim holds
           -- the cap exactly whatever the relay sends).
           CASE WHEN l.max_running IS NULL THEN NULL
                ELSE GREATEST(0, l.max_running - COALESCE(u.running, 0) - (
                    SELECT count(*) FROM outbox AS i
                    WHERE i.queue = %(queue)s AND i.tenant = t.tenant
                      AND i.sent_at IS NOT NULL AND i.id NOT IN (SELECT id FROM settled))::int)
           END AS cap_room,
           s.held_reason
    FROM tenants AS t
    LEFT JOIN tenant_limits AS l ON l.tenant = t.tenant
    LEFT JOIN tenant_usage AS u ON u.tenant = t.tenant
    LEFT JOIN fair_shares AS s ON s.queue = %(queue)s AND s.tenant = t.tenant
    WHERE t.tenant IS NOT NULL
), candidates AS (
    -- each tenant's best due wake-ups, one more than it could get (to tell that
    -- something was held back)
    SELECT c.id, c.job_id, c.priority, c.available_at, sh.tenant, c.k,
           sh.start + (c.k - 1) / sh.weight AS vstart
    FROM shares AS sh
    CROSS JOIN LATERAL (
        SELECT o.id, o.job_id, o.priority, o.available_at,
               row_number() OVER (ORDER BY o.priority DESC, o.available_at, o.id) AS k
        FROM outbox AS o
        WHERE o.queue = %(queue)s AND o.tenant = sh.tenant AND o.sent_at IS NULL
          AND o.available_at <= now()
        ORDER BY o.priority DESC, o.available_at, o.id
        LIMIT LEAST((SELECT n FROM room), COALESCE(sh.cap_room, 2147483646)) + 1
    ) AS c
), chosen AS (
    SELECT c.*,
           row_number() OVER (ORDER BY c.priority DESC, c.vstart, c.available_at, c.id) AS turn
    FROM candidates AS c JOIN shares AS sh USING (tenant)
    WHERE sh.cap_room IS NULL OR c.k <= sh.cap_room
    ORDER BY c.priority DESC, c.vstart, c.available_at, c.id
    LIMIT (SELECT n FROM room)
), marked AS (
    SELECT o.id FROM outbox AS o
    WHERE o.id IN (SELECT id FROM chosen) AND o.sent_at IS NULL
    FOR UPDATE SKIP LOCKED
), sent AS (
    UPDATE outbox AS o SET sent_at = now()
    FROM marked WHERE o.id = marked.id
    RETURNING o.id, o.job_id, o.priority
), verdicts AS (
    SELECT sh.tenant, sh.weight, sh.cap_room, sh.held_reason,
           (SELECT max(c.vstart) FROM chosen AS c
            WHERE c.tenant = sh.tenant AND c.id IN (SELECT id FROM sent)) AS last_vstart,
           (SELECT count(*) FROM candidates AS c WHERE c.tenant = sh.tenant) AS wanted,
           (SELECT count(*) FROM chosen AS c WHERE c.tenant = sh.tenant) AS got
    FROM shares AS sh
), reasons AS (
    SELECT v.*,
           -- WINDOW: the window had no room, or this tenant got what room there
           -- was and wanted more; FAIR_SHARE: others went first (by priority or
           -- share) and left it none.
           CASE WHEN v.got >= v.wanted THEN NULL
                WHEN (SELECT paused FROM pause) THEN 'QUEUE_PAUSED'
                WHEN v.cap_room IS NOT NULL AND v.got >= v.cap_room THEN 'TENANT_CAP'
                WHEN (SELECT n FROM room) = 0 OR v.got > 0 THEN 'WINDOW'
                ELSE 'FAIR_SHARE'
           END AS reason
    FROM verdicts AS v
), shared AS (
    INSERT INTO fair_shares AS f (queue, tenant, vpass, held_reason, held_since)
    SELECT %(queue)s, r.tenant, COALESCE(r.last_vstart + 1 / r.weight, 0), r.reason,
           CASE WHEN r.reason IS NULL THEN NULL ELSE now() END
    FROM reasons AS r
    WHERE (SELECT ok FROM gate)
      AND (r.last_vstart IS NOT NULL OR r.reason IS DISTINCT FROM r.held_reason)
    UNION ALL
    SELECT %(queue)s, '{CLOCK_ROW}', max(c.vstart), NULL, NULL
    FROM chosen AS c WHERE c.id IN (SELECT id FROM sent)
    HAVING count(*) > 0
    ON CONFLICT (queue, tenant) DO UPDATE
    SET vpass = GREATEST(f.vpass, EXCLUDED.vpass),
        held_reason = EXCLUDED.held_reason,
        held_since = CASE WHEN f.held_reason IS NOT DISTINCT FROM EXCLUDED.held_reason
                          THEN f.held_since ELSE EXCLUDED.held_since END
)
SELECT s.id, s.job_id, s.priority, NULL::int AS room, NULL::bool AS locked, NULL::bool AS held,
       c.turn
FROM sent AS s JOIN chosen AS c USING (id)
UNION ALL
SELECT NULL, NULL, NULL, (SELECT n FROM room), (SELECT ok FROM gate),
       EXISTS (SELECT 1 FROM reasons WHERE reason IS NOT NULL), NULL
"""

# Wake-ups in flight whose job has been taken up since, in every queue: the wake
# statement settles its own queue as it goes; this catches queues that got no new
# work since. Rows a wake statement holds are skipped.
OUTBOX_SETTLE: Final = f"""
DELETE FROM outbox AS o USING jobs AS j
WHERE o.id IN (SELECT id FROM outbox WHERE sent_at IS NOT NULL
               ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
  AND j.job_id = o.job_id AND NOT ({UNTAKEN})
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
           j.delay_reason
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
      AND (s.delay_reason IS DISTINCT FROM 'NO_HANDLER'
           OR EXISTS (SELECT 1 FROM workers AS w
                      WHERE {LIVE_WORKER} AND s.queue = ANY(w.queues)
                        AND s.job_type = ANY(w.job_types)))
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
