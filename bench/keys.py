"""What entity keys cost.

1. Drains (one relay, --consumers consumer processes of --concurrency slots, each
   variant in a fresh database, one after another, in one run): --jobs no-op jobs
   without a key, then the same jobs over --keys keys with key_limit=1 (so every
   claim takes a key and every outcome releases it and wakes the key's next job,
   and jobs of one key wait for each other). Prints jobs/s and the ratio.
2. Plans: with --plan-keys distinct keys waiting (each key two ordered jobs, so
   the second waits behind the first: 2 x N waiting jobs, N keys), EXPLAIN
   (ANALYZE, BUFFERS) of a claim of --batch of them (half heads that start, half
   behind one that waits: KEY_ORDER), of the relay's decision (OUTBOX_WAKE_QUEUE)
   over that backlog, and of the outcome that ends a lease of a key with the next
   one waiting (JOB_FINISH_MANY, which releases the key and wakes it), each in a
   transaction rolled back. The rows are inserted by one INSERT ... SELECT
   generate_series. The summary keeps each plan's time, buffers and rows handled
   (produced or filtered out, over all loops: the work, free of the machine's
   speed), which must not grow with the keys.

    python -m bench.keys [--jobs 20000] [--keys 10000] [--plan-keys 1000,100000]

Prints the plans, then one JSON object.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import psycopg

from bench.common import (
    argument_parser,
    explaining,
    fleet_options,
    per_count,
    plan_summary,
    report,
    scratch_database,
)
from bench.fleet import drain_rate, fleet
from harness.claim import claim_params
from hybrid_jobs import outbox
from hybrid_jobs.schema.queries import (
    JOB_CLAIM_MANY,
    JOB_FINISH_MANY,
    OUTBOX_WAKE_QUEUE,
    WORKER_TTL_SECONDS,
)


def jobs_over(keys: int, jobs: int) -> list[outbox.NewJob]:
    return [
        outbox.NewJob("noop", {}, key=f"account:{i % keys}" if keys else None) for i in range(jobs)
    ]


def drain(keys: int, jobs: int, consumers: int, concurrency: int) -> float:
    with fleet(consumers=consumers, concurrency=concurrency) as f:
        return drain_rate(f, jobs_over(keys, jobs))


def explain(conn: psycopg.Connection, sql: str, params: dict[str, Any]) -> tuple[str, Any]:
    with explaining(conn, sql, params) as (text, top):
        pass
    return text, {
        **plan_summary(top),
        # compiling the plan, inside execution_ms: PostgreSQL's JIT starts when the
        # planner's cost estimate passes jit_above_cost, which a long outbox's
        # estimates do whatever the work done
        "jit_ms": round(top.get("JIT", {}).get("Timing", {}).get("Total", 0.0), 2),
    }


# N keys, two ordered jobs each (the second behind the first), every one with a
# pending wake-up; and one key held by a running job with N/1000 (at least 10)
# jobs waiting behind it, for the outcome's plan.
SEED = """
INSERT INTO jobs (job_id, job_type, key, key_limit, key_order, key_seq, created_at)
SELECT gen_random_uuid(), 'noop', 'account:' || g, 1, 'ordered',
       nextval('jobs_key_seq'), now() - interval '1 minute'
FROM generate_series(1, %(keys)s) AS g, generate_series(1, 2) AS second
"""
SEED_WAKEUPS = """
INSERT INTO outbox (job_id, queue, available_at)
SELECT job_id, 'default', now() - interval '1 minute' FROM jobs
"""
SEED_HELD = """
WITH head AS (
    INSERT INTO jobs (job_id, job_type, key, key_limit, state, lease_owner, lease_expires_at,
                      lease_generation, attempt_count, max_attempts, started_at)
    VALUES (%(head)s, 'noop', 'busy', 1, 'RUNNING', 'bench', now() + interval '1 hour',
            1, 1, 5, now())
), waiting AS (
    INSERT INTO jobs (job_id, job_type, key, key_limit, delay_reason)
    SELECT gen_random_uuid(), 'noop', 'busy', 1, 'KEY_BUSY'
    FROM generate_series(1, %(waiting)s)
)
INSERT INTO key_usage (key, running, key_limit) VALUES ('busy', 1, 1)
"""


def plans(keys: int, batch: int) -> dict[str, Any]:
    head = uuid.uuid4()
    with (
        scratch_database("bench_keys") as db,
        psycopg.connect(db.conninfo, autocommit=True) as conn,
    ):
        started = time.monotonic()
        conn.execute(SEED, {"keys": keys})
        conn.execute(SEED_WAKEUPS)
        conn.execute(SEED_HELD, {"head": head, "waiting": max(10, keys // 1000)})
        conn.execute("VACUUM ANALYZE")
        seeded = round(time.monotonic() - started, 1)
        # from the middle of the keys: heads (they start) and the jobs behind them
        middle = f"account:{keys // 2}"
        ids = [
            r[0]
            for r in conn.execute(
                "SELECT job_id FROM jobs WHERE key >= %s AND key_seq IS NOT NULL"
                " ORDER BY key, key_seq LIMIT %s",
                [middle, batch],
            ).fetchall()
        ]
        claim = claim_params(ids, "bench") | {"lease_seconds": 60}
        decision = {"queue": "default", "limit": 500, "window": 200, "min_window": 1, "slack": 0,
                    "worker_ttl": WORKER_TTL_SECONDS, "bulk": 1000,
                    "near": False, "scan": 32}  # fmt: skip
        finish = {
            "outcomes": json.dumps(
                [{"job_id": str(head), "generation": 1, "kind": "succeeded", "result": None}]
            ),
            "worker": "bench",
        }
        found: dict[str, Any] = {"seed_seconds": seeded}
        for name, sql, params in (
            ("claim", JOB_CLAIM_MANY, claim),
            ("decision", OUTBOX_WAKE_QUEUE, decision),
            ("finish", JOB_FINISH_MANY, finish),
        ):
            explain(conn, sql, params)  # warm the caches
            text, summary = explain(conn, sql, params)
            print(f"--- {name}: {keys} keys waiting\n{text}\n", flush=True)
            found[name] = summary
        return found


def main() -> None:
    parser = argument_parser("bench.keys", __doc__)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs drained per variant")
    parser.add_argument("--keys", type=int, default=10_000, help="keys of the keyed drain")
    parser.add_argument("--plan-keys", default="1000,100000",
                        help="counts of distinct waiting keys to print the plans for")  # fmt: skip
    parser.add_argument("--batch", type=int, default=20, help="job ids in the planned claim")
    fleet_options(parser, consumers=2, concurrency=50)
    parser.add_argument("--skip-plans", action="store_true", help="only the drains")
    parser.add_argument("--skip-drains", action="store_true", help="only the plans")
    args = parser.parse_args()
    started = time.monotonic()
    planned = {} if args.skip_plans else per_count(args.plan_keys, lambda n: plans(n, args.batch))
    rates: dict[str, float] = {}
    if not args.skip_drains:
        rates["no key"] = drain(0, args.jobs, args.consumers, args.concurrency)
        rates[f"{args.keys} keys, key_limit 1"] = drain(
            args.keys, args.jobs, args.consumers, args.concurrency
        )
    first = next(iter(rates.values()), None)
    result: dict[str, Any] = {
        "plans": planned,
        "jobs": args.jobs,
        "drain_jobs_per_s": {k: round(v) for k, v in rates.items()},
        "ratio_to_no_key": {k: round(v / first, 2) for k, v in rates.items()} if first else {},
        "seconds": round(time.monotonic() - started),
    }
    report("keys", result)


if __name__ == "__main__":
    main()
