"""Load: four producer processes enqueue as fast as they can (one job per
transaction, like a web request) while one relay and two consumers drain.

    python -m bench.load [--producers 4] [--seconds 30] [--consumers 2]

Prints the enqueue rate, the drain rate, queue wait percentiles (commit to first
attempt start, from the database's own timestamps) and every error a producer or
a worker saw; a deadlock or serialization failure reaching either is a failure.
"""

from __future__ import annotations

import json
import multiprocessing
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bench.common import (
    argument_parser,
    machine,
    percentiles,
    scratch_system,
)
from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import DatabaseUrl


def producer(url: str, seconds: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    engine = create_engine(url, pool_size=1)
    done, errors = 0, Counter[str]()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with Session(engine) as session, session.begin():
                outbox.enqueue(session, "noop", {"n": done})
            done += 1
        except Exception as exc:
            errors[type(exc).__name__] += 1
    engine.dispose()
    out.put((done, dict(errors)))


def worker_errors(log_dir: Path) -> dict[str, Any]:
    """Error-level events from the relay's and consumers' logs, and any mention of a
    deadlock or serialization failure at any level."""
    errors: Counter[str] = Counter()
    conflicts = 0
    for path in log_dir.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            lowered = line.lower()
            if "deadlock" in lowered or "serializ" in lowered:
                conflicts += 1
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("level") in ("error", "critical"):
                errors[event.get("event", "?")] += 1
    return {"error_events": dict(errors), "deadlock_or_serialization_mentions": conflicts}


def measure(db: DatabaseUrl) -> dict[str, Any]:
    with psycopg.connect(db.conninfo) as conn:
        waits = [
            float(r[0])
            for r in conn.execute(
                "SELECT EXTRACT(EPOCH FROM a.started_at - j.created_at) * 1000"
                " FROM jobs j JOIN job_attempts a ON a.job_id = j.job_id AND a.attempt = 1"
            ).fetchall()
        ]
        span = conn.execute(
            "SELECT count(*), EXTRACT(EPOCH FROM max(finished_at) - min(created_at))"
            " FROM jobs WHERE state = 'SUCCEEDED'"
        ).fetchone()
        states = dict(conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())
    completed, seconds = span if span else (0, None)
    return {
        "states": states,
        "drain_jobs_per_s": round(completed / float(seconds)) if seconds else 0,
        "queue_wait": percentiles(waits) if len(waits) > 1 else {},
    }


def run(producers: int, seconds: float, consumers: int, concurrency: int) -> dict[str, Any]:
    log_dir = Path(tempfile.mkdtemp(prefix="load-logs-"))
    with scratch_system(env={"LOG_LEVEL": "INFO"}, logs=log_dir) as system:
        db = system.db
        system.start("relay")
        for _ in range(consumers):
            system.start("consumer", "--app", "bench.apps", "--concurrency", str(concurrency))
        time.sleep(3)
        out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
        procs = [
            multiprocessing.Process(target=producer, args=(db.sqlalchemy, seconds, out))
            for _ in range(producers)
        ]
        started = time.perf_counter()
        for p in procs:
            p.start()
        results = [out.get() for _ in procs]
        for p in procs:
            p.join()
        enqueue_seconds = time.perf_counter() - started
        enqueued = sum(r[0] for r in results)
        producer_errors: Counter[str] = Counter()
        for _, errs in results:
            producer_errors.update(errs)
        deadline = time.monotonic() + 600
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            while time.monotonic() < deadline:
                done = conn.execute(
                    "SELECT count(*) FROM jobs WHERE state = 'SUCCEEDED'"
                ).fetchone()[0]  # type: ignore[index]
                if done >= enqueued:
                    break
                time.sleep(0.2)
        system.stop()
        result = measure(db)
    return {
        "benchmark": "load",
        "producers": producers,
        "consumer_processes": consumers,
        "enqueued": enqueued,
        "enqueue_jobs_per_s": round(enqueued / enqueue_seconds),
        **result,
        "producer_errors": dict(producer_errors),
        **worker_errors(log_dir),
        "logs": str(log_dir),
        "machine": machine(),
    }


def main() -> None:
    parser = argument_parser("bench.load", __doc__)
    parser.add_argument(
        "--producers", type=int, default=4, help="producer processes, one job per transaction"
    )
    parser.add_argument(
        "--seconds", type=float, default=30, help="how long the producers enqueue, in seconds"
    )
    parser.add_argument("--consumers", type=int, default=2, help="consumer processes")
    parser.add_argument(
        "--concurrency", type=int, default=50, help="handlers at once per consumer process"
    )
    args = parser.parse_args()
    print(
        json.dumps(
            run(args.producers, args.seconds, args.consumers, args.concurrency),
            indent=2,
            default=str,
        )
    )


if __name__ == "__main__":
    main()
