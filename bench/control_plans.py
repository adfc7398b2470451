"""The plans of the control statements (replay, pause, explain, retention) on a
table of many finished jobs: what each reads, and that none scans jobs, outbox or
job_attempts whole.

    python -m bench.control_plans [--finished 200000] [--backlog 5000] [--tenants 5]

1. a scratch database gets --finished finished jobs (90% SUCCEEDED, 7% FAILED, 3%
   CANCELLED, spread over a week, one attempt row each, an effect key for one in
   ten), a backlog of --backlog QUEUED jobs with pending wake-ups over --tenants
   tenants and two priorities, wake-ups in flight, RETRY_WAIT and RUNNING jobs, two
   live workers; then ANALYZE;
2. each statement runs under EXPLAIN (ANALYZE, BUFFERS) twice: with its parameters
   bound (the custom plan psycopg gets on a statement's first executions) and as a
   prepared statement under plan_cache_mode = force_generic_plan (the plan it may
   get once psycopg prepares a statement run often). Writes are rolled back;
3. then failures are made rare (one in twenty of them stays FAILED or CANCELLED:
   0.5% of the finished jobs) and the replay-by-filter statements are planned
   again: where failures are common PostgreSQL may walk jobs_finished_idx in time
   order, where they are rare it takes jobs_unsuccessful_idx.

Prints one JSON object: per statement and plan, the time, the buffers, each scan
(node, table, index) and the sequential scans of jobs, outbox or job_attempts (there
should be none).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any, LiteralString

import psycopg

from bench.common import argument_parser, machine, scratch_database
from harness.plans import plan as explain_plan
from hybrid_jobs.schema import queries as q

BIG_TABLES = {"jobs", "outbox", "job_attempts"}


def populate(conn: psycopg.Connection, finished: int, backlog: int, tenants: int) -> None:
    conn.execute(
        """
        INSERT INTO jobs (job_id, job_type, queue, tenant, state, attempt_count, max_attempts,
                          run_after, created_at, started_at, finished_at, last_error_code)
        SELECT gen_random_uuid(), 'work' || mod(i, 3), 'q' || mod(i, 4),
               CASE WHEN mod(i, 3) = 0 THEN NULL ELSE 't' || mod(i, %(tenants)s) END,
               s.state, 1, 5, f - interval '2 seconds', f - interval '3 seconds',
               f - interval '1 second', f,
               CASE WHEN s.state <> 'SUCCEEDED' THEN 'E' || mod(i, 4) END
        FROM generate_series(1, %(n)s) AS i,
             LATERAL (SELECT now() - make_interval(secs => (%(n)s - i) * 604800.0 / %(n)s) AS f,
                             CASE WHEN mod(i, 100) < 90 THEN 'SUCCEEDED'
                                  WHEN mod(i, 100) < 97 THEN 'FAILED'
                                  ELSE 'CANCELLED' END AS state) AS s
        """,
        {"n": finished, "tenants": tenants},
    )
    conn.execute(
        """
        INSERT INTO job_attempts (job_id, attempt, lease_generation, worker, started_at,
                                  finished_at, outcome, ready_at)
        SELECT job_id, 1, 1, 'w', started_at, finished_at, state, run_after FROM jobs
        """
    )
    conn.execute(
        "INSERT INTO job_effects (effect_key, job_id)"
        " SELECT 'fx:' || job_id, job_id FROM jobs WHERE state = 'SUCCEEDED'"
        " AND get_byte(uuid_send(job_id), 15) < 26"
    )
    # The backlog of queue q0: pending wake-ups over the tenants and two priorities.
    conn.execute(
        """
        WITH j AS (
            INSERT INTO jobs (job_id, job_type, queue, tenant, priority, run_after, created_at)
            SELECT gen_random_uuid(), 'work0', 'q0', 't' || mod(i, %(tenants)s),
                   (mod(i, 7) = 0)::int, t, t
            FROM generate_series(1, %(n)s) AS i,
                 LATERAL (SELECT now() - make_interval(secs => %(n)s - i) AS t) AS at
            RETURNING job_id, queue, tenant, priority, run_after)
        INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
        SELECT job_id, queue, tenant, priority, run_after FROM j
        """,
        {"n": backlog, "tenants": tenants},
    )
    # A window's worth in flight, retries waiting, leases held.
    conn.execute(
        "UPDATE outbox SET sent_at = now()"
        " WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT 200)"
    )
    conn.execute(
        """
        INSERT INTO jobs (job_id, job_type, queue, state, attempt_count, max_attempts, run_after,
                          last_error_code)
        SELECT gen_random_uuid(), 'work0', 'q' || mod(i, 4), 'RETRY_WAIT', 1, 5,
               now() + interval '1 hour', 'E1'
        FROM generate_series(1, 1000) AS i
        """
    )
    conn.execute(
        """
        INSERT INTO jobs (job_id, job_type, queue, state, attempt_count, max_attempts, run_after,
                          lease_owner, lease_expires_at, lease_generation, started_at)
        SELECT gen_random_uuid(), 'work0', 'q0', 'RUNNING', 1, 5, now(), 'w1',
               now() + interval '1 minute', 1, now()
        FROM generate_series(1, 50) AS i
        """
    )
    conn.execute(
        """
        INSERT INTO workers (worker_id, host, pid, queues, job_types, concurrency, prefetch)
        VALUES ('w1', 'h', 1, '{q0,q1}', '{work0,work1}', 50, 100),
               ('w2', 'h', 2, '{q0,q2}', '{work0,work2}', 50, 100)
        """
    )
    conn.execute(
        "INSERT INTO queues (queue, paused, paused_at, paused_by) VALUES ('q3', true, now(), 'ops')"
    )
    conn.execute("ANALYZE")


def pick(conn: psycopg.Connection, sql: LiteralString) -> Any:
    row = conn.execute(sql).fetchone()
    assert row is not None, sql
    return row[0]


def scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    if "Relation Name" in plan or "Index Name" in plan:
        found.append(
            {
                "node": plan["Node Type"],
                "table": plan.get("Relation Name"),
                "index": plan.get("Index Name"),
                "rows": plan.get("Actual Rows"),
                "loops": plan.get("Actual Loops"),
            }
        )
    for child in plan.get("Plans", []):
        found += scans(child)
    return found


def summarise(result: list[dict[str, Any]]) -> dict[str, Any]:
    top = result[0]
    plan = top["Plan"]
    found = scans(plan)
    return {
        "ms": round(top["Execution Time"], 3),
        "shared_hit": plan.get("Shared Hit Blocks", 0),
        "shared_read": plan.get("Shared Read Blocks", 0),
        "seq_scans_of_big_tables": sorted(
            {s["table"] for s in found if s["node"] == "Seq Scan" and s["table"] in BIG_TABLES}
        ),
        "scans": [
            f"{s['node']} {s['table'] or ''}{' via ' + s['index'] if s['index'] else ''}"
            f" ({s['rows']} rows x{s['loops']})"
            for s in found
        ],
    }


def custom_plan(conn: psycopg.Connection, sql: str, params: dict[str, Any]) -> dict[str, Any]:
    return summarise(explain_plan(conn, sql, params))


def generic_plan(conn: psycopg.Connection, sql: str, params: dict[str, Any]) -> dict[str, Any]:
    """The same statement prepared with $n parameters, planned once for any values."""
    return summarise(explain_plan(conn, sql, params, generic=True))


def cases(conn: psycopg.Connection) -> dict[str, tuple[str, dict[str, Any]]]:
    failed = pick(conn, "SELECT job_id FROM jobs WHERE state = 'FAILED' LIMIT 1")
    queued_last = pick(
        conn,
        "SELECT o.job_id FROM outbox o WHERE o.sent_at IS NULL AND o.priority = 0"
        " ORDER BY o.available_at DESC LIMIT 1",
    )
    in_flight = pick(conn, "SELECT job_id FROM outbox WHERE sent_at IS NOT NULL LIMIT 1")
    running = pick(conn, "SELECT job_id FROM jobs WHERE state = 'RUNNING' LIMIT 1")
    done = pick(conn, "SELECT job_id FROM jobs WHERE state = 'SUCCEEDED' LIMIT 1")
    wake = conn.execute(
        "SELECT o.id, o.available_at, o.sent_at, o.priority, now() FROM outbox o"
        " WHERE o.job_id = %s",
        [queued_last],
    ).fetchone()
    flight = conn.execute(
        "SELECT o.id, o.available_at, o.sent_at, o.priority, now() FROM outbox o"
        " WHERE o.job_id = %s",
        [in_flight],
    ).fetchone()
    assert wake is not None and flight is not None
    yesterday = datetime.now(UTC) - timedelta(days=1)
    replay_filters = {
        "queue": None,
        "job_type": None,
        "error_code": None,
        "finished_after": None,
        "states": ["CANCELLED", "FAILED"],
        "override": False,
    }
    backlog = {
        "queue": "q0",
        "cap": 10_000,
        "drain_window": 60.0,
        "drain_sample": 2000,
    }

    def explain_backlog(w: tuple[Any, ...], pending: bool) -> dict[str, Any]:
        return backlog | {
            "wakeup_id": w[0],
            "due": w[1],
            "sent_at": w[2],
            "priority": w[3],
            "now": w[4],
            "pending": pending,
        }

    return {
        "JOB_REPLAY": (q.JOB_REPLAY, {"job_id": failed, "by": "bench", "override": False}),
        "JOB_REPLAY_MATCHING (no filter)": (
            q.JOB_REPLAY_MATCHING,
            replay_filters | {"limit": 1000, "by": None},
        ),
        "JOB_REPLAY_MATCHING (queue, finished_after)": (
            q.JOB_REPLAY_MATCHING,
            replay_filters
            | {"queue": "q1", "finished_after": yesterday, "limit": 1000, "by": None},
        ),
        "JOB_REPLAY_MATCHING (error_code)": (
            q.JOB_REPLAY_MATCHING,
            replay_filters | {"error_code": "E2", "limit": 100, "by": None},
        ),
        "QUEUE_PAUSE": (q.QUEUE_PAUSE, {"queue": "q1", "by": None}),
        "QUEUE_RESUME": (q.QUEUE_RESUME, {"queue": "q3", "by": None}),
        "QUEUE_PAUSED_LIST": (q.QUEUE_PAUSED_LIST, {}),
        "JOB_EXPLAIN (queued)": (
            q.JOB_EXPLAIN,
            {"job_id": queued_last, "worker_ttl": q.WORKER_TTL_SECONDS},
        ),
        "JOB_EXPLAIN (running)": (
            q.JOB_EXPLAIN,
            {"job_id": running, "worker_ttl": q.WORKER_TTL_SECONDS},
        ),
        "JOB_EXPLAIN (finished)": (
            q.JOB_EXPLAIN,
            {"job_id": done, "worker_ttl": q.WORKER_TTL_SECONDS},
        ),
        "JOB_EXPLAIN_BACKLOG (pending, last in line)": (
            q.JOB_EXPLAIN_BACKLOG,
            explain_backlog(wake, True),
        ),
        "JOB_EXPLAIN_BACKLOG (in flight)": (
            q.JOB_EXPLAIN_BACKLOG,
            explain_backlog(flight, False),
        ),
        "JOB_RETENTION_DELETE": (
            q.JOB_RETENTION_DELETE,
            {"keep_seconds": 3 * 86400, "limit": 1000},
        ),
    }


def main() -> None:
    parser = argument_parser("bench.control_plans", __doc__)
    parser.add_argument("--finished", type=int, default=200_000, help="finished jobs")
    parser.add_argument("--backlog", type=int, default=5000, help="QUEUED jobs in queue q0")
    parser.add_argument("--tenants", type=int, default=5, help="tenants of the backlog")
    args = parser.parse_args()
    with scratch_database("plans") as db, psycopg.connect(db.conninfo, autocommit=True) as conn:
        populate(conn, args.finished, args.backlog, args.tenants)
        plans: dict[str, Any] = {}
        for name, (sql, params) in cases(conn).items():
            plans[name] = {
                "custom": custom_plan(conn, sql, params),
                "generic": generic_plan(conn, sql, params),
            }
        sizes = {table: pick(conn, f"SELECT count(*) FROM {table}") for table in sorted(BIG_TABLES)}
        conn.execute(
            "UPDATE jobs SET state = 'SUCCEEDED', last_error_code = NULL"
            " WHERE state IN ('CANCELLED', 'FAILED')"
            " AND mod(get_byte(uuid_send(job_id), 15), 20) <> 0"
        )
        conn.execute("VACUUM ANALYZE jobs")
        for name, (sql, params) in cases(conn).items():
            if sql is q.JOB_REPLAY_MATCHING:
                plans[f"{name} (rare failures)"] = {
                    "custom": custom_plan(conn, sql, params),
                    "generic": generic_plan(conn, sql, params),
                }
    bad = {
        f"{name} ({kind})": p["seq_scans_of_big_tables"]
        for name, kinds in plans.items()
        for kind, p in kinds.items()
        if p["seq_scans_of_big_tables"]
    }
    print(
        json.dumps(
            {
                "machine": machine(),
                "rows": sizes,
                "seq_scans_of_big_tables": bad,
                "plans": plans,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
