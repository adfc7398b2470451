"""Tenants at scale: what the relay's decision costs per pass, and how fast many
capped tenants drain.

1. Plans: for 10, 1,000 and 10,000 tenants (each capped at --cap running, with
   --per-tenant wake-ups due), EXPLAIN (ANALYZE, BUFFERS) of one decision
   (OUTBOX_WAKE_QUEUE) with a room of --window reading every tenant, of the same
   decision reading the next tenants only (a scan of NEAR_SCAN_PER_ROOM wake-ups
   per one of room, as the relay first asks), and of one with the window full, each
   in a transaction rolled back. The plans are printed as text; the summary keeps
   each one's execution time, buffers and rows handled (produced or filtered out,
   over all loops: the work, free of the machine's speed).
2. Drains (one relay, --consumers consumer processes of --concurrency slots, each
   variant in a fresh database, one after another): --jobs no-op jobs with no
   tenant, over --tenants tenants each capped at --cap, and over --many-tenants
   tenants each capped at --cap.

To compare with the code before the scale work (5bfb716), copy this file and
bench/common.py into a checkout of it and run both in one window.

Prints the plans, then one JSON object.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from bench.common import (
    against_first,
    argument_parser,
    committing,
    explaining,
    fleet_options,
    per_count,
    plan_summary,
    report,
    scratch_database,
)
from bench.fleet import drain_rate, fleet
from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.relay.wake import NEAR_SCAN_PER_ROOM
from hybrid_jobs.schema.queries import OUTBOX_WAKE_QUEUE, WORKER_TTL_SECONDS


def names(tenants: int) -> list[str]:
    return [f"tenant-{i:05d}" for i in range(tenants)]


def set_caps(db: DatabaseUrl, tenants: int, cap: int) -> None:
    with committing(db) as session:
        for name in names(tenants):
            outbox.set_tenant_limit(session, name, max_running=cap)


def jobs_over(tenants: int, jobs: int) -> list[outbox.NewJob]:
    spread = names(tenants)
    return [outbox.NewJob("noop", {}, tenant=spread[i % tenants] if tenants else None)
            for i in range(jobs)]  # fmt: skip


def explain(
    conn: psycopg.Connection, window: int, near: bool = False
) -> tuple[str, dict[str, Any]]:
    params = {"queue": "default", "limit": 500, "window": window, "min_window": 1, "slack": 0,
              "worker_ttl": WORKER_TTL_SECONDS, "bulk": 1000, "near": near,
              "scan": NEAR_SCAN_PER_ROOM * window}  # fmt: skip
    with explaining(conn, OUTBOX_WAKE_QUEUE, params) as (text, top):
        sent = conn.execute("SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL").fetchone()
    return text, {
        **plan_summary(top),
        "in_flight_after": int(sent[0]) if sent else 0,
    }


def plans(tenants: int, per_tenant: int, cap: int, window: int) -> dict[str, Any]:
    with scratch_database("bench_tenants_scale") as db:
        set_caps(db, tenants, cap)
        with committing(db) as session:
            outbox.enqueue_many(session, jobs_over(tenants, tenants * per_tenant))
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
            explain(conn, window)  # warm the caches and the plan's first reads
            text, with_room = explain(conn, window)
            print(f"--- the decision: {tenants} tenants, room {window}\n{text}\n", flush=True)
            explain(conn, window, near=True)
            text, near = explain(conn, window, near=True)
            print(
                f"--- the decision: {tenants} tenants, room {window}, the next tenants only"
                f"\n{text}\n",
                flush=True,
            )
            conn.execute(
                "UPDATE outbox SET sent_at = now()"
                " WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT %s)",
                [window],
            )
            explain(conn, window)
            text, full = explain(conn, window)
            print(f"--- the decision: {tenants} tenants, window full\n{text}\n", flush=True)
    return {"with_room": with_room, "next_tenants_only": near, "window_full": full}


def drain(tenants: int, cap: int | None, jobs: int, consumers: int, concurrency: int) -> float:
    with fleet(consumers=consumers, concurrency=concurrency) as f:
        if tenants and cap is not None:
            set_caps(f.db, tenants, cap)
        return drain_rate(f, jobs_over(tenants, jobs))


def main() -> None:
    parser = argument_parser("bench.tenants_scale", __doc__)
    parser.add_argument("--plan-tenants", default="10,1000,10000",
                        help="tenant counts to print the decision's plans for")  # fmt: skip
    parser.add_argument("--per-tenant", type=int, default=10, help="wake-ups due per tenant")
    parser.add_argument("--window", type=int, default=200, help="room of the planned decision")
    parser.add_argument("--cap", type=int, default=5, help="max_running of every tenant")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs drained per variant")
    parser.add_argument("--tenants", type=int, default=1000, help="capped tenants of the drain")
    parser.add_argument("--many-tenants", type=int, default=10_000,
                        help="capped tenants of the last drain")  # fmt: skip
    fleet_options(parser)
    parser.add_argument("--skip-plans", action="store_true", help="only the drains")
    args = parser.parse_args()
    started = time.monotonic()
    planned = {}
    if not args.skip_plans:
        planned = per_count(
            args.plan_tenants, lambda n: plans(n, args.per_tenant, args.cap, args.window)
        )
    variants = {
        "no tenant": (0, None),
        f"{args.tenants} tenants capped at {args.cap}": (args.tenants, args.cap),
        f"{args.many_tenants} tenants capped at {args.cap}": (args.many_tenants, args.cap),
    }
    rates = {
        name: drain(tenants, cap, args.jobs, args.consumers, args.concurrency)
        for name, (tenants, cap) in variants.items()
    }
    result: dict[str, Any] = {
        "decision_plans": planned,
        "jobs": args.jobs,
        **against_first(rates, "ratio_to_no_tenant"),
        "seconds": round(time.monotonic() - started),
    }
    report("tenants_scale", result)


if __name__ == "__main__":
    main()
