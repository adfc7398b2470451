"""The metrics collector's cost, and the /metrics render's, with a small and a large
finished history: they must not grow with the history.

1. For each size, a scratch database of its own gets the same backlog (jobs
   waiting, due and not, retrying, running, some with expired leases, being
   cancelled; their outbox rows), 20 recurring schedules with a full ledger of
   fires, and --small finished jobs with their attempt rows, spread over the past
   30 days, all written with INSERT ... SELECT generate_series; then VACUUM ANALYZE.
2. A first collection notes where the history stands. Then, --runs times: --recent
   jobs finish "now" (the traffic of one interval), and collect_once() is timed.
   render() is timed on the resulting cache.
3. The same again with --large finished jobs.
4. At the large size, EXPLAIN (ANALYZE, BUFFERS) of every statement a round runs,
   with the plan's node types and indexes, and the same for the one-list count
   (`state IN (all four)`, which spans two partial indexes and so scans the whole
   table), for comparison.

    python -m bench.metrics_cost [--small 10000] [--large 1000000] [--runs 10]

Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from bench.common import argument_parser, machine, percentiles, scratch_database
from hybrid_jobs.jobctl.metrics import Collector
from hybrid_jobs.jobctl.metrics import queries as q
from hybrid_jobs.plumbing.db import make_pool
from hybrid_jobs.schema.tables import CLAIMABLE_SQL, LEASED_SQL

QUEUES = 4
JOB_TYPES = 10
CHUNK = 100_000

# Finished jobs i in [lo, hi): mostly succeeded, some failed or cancelled after a
# request, one attempt each (a tenth had a failed attempt before), finished between
# %(newest)s and %(newest)s + %(span)s seconds ago.
FINISHED = f"""
WITH j AS (
    INSERT INTO jobs (job_id, job_type, queue, state, attempt_count, max_attempts,
                      lease_generation, run_after, created_at, updated_at, started_at,
                      finished_at, cancel_requested_at, last_error_code)
    SELECT gen_random_uuid(), 'type' || mod(i, {JOB_TYPES}), 'q' || mod(i, {QUEUES}),
           s.state, s.attempts, 5, s.attempts, f.at - interval '2 seconds',
           f.at - interval '2 seconds', f.at, f.at - interval '1 second', f.at,
           CASE WHEN s.state = 'CANCELLED' THEN f.at - interval '3 seconds' END,
           CASE WHEN s.state = 'FAILED' THEN 'ERROR' END
    FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i
    CROSS JOIN LATERAL (
        SELECT CASE WHEN mod(i, 100) < 90 THEN 'SUCCEEDED'
                    WHEN mod(i, 100) < 97 THEN 'FAILED' ELSE 'CANCELLED' END AS state,
               CASE WHEN mod(i, 10) = 0 THEN 2 ELSE 1 END AS attempts) AS s
    CROSS JOIN LATERAL (
        SELECT now() - make_interval(secs => %(newest)s + mod(i * 7919, %(span)s)) AS at) AS f
    RETURNING job_id, state, attempt_count, run_after, started_at, finished_at
)
INSERT INTO job_attempts (job_id, attempt, lease_generation, worker, ready_at, started_at,
                          finished_at, outcome, error_code)
SELECT job_id, attempt_count, attempt_count, 'bench-worker', run_after, started_at,
       finished_at, state, CASE WHEN state = 'FAILED' THEN 'ERROR' END
FROM j
UNION ALL
SELECT job_id, 1, 1, 'bench-worker', run_after - interval '10 seconds',
       run_after - interval '9 seconds', run_after - interval '8 seconds', 'RETRY_WAIT', 'ERROR'
FROM j WHERE attempt_count = 2
"""

# The backlog, in proportions of --backlog: waiting (mostly due, with a due unsent
# wake-up for half of those, in flight for the rest), not yet due, retrying,
# running (a few with leases expired), being cancelled.
BACKLOG = f"""
WITH waiting AS (
    INSERT INTO jobs (job_id, job_type, queue, state, run_after, attempt_count,
                      lease_generation, lease_owner, lease_expires_at, started_at,
                      cancel_requested_at)
    SELECT gen_random_uuid(), 'type' || mod(i, {JOB_TYPES}), 'q' || mod(i, {QUEUES}), b.state,
           now() + make_interval(secs => b.due_in), b.leased::int, b.leased::int,
           CASE WHEN b.leased THEN 'bench-worker' END,
           CASE WHEN b.leased THEN now() + make_interval(secs => b.lease_s) END,
           CASE WHEN b.leased THEN now() - interval '5 seconds' END,
           CASE WHEN b.state = 'CANCEL_REQUESTED' THEN now() END
    FROM generate_series(0, %(n)s::int - 1) AS i
    CROSS JOIN LATERAL (
        SELECT s.state, s.due_in, s.state IN ({LEASED_SQL}) AS leased,
               CASE WHEN mod(i, 50) = 0 THEN -30 ELSE 60 END AS lease_s
        FROM (SELECT CASE WHEN mod(i, 20) < 14 THEN 'QUEUED'
                          WHEN mod(i, 20) < 17 THEN 'RETRY_WAIT'
                          WHEN mod(i, 20) < 19 THEN 'RUNNING'
                          ELSE 'CANCEL_REQUESTED' END AS state,
                     CASE WHEN mod(i, 20) < 12 THEN -mod(i, 600)
                          WHEN mod(i, 20) < 14 THEN 3600
                          WHEN mod(i, 20) < 17 THEN mod(i, 120) - 30
                          ELSE -60 END AS due_in) AS s
    ) AS b
    RETURNING job_id, queue, state, run_after
)
INSERT INTO outbox (job_id, queue, available_at, sent_at)
SELECT job_id, queue, run_after,
       CASE WHEN run_after <= now() AND random() < 0.5 THEN now() END
FROM waiting WHERE state IN ({CLAIMABLE_SQL})
"""

# Recurring schedules with a full ledger (the relay keeps 1000 fires each), one fire
# a minute for the last 1000 minutes.
SCHEDULES = """
WITH s AS (
    INSERT INTO schedules (name, job_type, every_seconds, next_fire_at)
    SELECT 'schedule' || n, 'type0', 60, now() + interval '1 minute'
    FROM generate_series(1, %(schedules)s::int) AS n
    RETURNING name
)
INSERT INTO schedule_fires (schedule_name, scheduled_for, fired_at, delay_seconds, outcome, job_id)
SELECT s.name, now() - make_interval(mins => k), now() - make_interval(mins => k, secs => -0.2),
       0.2, 'enqueued', gen_random_uuid()
FROM s CROSS JOIN generate_series(1, 1000) AS k
"""


def insert_finished(conn: psycopg.Connection, lo: int, hi: int, newest: int, span: int) -> None:
    for start in range(lo, hi, CHUNK):
        conn.execute(
            FINISHED,
            {"lo": start, "hi": min(hi, start + CHUNK), "newest": newest, "span": span},
        )


def vacuum(db_conninfo: str) -> None:
    with psycopg.connect(db_conninfo, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


async def measure(
    pool: AsyncConnectionPool[AsyncConnection],
    conninfo: str,
    first_id: int,
    runs: int,
    recent: int,
) -> tuple[dict[str, Any], Collector]:
    """Rounds of a fresh collector, each after --recent jobs finished. The rounds
    follow each other at once, so each re-reads the traffic of all the runs before
    it (all within the overlap): round k reads k x --recent attempt rows."""
    collector = Collector(pool)
    assert await collector.collect_once()  # the baseline round
    collect_ms: list[float] = []
    next_id = first_id
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for _ in range(runs):
            # one interval's traffic, finished within the last 15 s
            insert_finished(conn, next_id, next_id + recent, 0, 15)
            next_id += recent
            started = time.perf_counter()
            assert await collector.collect_once()
            collect_ms.append((time.perf_counter() - started) * 1000)
    render_ms: list[float] = []
    size = 0
    for _ in range(max(50, runs)):
        started = time.perf_counter()
        body, _content_type = collector.render()
        render_ms.append((time.perf_counter() - started) * 1000)
        size = len(body)
    return {
        "collect_once": percentiles(collect_ms) | {"min_ms": round(min(collect_ms), 2)},
        "render": percentiles(render_ms),
        "exposition_bytes": size,
        "series": sum(1 for line in body.splitlines() if not line.startswith(b"#")),
    }, collector


def _plan_summary(plan: dict[str, Any]) -> dict[str, Any]:
    nodes: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        label = node["Node Type"]
        if "Index Name" in node:
            label += f" on {node['Index Name']}"
        elif "Relation Name" in node:
            label += f" on {node['Relation Name']}"
        nodes.append(label)
        for child in node.get("Plans", []):
            walk(child)

    top = plan["Plan"]
    walk(top)
    return {
        "nodes": nodes,
        "execution_ms": round(plan["Execution Time"], 3),
        "shared_buffers_hit": top.get("Shared Hit Blocks", 0),
        "shared_buffers_read": top.get("Shared Read Blocks", 0),
    }


def explain_all(conninfo: str, collector: Collector) -> dict[str, Any]:
    """The plans of a round's statements, the history reads as in a steady round:
    the mark one interval ago, re-reading the overlap behind it."""
    naive = f"""
SELECT queue, state, count(*) FROM jobs
WHERE state IN ({CLAIMABLE_SQL}, {LEASED_SQL}) GROUP BY queue, state
"""
    with psycopg.connect(conninfo) as conn:
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        settings = collector.settings
        mark = row[0] - timedelta(seconds=settings.interval)
        since = {
            "low": mark - timedelta(seconds=settings.overlap),
            "cursor": mark,
            "limit": settings.batch,
        }
        recent = conn.execute(
            "SELECT job_id, lease_generation FROM job_attempts"
            " WHERE finished_at > now() - interval '1 minute' LIMIT 10"
        ).fetchall()
        late_keys = {"job_ids": [r[0] for r in recent], "generations": [r[1] for r in recent]}
        statements: dict[str, tuple[str, Any]] = {
            "jobs_waiting": (q.METRICS_JOBS_WAITING, None),
            "jobs_leased": (q.METRICS_JOBS_LEASED, None),
            "outbox_due": (q.METRICS_OUTBOX_DUE, None),
            "workers": (q.METRICS_WORKERS, None),
            "attempts_late (keys in the overlap)": (q.METRICS_ATTEMPTS_LATE, since),
            "attempts_ahead (past the mark)": (q.METRICS_ATTEMPTS_AHEAD, since),
            "attempts_by_key (late ones not yet counted: 10 here)": (
                q.METRICS_ATTEMPTS_BY_KEY,
                late_keys,
            ),
            "cancellations_since": (q.METRICS_CANCELLATIONS_SINCE, since),
            "schedule_fires_since": (q.METRICS_SCHEDULE_FIRES_SINCE, since),
            "naive_one_list_count (spans two indexes, not used)": (naive, None),
        }
        plans = {}
        for name, (sql, params) in statements.items():
            row = conn.execute(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}",
                params,
            ).fetchone()
            assert row is not None
            plans[name] = _plan_summary(row[0][0])
        conn.rollback()
    return plans


async def one_size(args: Any, finished: int, explain: bool) -> dict[str, Any]:
    """A database of its own with the backlog and ``finished`` finished jobs: the
    collector's and the render's cost there (and the plans, if asked)."""
    with scratch_database("metrics_bench") as db:
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            conn.execute(BACKLOG, {"n": args.backlog})
            conn.execute(SCHEDULES, {"schedules": 20})
            started = time.perf_counter()
            insert_finished(conn, 0, finished, 600, 30 * 86400)
            fill_s = time.perf_counter() - started
        vacuum(db.conninfo)
        pool = make_pool(db, "bench-metrics", 2)
        await pool.open()
        try:
            timing, collector = await measure(pool, db.conninfo, finished, args.runs, args.recent)
            plans = explain_all(db.conninfo, collector) if explain else None
            with psycopg.connect(db.conninfo) as conn:
                counts: dict[str, int] = dict(
                    conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall()
                )
                row = conn.execute("SELECT count(*) FROM job_attempts").fetchone()
        finally:
            await pool.close()
    return timing | {
        "fill_seconds": round(fill_s, 1),
        "tables": {"jobs_by_state": counts, "job_attempts": row[0] if row else 0},
        **({"plans": plans} if plans else {}),
    }


async def run(args: Any) -> dict[str, Any]:
    small = await one_size(args, args.small, explain=False)
    large = await one_size(args, args.large, explain=True)
    plans = large.pop("plans")

    def ratio(what: str, stat: str) -> float:
        return round(float(large[what][stat]) / float(small[what][stat]), 2)

    return {
        "benchmark": "metrics_cost",
        "finished_jobs": [args.small, args.large],
        "backlog_jobs": args.backlog,
        "recent_finished_per_round": args.recent,
        "runs": args.runs,
        "by_finished_jobs": {str(args.small): small, str(args.large): large},
        "large_over_small": {
            "collect_once_p50": ratio("collect_once", "p50_ms"),
            "collect_once_p95": ratio("collect_once", "p95_ms"),
            "render_p50": ratio("render", "p50_ms"),
            "render_p95": ratio("render", "p95_ms"),
        },
        "plans_at_large": plans,
        "machine": machine(),
    }


def main() -> None:
    parser = argument_parser("bench.metrics_cost", __doc__)
    parser.add_argument("--small", type=int, default=10_000, help="finished jobs, first")
    parser.add_argument("--large", type=int, default=1_000_000, help="finished jobs, then")
    parser.add_argument("--runs", type=int, default=10, help="timed collections per size")
    parser.add_argument(
        "--recent", type=int, default=1_000, help="jobs finished between two collections"
    )
    parser.add_argument(
        "--backlog", type=int, default=4_000, help="jobs not finished (waiting, running...)"
    )
    args = parser.parse_args()
    if not 0 < args.small < args.large:
        parser.error("--small must be positive and smaller than --large")
    result: dict[str, Any] = {}

    async def go() -> None:
        result.update(await run(args))

    asyncio.run(go())
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
