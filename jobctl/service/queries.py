"""The operator surface's reads, named. None of them writes: every change goes
through the producer API (``outbox``), whose statements live in
:mod:`schema.queries`.

Each read is written to match one index, so that it costs what the backlog (or the
page) costs, never what the history of finished jobs costs: no ``count(*)`` over
finished jobs, and no ``state IN (...)`` list spanning two partial indexes, which
scans the whole table (``python -m bench.surface_plans`` prints their plans on a
million finished jobs):

- a job and its attempts: primary keys;
- waiting and running jobs: ``jobs_claimable_idx`` / ``jobs_leased_idx``, one
  statement per index (a ``state IN (...)`` spanning both scans the whole table);
- failed and cancelled jobs: ``jobs_unsuccessful_finished_idx`` (finished_at,
  job_id), succeeded ones ``jobs_finished_idx``, and lists with no state the
  primary key, each read by a bounded scan (see :func:`job_list`);
- jobs with a tag: ``job_tags_pkey`` (tag, job_id), walked backwards from the
  page's start, a page long however many jobs carry the tag;
- per-queue figures: the metrics collector's backlog reads, ``outbox_due_idx``,
  ``outbox_inflight_idx``, and ``jobs_finished_idx`` over the last minute, sampled.

Job lists come in variants: which filters are present is part of the statement's
text (built by :func:`job_list` from fixed fragments, never from values), and the
state is a literal, so that a prepared statement's generic plan can still prove a
partial index's predicate. Every value is a bound parameter.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Final

from hybrid_jobs.jobctl.service.cursor import Order
from hybrid_jobs.schema.queries import (
    LEASE_LAPSED,
    LIVE_WORKER,
    RELAY_FAILING_QUEUES,
    RELAY_LIVE_LIST,
)
from hybrid_jobs.schema.states import CLAIMABLE, LEASED, REPLAYABLE, JobState
from hybrid_jobs.schema.tables import CLAIMABLE_SQL, LEASED_SQL, REPLAYABLE_SQL, TERMINAL_SQL

# The columns of a JobSummary, in its order (done is computed).
SUMMARY_COLUMNS: Final = (
    "job_id, job_type, queue, tenant, state, priority, attempt_count, max_attempts, run_after,"
    " created_at, started_at, finished_at, last_error_code, delay_reason, tags,"
    " meta::text AS meta"
)

# JSON columns as text: a value nested past what psycopg's json.loads takes would
# fail the whole read (jobctl.service.stored reads them).
JOB_GET: Final = f"""
SELECT {SUMMARY_COLUMNS},
       payload::text, dedup_key, updated_at, cancel_requested_at, cancel_forced_at,
       last_error_message,
       progress::text, progress_at, result::text, delay_since, lease_owner,
       lease_generation, lease_expires_at, now(), key, key_limit, key_order, resource
FROM jobs
WHERE job_id = %(job_id)s
"""

# The job a debounced enqueue with this key would replace: jobs_debounce_idx, whose
# predicate this repeats.
DEBOUNCE_WAITING: Final = """
SELECT job_id FROM jobs
WHERE job_type = %(job_type)s AND debounce_key = %(debounce_key)s
  AND debounce_key IS NOT NULL AND state = 'QUEUED' AND started_at IS NULL
"""

# The newest attempts by their key (job_id, lease_generation).
JOB_ATTEMPTS: Final = """
SELECT attempt, lease_generation, worker, outcome, ready_at, started_at, finished_at,
       error_code, error_message, traceback
FROM job_attempts
WHERE job_id = %(job_id)s
ORDER BY lease_generation DESC
LIMIT %(limit)s
"""


# A job's parents (the jobs it waits for, in the order of its after=) and its
# children (the jobs waiting for it), each with its type and state: the pkey of
# job_dependencies finds the parents, job_dependencies_parent_idx the children;
# at most %(limit)s of each.
JOB_DEPENDENCIES: Final = """
(SELECT 'parent' AS side, d.parent_id, j.job_type, j.state, d.done
 FROM job_dependencies AS d LEFT JOIN jobs AS j ON j.job_id = d.parent_id
 WHERE d.child_id = %(job_id)s
 ORDER BY d.position
 LIMIT %(limit)s)
UNION ALL
(SELECT 'child', d.child_id, j.job_type, j.state, d.done
 FROM job_dependencies AS d JOIN jobs AS j ON j.job_id = d.child_id
 WHERE d.parent_id = %(job_id)s
 ORDER BY d.child_id
 LIMIT %(limit)s)
"""


# A job's finished steps (job.step), by job_steps' primary key; not their results,
# which may be large and are the handler's own.
JOB_STEPS: Final = """
SELECT name, attempt, finished_at
FROM job_steps
WHERE job_id = %(job_id)s
ORDER BY finished_at, name
LIMIT %(limit)s
"""


@dataclass(frozen=True)
class JobList:
    sql: str
    order: Order
    # For a list that reads at most %(scan)s jobs: the statement that says how many
    # the scan read and which was the last (count, job_id, finished_at), run when a
    # page came back short, to tell the end of the list from the end of a scan.
    edge_sql: str | None = None


_KEYSET: Final = {
    Order.CREATED: "job_id < %(after_id)s",
    # A row comparison: an index condition on (finished_at, job_id) whole, and on a
    # (finished_at) index its prefix.
    Order.FINISHED: "(finished_at, job_id) < (%(after_finished)s::timestamptz, %(after_id)s::uuid)",
}
_ORDER_BY: Final = {
    Order.CREATED: "job_id DESC",
    Order.FINISHED: "finished_at DESC, job_id DESC",
}
_REVERSED: Final = {
    Order.CREATED: "job_id",
    Order.FINISHED: "finished_at, job_id",
}


def _where(*conditions: str) -> str:
    present = [c for c in conditions if c]
    return "WHERE " + " AND ".join(present) if present else ""


# A job's meta holds each of the pairs of %(meta)s, a JSON object of texts, compared
# as text (->>): meta.customer=42 finds {"customer": 42} and {"customer": "42"}.
META_FILTER: Final = """NOT EXISTS (
        SELECT 1 FROM jsonb_each_text(%(meta)s::jsonb) AS m(k, v)
        WHERE (jobs.meta ->> m.k) IS DISTINCT FROM m.v)"""


@functools.cache
def job_list(
    state: JobState | None,
    *,
    queue: bool,
    job_type: bool,
    tenant: bool,
    after: bool,
    tags: bool = False,
    meta: bool = False,
) -> JobList:
    """The statement listing jobs with the given filters present (their values are
    the parameters queue, job_type, tenant, tag, tags, meta, after_id,
    after_finished, limit, scan).

    - QUEUED, RETRY_WAIT, RUNNING, CANCEL_REQUESTED (the backlog): that state's
      partial index, newest first. Reads the matching backlog, whatever its age: the
      subquery is a fence (OFFSET 0) that keeps the planner from walking the primary
      key backwards through the history in search of old waiting jobs.
    - FAILED, CANCELLED: newest finished first, through
      jobs_unsuccessful_finished_idx; SUCCEEDED: through jobs_finished_idx. These
      read at most %(scan)s index entries in the list's order and filter them, so a
      filter that matches little costs one scan, not the history; the page may then
      come back short with a next token (``JobList.edge_sql`` finds it).
    - no state: newest first by id; filtered, through the same bounded scan.
    - tags (whatever the state): newest first by id, through a bounded scan of the
      first tag's rows of job_tags (%(tag)s); the job holds every tag of %(tags)s
      and matches the other filters, state included.
    """
    filters = [
        "queue = %(queue)s" if queue else "",
        "job_type = %(job_type)s" if job_type else "",
        "tenant = %(tenant)s" if tenant else "",
        META_FILTER if meta else "",
    ]
    if tags:
        found = [f"state = '{state}'" if state else "", "tags @> %(tags)s::text[]", *filters]
        keyset = _KEYSET[Order.CREATED] if after else ""
        scan_where = _where("tag = %(tag)s", keyset)
        return _bounded(scan_where, found, Order.CREATED, "job_tags")
    if state in CLAIMABLE or state in LEASED:
        # The page's start applies outside the fence too: inside, a generic plan
        # reads `job_id < $1` as a third of the table and walks the primary key.
        where = _where(f"state = '{state}'", *filters)
        sql = f"""
SELECT * FROM (SELECT {SUMMARY_COLUMNS} FROM jobs {where} OFFSET 0) AS backlog
{_where(_KEYSET[Order.CREATED] if after else "")}
ORDER BY job_id DESC
LIMIT %(limit)s
"""
        return JobList(sql, Order.CREATED)
    if state is None:
        keyset = _KEYSET[Order.CREATED] if after else ""
        if not any(filters):
            sql = f"""
SELECT {SUMMARY_COLUMNS} FROM jobs {_where(keyset)} ORDER BY job_id DESC LIMIT %(limit)s
"""
            return JobList(sql, Order.CREATED)
        return _bounded(_where(keyset), filters, Order.CREATED)
    # Finished: the index's predicate bounds the scan; the state picks within it.
    scanned = (
        f"state IN ({REPLAYABLE_SQL})" if state in REPLAYABLE else (f"state IN ({TERMINAL_SQL})")
    )
    keyset = _KEYSET[Order.FINISHED] if after else ""
    return _bounded(_where(scanned, keyset), [f"state = '{state}'", *filters], Order.FINISHED)


def _bounded(scan_where: str, filters: list[str], order: Order, source: str = "jobs") -> JobList:
    # The scan reads keys only, in the list's order, and stops after %(scan)s of
    # them whatever the filters match; each key it yields is looked up by primary
    # key and filtered, lazily, so a page that fills early stops the scan early.
    # Keys only, so that the scan of failed and cancelled jobs is an index-only
    # scan of their own index: with whole rows to read, the planner prefers
    # jobs_finished_idx (whose heap order it likes better) and filters out the
    # succeeded history it walks through.
    keys = "job_id, finished_at" if order is Order.FINISHED else "job_id"
    scan = f"""SELECT {keys} FROM {source}
    {scan_where}
    ORDER BY {_ORDER_BY[order]}
    LIMIT %(scan)s"""
    ordered = ", ".join(f"scanned.{c}" for c in _ORDER_BY[order].split(", "))
    # LIMIT 1 in the lateral lookup keeps the planner from turning it into a join,
    # which on a small table reads every failed job at once (as the metrics
    # collector's lookups do, for the same reason).
    sql = f"""
SELECT j.* FROM (
    {scan}
) AS scanned
CROSS JOIN LATERAL (
    SELECT {SUMMARY_COLUMNS} FROM jobs
    {_where("jobs.job_id = scanned.job_id", *filters)}
    LIMIT 1
) AS j
ORDER BY {ordered}
LIMIT %(limit)s
"""
    finished = "finished_at" if order is Order.FINISHED else "NULL::timestamptz"
    edge = f"""
SELECT count(*) OVER (), job_id, {finished} FROM (
    {scan}
) AS scanned
ORDER BY {_REVERSED[order]}
LIMIT 1
"""
    return JobList(sql, order, edge)


# ------------------------------------------------------------------- per queue

# Wake-ups due and not sent, per queue: outbox_due_idx, a range up to now.
STATS_OUTBOX_PENDING: Final = """
SELECT queue, count(*), EXTRACT(EPOCH FROM now() - min(available_at))::float8
FROM outbox
WHERE sent_at IS NULL AND available_at <= now()
GROUP BY queue
"""

# Wake-ups in flight, per queue: outbox_inflight_idx (at most a window per queue).
STATS_OUTBOX_IN_FLIGHT: Final = """
SELECT queue, count(*) FROM outbox WHERE sent_at IS NOT NULL GROUP BY queue
"""

# Jobs that finished within the window, newest first and at most %(sample)s of them
# (jobs_finished_idx, a range of the last minute), with how many of them expired
# unstarted (CANCELLED, code EXPIRED): the counts and the throughput
# cost what a minute's traffic costs, capped. The caller reads the span the sample
# covers from the oldest row when the cap was reached.
STATS_FINISHED: Final = f"""
SELECT queue, state, count(*), min(finished_at), now(),
       count(*) FILTER (WHERE last_error_code = 'EXPIRED')
FROM (SELECT queue, state, finished_at, last_error_code FROM jobs
      WHERE state IN ({TERMINAL_SQL})
        AND finished_at > now() - make_interval(secs => %(window)s)
      ORDER BY finished_at DESC
      LIMIT %(sample)s) AS recent
GROUP BY queue, state
"""

# Paused queues only: a row stays after a resume (who resumed it), and a queue
# with nothing in it that is not paused is not one to show.
STATS_QUEUES: Final = "SELECT queue, paused, paused_at, paused_by FROM queues WHERE paused"

QUEUE_GET: Final = """
SELECT queue, paused, paused_at, paused_by, resumed_at, resumed_by
FROM queues WHERE queue = %(queue)s
"""

# Live consumers per queue they serve.
STATS_WORKERS: Final = f"""
SELECT q.queue, count(*), sum(w.concurrency)::int
FROM workers AS w CROSS JOIN LATERAL unnest(w.queues) AS q(queue)
WHERE {LIVE_WORKER}
GROUP BY q.queue
"""

STATS_CLOCK: Final = "SELECT now()"

# Relays live, and of those connected to RabbitMQ.
STATS_RELAYS: Final = RELAY_LIVE_LIST

# Queues live relays cannot publish to right now, and why.
STATS_PUBLISH_FAILING: Final = RELAY_FAILING_QUEUES

# ------------------------------------------------------------------- the rest

# Each schedule with its newest ledger row (schedule_fires' primary key, backwards).
_SCHEDULES: Final = """
SELECT s.name, s.job_type, s.payload::text, s.cron, s.every_seconds, s.timezone, s.queue, s.tenant,
       s.priority, s.max_attempts, s.catchup, s.paused, s.next_fire_at, s.last_fire_at,
       s.created_at, s.updated_at,
       f.scheduled_for, f.fired_at, f.outcome, f.skip_reason, f.job_id
FROM schedules AS s
LEFT JOIN LATERAL (
    SELECT scheduled_for, fired_at, outcome, skip_reason, job_id
    FROM schedule_fires
    WHERE schedule_name = s.name
    ORDER BY scheduled_for DESC
    LIMIT 1
) AS f ON true
"""
SCHEDULES_LIST: Final = _SCHEDULES + "ORDER BY s.name"
SCHEDULE_GET: Final = _SCHEDULES + "WHERE s.name = %(name)s"

# Why the relay holds tenants' wake-ups back, per queue ('*' is a queue's clock).
TENANTS_HELD: Final = """
SELECT tenant, queue, held_reason, held_since
FROM fair_shares
WHERE held_reason IS NOT NULL AND tenant <> '*'
ORDER BY tenant, queue
"""

# Every consumer that has a row, with the leases it holds now (jobs_leased_idx), and
# whether a lease of it lapsed since it was last heard from (not live until it is).
WORKERS_LIST: Final = f"""
SELECT w.worker_id, w.host, w.pid, w.queues, w.job_types, w.concurrency, w.prefetch,
       w.started_at, w.last_seen_at, w.stopping,
       {LIVE_WORKER}, {LEASE_LAPSED},
       COALESCE(r.running, 0), w.counts, w.tenants
FROM workers AS w
LEFT JOIN (SELECT lease_owner, count(*)::int AS running
           FROM jobs WHERE state IN ({LEASED_SQL})
           GROUP BY lease_owner) AS r ON r.lease_owner = w.worker_id
ORDER BY w.host, w.pid, w.worker_id
"""

# ------------------------------------------------------------------- keys


def _waiting_behind(row: str) -> str:
    """How many jobs wait to claim the key of ``row`` (jobs_key_waiting_idx), counted
    up to %(waiting_cap)s: a lateral join that adds the column ``w.waiting``."""
    return f"""CROSS JOIN LATERAL (
    SELECT count(*)::int AS waiting
    FROM (SELECT 1 FROM jobs
          WHERE jobs.key = {row}.key AND jobs.key IS NOT NULL AND jobs.state IN ({CLAIMABLE_SQL})
          LIMIT %(waiting_cap)s) AS x
) AS w"""


# Busy keys: key_usage keeps a row only while a lease holds the key, so this reads
# what runs, never the keys' history. Per key, the jobs holding it (jobs_key_leased_idx,
# at most %(holders)s, longest held first) and how many wait for it
# (jobs_key_waiting_idx, counted up to %(waiting_cap)s). One row per holder.
KEYS_BUSY: Final = f"""
SELECT u.key, u.running, u.key_limit, w.waiting,
       h.job_id, h.job_type, h.queue, h.state, h.lease_owner, h.started_at, h.key_order
FROM (SELECT key, running, key_limit FROM key_usage ORDER BY key LIMIT %(limit)s) AS u
{_waiting_behind("u")}
LEFT JOIN LATERAL (
    SELECT job_id, job_type, queue, state, lease_owner, started_at, key_order
    FROM jobs
    WHERE jobs.key = u.key AND jobs.key IS NOT NULL AND jobs.state IN ({LEASED_SQL})
    ORDER BY started_at, job_id
    LIMIT %(holders)s
) AS h ON true
ORDER BY u.key, h.started_at, h.job_id
"""

# How many keys are busy: key_usage's rows, one per key a lease holds now.
KEYS_BUSY_COUNT: Final = "SELECT count(*)::int FROM key_usage"

# Keys held behind a FAILED job of ordered="strict" (the quarantine) until it is
# replayed or cancelled: the first such job per key, and how many wait behind it.
# jobs_key_order_idx, whose predicate this one implies: it holds the ordered
# backlog and these failed heads, never a key's finished history.
KEYS_HELD_STRICT: Final = f"""
SELECT f.key, f.job_id, f.job_type, f.queue, f.finished_at, f.last_error_code, w.waiting
FROM (SELECT DISTINCT ON (key) key, job_id, job_type, queue, finished_at, last_error_code
      FROM jobs
      WHERE key_seq IS NOT NULL AND state = 'FAILED' AND key_order = 'strict'
      ORDER BY key, key_seq
      LIMIT %(limit)s) AS f
{_waiting_behind("f")}
ORDER BY f.key
"""

READY_CHECK: Final = "SELECT 1"
