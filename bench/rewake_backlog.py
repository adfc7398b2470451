"""The re-waker and the orphan backstop under a backlog of a million waiting jobs.

    python -m bench.rewake_backlog [--jobs 1000000] [--orphans 1000] [--slice 5000]
                                   [--window 100] [--rewake-interval 2]

1. builds --jobs waiting jobs, each with its unsent wake-up, with two INSERT ...
   SELECT generate_series statements (ids in creation order, as UUIDv7 are), and
   deletes --orphans of those wake-ups (jobs
   left with none at all, as a row edited by hand would be);
2. times one scan of every waiting job for a missing wake-up: what every re-waker
   round cost before, inside the transaction of the repair;
3. walks the jobs table with the orphan backstop (relay.maintenance.wake_orphans, a
   slice of --slice jobs by primary key per round) until the lap ends, printing
   each round's time, and checks that every orphan got its wake-up;
4. starts a real relay (--window, --rewake-interval), waits until a window of
   wake-ups is in the queue, purges the queue, and prints how long the re-waker
   took to send the lost ones again (from the broker's queue depth and the relay's
   relay.rewoke_lost_wakeups).

Prints a line per round, then one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from bench.common import AMQP, System, argument_parser, report, scratch_system
from bench.peers.base import tail
from harness.backlog import build_backlog
from harness.broker import purge, queue_depth
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.relay.maintenance import OrphanWalk, wake_orphans
from hybrid_jobs.schema.queries import WORKER_TTL_SECONDS
from hybrid_jobs.schema.tables import CLAIMABLE_SQL

QUEUE = "backlog"

# Jobs left with no wake-up at all, as a row edited by hand would be.
ORPHAN = """
DELETE FROM outbox
WHERE id IN (SELECT id FROM outbox ORDER BY random() LIMIT %(orphans)s)
"""

# What every re-waker round read before: each waiting job, for a wake-up.
FULL_SCAN = f"""
SELECT count(*) FROM jobs AS j
WHERE j.state IN ({CLAIMABLE_SQL}) AND j.run_after <= now()
  AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.job_id = j.job_id)
"""

IN_FLIGHT = "SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL"

ORPHANED = f"""
SELECT count(*) FROM jobs AS j
WHERE j.state IN ({CLAIMABLE_SQL})
  AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.job_id = j.job_id)
"""


def build(db: DatabaseUrl, jobs: int, orphans: int) -> float:
    began = time.perf_counter()
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        build_backlog(conn, jobs, QUEUE)
        conn.execute(ORPHAN, {"orphans": orphans})
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("VACUUM ANALYZE outbox")
    return time.perf_counter() - began


def scalar(db: DatabaseUrl, sql: str) -> int:
    with psycopg.connect(db.conninfo) as conn:
        return int(conn.execute(sql).fetchone()[0])  # type: ignore[index]


def full_scan_ms(db: DatabaseUrl) -> float:
    with psycopg.connect(db.conninfo) as conn:
        began = time.perf_counter()
        conn.execute(FULL_SCAN).fetchone()
        return (time.perf_counter() - began) * 1000


async def walk_once(db: DatabaseUrl, size: int) -> dict[str, Any]:
    pool: AsyncConnectionPool[psycopg.AsyncConnection] = AsyncConnectionPool(
        db.conninfo, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False
    )
    await pool.open()
    walk = OrphanWalk()
    times: list[float] = []
    woken = 0
    try:
        while walk.laps == 0:
            began = time.perf_counter()
            found = await wake_orphans(
                pool, walk, grace=0, size=size, worker_ttl=WORKER_TTL_SECONDS
            )
            times.append((time.perf_counter() - began) * 1000)
            woken += len(found)
            print(f"orphan round {len(times)}: {times[-1]:.1f} ms, woke {len(found)}", flush=True)
    finally:
        await pool.close()
    return {
        "rounds": len(times),
        "woken": woken,
        "round_ms": {
            "p50": round(statistics.median(times), 1),
            "max": round(max(times), 1),
            "total": round(sum(times), 1),
        },
    }


def repair(system: System, window: int, rewake: float, logs: Path) -> dict[str, Any]:
    db, topology = system.db, system.topology
    log_path = logs / "p0.log"  # the first process's: the relay's
    relay_args = ["--window", str(window), "--rewake-interval", str(rewake)]
    system.start("relay", *relay_args, env={"LOG_LEVEL": "INFO"})
    deadline = time.monotonic() + 120
    # A window's worth in flight, and in the queue (packed: a message may
    # name up to 50 ids).
    while (
        scalar(db, IN_FLIGHT) < window or asyncio.run(queue_depth(AMQP.url, topology, QUEUE)) == 0
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the relay sent no window of wake-ups:\n{tail(log_path)}")
        time.sleep(0.2)
    asyncio.run(purge(AMQP.url, topology, QUEUE))
    purged = time.perf_counter()
    print(f"purged {window} wake-ups from the queue at {time.time():.3f}", flush=True)
    while asyncio.run(queue_depth(AMQP.url, topology, QUEUE)) == 0:
        if time.monotonic() > deadline + 120:
            raise RuntimeError(f"lost wake-ups were not repaired:\n{tail(log_path)}")
        time.sleep(0.1)
    repaired = time.perf_counter() - purged
    system.stop()  # the relay's log complete
    events = [
        json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")
    ]
    rewoken = sum(
        e.get("count", 0) for e in events if e.get("event") == "relay.rewoke_lost_wakeups"
    )
    failed = [e for e in events if e.get("event") in ("relay.chore_failed", "relay.drain_failed")]
    print(f"repaired: wake-ups in the queue again {repaired:.1f} s after the purge", flush=True)
    return {
        "lost": window,
        "rewoken": rewoken,
        "seconds_purge_to_resent": round(repaired, 2),
        "relay_failures_logged": len(failed),
    }


def main() -> None:
    parser = argument_parser("bench.rewake_backlog", __doc__)
    parser.add_argument("--jobs", type=int, default=1_000_000, help="waiting jobs")
    parser.add_argument("--orphans", type=int, default=1000, help="of those, left with no wake-up")
    parser.add_argument("--slice", type=int, default=5000, help="jobs an orphan round reads")
    parser.add_argument("--window", type=int, default=100, help="the relay's --window")
    parser.add_argument(
        "--rewake-interval", type=float, default=2.0, help="the relay's --rewake-interval"
    )
    args = parser.parse_args()

    logs = Path(tempfile.mkdtemp(prefix="bench-rewake-"))
    with scratch_system("bench_rewake", [QUEUE], logs=logs) as system:
        db = system.db
        built = build(db, args.jobs, args.orphans)
        print(f"built {args.jobs} waiting jobs in {built:.1f} s", flush=True)
        scan = full_scan_ms(db)
        print(f"one scan of every waiting job: {scan:.0f} ms", flush=True)
        walked = asyncio.run(walk_once(db, args.slice))
        left = scalar(db, ORPHANED)
        repaired = repair(system, args.window, args.rewake_interval, logs)
    result = {
        "jobs": args.jobs,
        "build_seconds": round(built, 1),
        "full_scan_ms": round(scan, 1),
        "orphan_walk": walked | {"orphans": args.orphans, "left_without_wakeup": left},
        "repair": repaired,
    }
    report("rewake_backlog", result)


if __name__ == "__main__":
    main()
