"""Consumer benchmark: drain throughput, commit-to-start latency, and a plain SKIP
LOCKED loop as the baseline, in one run against one database.

    python -m bench.drain [--jobs 20000] [--consumers 2] [--concurrency 50]
                          [--rate 200] [--seconds 10]

1. drain: N no-op jobs committed at once with enqueue_many, one relay and K
   `consumer` processes; jobs/s from the commit until the last is SUCCEEDED;
2. latency: one job per transaction at a fixed rate; from each commit to its
   handler's first line, p50/p95/p99;
3. baseline: N jobs drained by K processes each running the unbatched loop a plain
   job table would (claim one with FOR UPDATE SKIP LOCKED, commit; complete it,
   commit), same database, same machine.

Prints one JSON object.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import outbox
from bench.common import (
    BIN,
    argument_parser,
    machine,
    percentiles,
    scratch_database,
    scratch_topology,
    service_env,
)
from plumbing.config import DatabaseUrl

# The loop a plain table-backed queue runs, one commit per transition.
BASELINE_CLAIM = """
UPDATE jobs SET state = 'RUNNING', lease_owner = %(worker)s,
       lease_expires_at = now() + interval '60 seconds',
       lease_generation = lease_generation + 1, attempt_count = attempt_count + 1,
       started_at = now(), updated_at = now()
WHERE job_id = (
    SELECT job_id FROM jobs
    WHERE state IN ('QUEUED', 'RETRY_WAIT') AND run_after <= now() AND queue = 'baseline'
    ORDER BY run_after
    FOR UPDATE SKIP LOCKED
    LIMIT 1)
RETURNING job_id, lease_generation
"""
BASELINE_COMPLETE = """
UPDATE jobs SET state = 'SUCCEEDED', lease_owner = NULL, lease_expires_at = NULL,
       finished_at = now(), updated_at = now()
WHERE job_id = %(job_id)s AND lease_owner = %(worker)s AND lease_generation = %(generation)s
"""


def count(db: DatabaseUrl, sql: str) -> int:
    with psycopg.connect(db.conninfo) as conn:
        return int(conn.execute(sql).fetchone()[0])  # type: ignore[index]


def wait_succeeded(db: DatabaseUrl, job_type: str, n: int, timeout: float = 600) -> float:
    deadline = time.monotonic() + timeout
    sql = f"SELECT count(*) FROM jobs WHERE job_type = '{job_type}' AND state = 'SUCCEEDED'"
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if conn.execute(sql).fetchone()[0] >= n:  # type: ignore[index]
                return time.perf_counter()
            time.sleep(0.01)
    raise TimeoutError(f"{job_type}: not all {n} jobs succeeded in {timeout}s")


def drain(db: DatabaseUrl, n: int) -> float:
    engine = create_engine(db.sqlalchemy)
    with Session(engine) as session, session.begin():
        outbox.enqueue_many(session, [outbox.NewJob("noop", {"i": i}) for i in range(n)])
    committed = time.perf_counter()
    engine.dispose()
    return n / (wait_succeeded(db, "noop", n) - committed)


def latency(db: DatabaseUrl, rate: float, seconds: float, starts_dir: Path) -> dict[str, float]:
    engine = create_engine(db.sqlalchemy, pool_size=2)
    committed: dict[str, float] = {}
    total = int(rate * seconds)
    began = time.perf_counter()
    for i in range(total):
        # A fixed schedule, not "as fast as possible": the target moment of job i.
        delay = began + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        with Session(engine) as session, session.begin():
            job_id = outbox.enqueue(session, "latency", {})
        committed[str(job_id)] = time.time()
    engine.dispose()
    wait_succeeded(db, "latency", total)
    started: dict[str, float] = {}
    for path in starts_dir.glob("*.txt"):
        for line in path.read_text().splitlines():
            job_id, at = line.split()
            started.setdefault(job_id, float(at))
    samples = [(started[j] - c) * 1000 for j, c in committed.items() if j in started]
    return percentiles(samples) | {"jobs": len(samples), "rate_per_s": rate}


def _baseline_worker(conninfo: str, stop_after: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    worker = f"baseline-{os.getpid()}"
    done = 0
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while True:
            row = conn.execute(BASELINE_CLAIM, {"worker": worker}).fetchone()
            if row is None:
                break
            conn.execute(
                BASELINE_COMPLETE, {"job_id": row[0], "worker": worker, "generation": row[1]}
            )
            done += 1
            if done >= stop_after:
                break
    out.put(done)


def baseline(db: DatabaseUrl, n: int, workers: int) -> float:
    with psycopg.connect(db.conninfo) as conn:
        conn.execute(
            "INSERT INTO jobs (job_id, job_type, queue, payload)"
            " SELECT gen_random_uuid(), 'baseline', 'baseline', jsonb_build_object('i', i)"
            " FROM generate_series(1, %s) AS i",
            [n],
        )
        # Fresh statistics, so the planner walks the claimable index instead of
        # sorting every claimable row on each claim: the loop at its best.
        conn.execute("ANALYZE jobs")
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    procs = [
        multiprocessing.Process(target=_baseline_worker, args=(db.conninfo, n, out))
        for _ in range(workers)
    ]
    started = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - started
    done = sum(out.get() for _ in procs)
    assert done == n, f"baseline drained {done} of {n}"
    return n / elapsed


def main() -> None:
    parser = argument_parser("bench.drain", __doc__)
    parser.add_argument(
        "--jobs", type=int, default=20_000, help="jobs drained, by the system and the baseline"
    )
    parser.add_argument(
        "--consumers", type=int, default=2, help="consumer processes (and baseline workers)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=50, help="handlers at once per consumer process"
    )
    parser.add_argument(
        "--rate", type=float, default=200, help="jobs per second committed in the latency run"
    )
    parser.add_argument(
        "--seconds", type=float, default=10, help="length of the latency run, in seconds"
    )
    args = parser.parse_args()

    starts_dir = Path(tempfile.mkdtemp(prefix="bench-starts-"))
    with scratch_database() as db, scratch_topology(["default"]) as topology:
        env = service_env(db, topology) | {"BENCH_STARTS_DIR": str(starts_dir)}
        relay = subprocess.Popen([str(BIN / "relay")], env=env)
        consumers = [
            subprocess.Popen(
                [
                    str(BIN / "consumer"),
                    "--app",
                    "bench.apps",
                    "--concurrency",
                    str(args.concurrency),
                ],
                env=env,
            )
            for _ in range(args.consumers)
        ]
        try:
            time.sleep(3)  # connected, consuming
            drain_rate = drain(db, args.jobs)
            lat = latency(db, args.rate, args.seconds, starts_dir)
        finally:
            for p in [*consumers, relay]:
                p.terminate()
            for p in [*consumers, relay]:
                p.wait(60)
        base_rate = baseline(db, args.jobs, args.consumers)
        attempts = count(db, "SELECT count(*) FROM job_attempts")

    print(
        json.dumps(
            {
                "benchmark": "drain",
                "jobs": args.jobs,
                "consumer_processes": args.consumers,
                "concurrency_per_process": args.concurrency,
                "drain_jobs_per_s": round(drain_rate),
                "commit_to_handler_start": lat,
                "baseline_skip_locked_jobs_per_s": round(base_rate),
                "drain_to_baseline_ratio": round(drain_rate / base_rate, 2),
                "attempt_rows": attempts,
                "machine": machine(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
