"""The operator surface's reads on a long history: their plans and their cost must
follow the backlog (or the page), not the finished jobs.

1. A scratch database gets --finished finished jobs (UUIDv7 ids; 94 % succeeded,
   4 % failed, 2 % cancelled; the failures spread through the history, or with
   --failures old all in its oldest tenth) and a --backlog of waiting and running
   jobs, their wake-ups, and a minute of recent traffic; then VACUUM ANALYZE.
2. Every job-list variant (each state and none; no filter, a queue, a job type
   that matches nothing, all three; first page and a later one) and every
   per-queue statement is run under EXPLAIN (ANALYZE, BUFFERS): its time, the
   indexes it used, and the most rows one scan of jobs read. A generic plan (what
   a pooled connection runs once psycopg prepares the statement) is measured too.
3. For comparison, the naive statements: a count over finished jobs, one
   `state IN (...)` list spanning two partial indexes (each scans the whole table).

    python -m bench.surface_plans [--finished 1000000] [--backlog 20000] [--failures spread|old]

Prints one JSON object.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg

from bench.common import argument_parser, report, scratch_database
from harness.history import fill, job_lists, middle_of_the_failed
from harness.plans import plan as explain_plan
from hybrid_jobs.jobctl.metrics.queries import METRICS_JOBS_LEASED, METRICS_JOBS_WAITING
from hybrid_jobs.jobctl.service import queries
from hybrid_jobs.schema.queries import WORKER_TTL_SECONDS
from hybrid_jobs.schema.states import JobState

PAGE = 51  # a page of 50, and one to tell whether there is a next
SCAN = 10_000  # jobctl.service.jobs.SCAN_LIMIT

RECENT = """
UPDATE jobs SET finished_at = now() - make_interval(secs => random() * 50)
WHERE job_id IN (SELECT job_id FROM jobs WHERE state = 'SUCCEEDED'
                 ORDER BY finished_at DESC LIMIT %(n)s)
"""
WAKEUPS = """
INSERT INTO outbox (job_id, queue, available_at, sent_at)
SELECT job_id, queue, run_after, CASE WHEN random() < 0.2 THEN now() END
FROM jobs WHERE state IN ('QUEUED', 'RETRY_WAIT')
"""
NAIVE = {
    "count of waiting and running in one state IN (...)": (
        "SELECT queue, state, count(*) FROM jobs"
        " WHERE state IN ('QUEUED', 'RETRY_WAIT', 'RUNNING', 'CANCEL_REQUESTED')"
        " GROUP BY queue, state"
    ),
    "count by state over every job": "SELECT state, count(*) FROM jobs GROUP BY state",
    "newest jobs of a type that matches nothing, unbounded": (
        "SELECT job_id FROM jobs WHERE job_type = 'nope' ORDER BY job_id DESC LIMIT 51"
    ),
}


def summary(plan: dict[str, Any]) -> dict[str, Any]:
    indexes: list[str] = []
    scans: list[int] = []

    def walk(node: dict[str, Any]) -> Iterator[None]:
        if "Index Name" in node:
            indexes.append(node["Index Name"])
        if node.get("Relation Name") == "jobs":
            if node["Node Type"] == "Seq Scan":
                indexes.append("Seq Scan on jobs")
            read = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            scans.append(read * node["Actual Loops"])
        for child in node.get("Plans", []):
            yield from walk(child)
        yield None

    list(walk(plan["Plan"]))
    return {
        "ms": round(plan["Execution Time"], 3),
        "jobs_rows_read": max(scans, default=0),
        "indexes": sorted(set(indexes)),
        "buffers": plan["Plan"].get("Shared Hit Blocks", 0)
        + plan["Plan"].get("Shared Read Blocks", 0),
    }


def explain(conn: psycopg.Connection, statement: str, params: dict[str, Any]) -> dict[str, Any]:
    return summary(explain_plan(conn, statement, params)[0])


def explain_generic(
    conn: psycopg.Connection, statement: str, params: dict[str, Any]
) -> dict[str, Any]:
    return summary(explain_plan(conn, statement, params, generic=True)[0])


def lists(conn: psycopg.Connection) -> dict[str, Any]:
    params = {
        "queue": "q1",
        "job_type": "nope",
        "tenant": "t3",
        "limit": PAGE,
        "scan": SCAN,
    } | middle_of_the_failed(conn)
    found: dict[str, Any] = {}
    filter_sets = [(), ("queue",), ("job_type",), ("queue", "job_type", "tenant")]
    for state in [None, *JobState]:
        for filters, after, listing in job_lists(state, filter_sets):
            name = f"{state or 'any state'} | {'+'.join(filters) or 'no filter'}"
            name += " | later page" if after else " | first page"
            found[name] = {
                "custom": explain(conn, listing.sql, params),
                "generic": explain_generic(conn, listing.sql, params),
            }
            if listing.edge_sql is not None:
                found[name]["edge (when a page comes back short)"] = explain(
                    conn, listing.edge_sql, params
                )
    return found


def per_queue(conn: psycopg.Connection) -> dict[str, Any]:
    params = {"window": 60.0, "sample": 20_000, "worker_ttl": WORKER_TTL_SECONDS}
    statements = {
        "jobs waiting (METRICS_JOBS_WAITING)": METRICS_JOBS_WAITING,
        "jobs leased (METRICS_JOBS_LEASED)": METRICS_JOBS_LEASED,
        "STATS_OUTBOX_PENDING": queries.STATS_OUTBOX_PENDING,
        "STATS_OUTBOX_IN_FLIGHT": queries.STATS_OUTBOX_IN_FLIGHT,
        "STATS_FINISHED (last minute, sampled)": queries.STATS_FINISHED,
        "STATS_WORKERS": queries.STATS_WORKERS,
        "WORKERS_LIST": queries.WORKERS_LIST,
        "SCHEDULES_LIST": queries.SCHEDULES_LIST,
    }
    return {
        name: {"custom": explain(conn, s, params), "generic": explain_generic(conn, s, params)}
        for name, s in statements.items()
    }


def one_job(conn: psycopg.Connection) -> dict[str, Any]:
    row = conn.execute("SELECT job_id FROM jobs WHERE state = 'FAILED' LIMIT 1").fetchone()
    assert row is not None
    params = {"job_id": row[0], "limit": 100}
    return {
        "JOB_GET": explain(conn, queries.JOB_GET, params),
        "JOB_ATTEMPTS": explain(conn, queries.JOB_ATTEMPTS, params),
    }


def main() -> None:
    parser = argument_parser("bench.surface_plans", __doc__)
    parser.add_argument("--finished", type=int, default=1_000_000, help="finished jobs")
    parser.add_argument("--backlog", type=int, default=20_000, help="waiting and running jobs")
    parser.add_argument(
        "--recent", type=int, default=5_000, help="jobs finished in the last minute"
    )
    parser.add_argument("--failures", choices=["spread", "old"], default="spread")
    args = parser.parse_args()
    with (
        scratch_database("surface_bench") as db,
        psycopg.connect(db.conninfo, autocommit=True) as conn,
    ):
        started = time.perf_counter()
        old = args.finished // 10 if args.failures == "old" else None
        fill(conn, args.finished, args.backlog, span_seconds=30 * 86_400, failures_until=old)
        conn.execute(WAKEUPS)
        conn.execute(RECENT, {"n": args.recent})
        conn.execute("VACUUM ANALYZE")
        fill_s = time.perf_counter() - started
        counts = dict(conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())
        result = {
            "jobs_by_state": counts,
            "failures": args.failures,
            "fill_seconds": round(fill_s, 1),
            "page": PAGE - 1,
            "scan_bound": SCAN,
            "lists": lists(conn),
            "per_queue": per_queue(conn),
            "one_job": one_job(conn),
            "naive_for_comparison": {n: explain(conn, s, {}) for n, s in NAIVE.items()},
        }
    report("surface_plans", result)


if __name__ == "__main__":
    main()
