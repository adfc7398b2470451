"""Batch handler benchmark: the same backlog drained by a handler of one job (one
call a job) and by a batch handler (one call for up to --batch jobs), on the same
relay and consumers, in alternating rounds. Each call holds its process's one
connection to a downstream service for --call-ms (a bulk insert or a bulk API call,
say): what batching is for. With 0, the default, there is no call: what is left is
the cost of the claims and outcomes, which are per job either way.

    python -m bench.batch_drain [--jobs 20000] [--rounds 3] [--consumers 2]
                                [--concurrency 100] [--batch 100] [--batch-wait 0.05]
                                [--call-ms 0]

Each round commits --jobs jobs at once (enqueue_many) and times from that commit
until the last is SUCCEEDED; jobs/s is the median over the rounds. Each job's time
from its enqueue to its recorded outcome (the database's clock: created_at to the
attempt's finished_at) gives p50/p95/p99 of the last round: with everything
committed at once, that is how far into the drain a job finished. The batch handler
runs in the same consumers with the same --concurrency, so a batch holds at most
that many jobs.

Prints one JSON object.
"""

from __future__ import annotations

import json
import signal
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import FrameType

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bench.common import argument_parser, fleet_options, report, scratch_system
from bench.drain import wait_succeeded
from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import DatabaseUrl

# per-job time from enqueue to recorded outcome, of one job type's last round
_FINISHED = """
SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
    ORDER BY extract(epoch FROM a.finished_at - j.created_at) * 1000)
FROM jobs j JOIN job_attempts a USING (job_id)
WHERE j.job_type = %s AND a.outcome = 'SUCCEEDED'
"""


def drain(db: DatabaseUrl, job_type: str, n: int) -> tuple[float, dict[str, float]]:
    """Drain ``n`` jobs of ``job_type`` committed at once: jobs/s, and enqueue to
    outcome percentiles (ms); the jobs are deleted afterwards, for the next round."""
    engine = create_engine(db.sqlalchemy)
    with Session(engine) as session, session.begin():
        outbox.enqueue_many(session, [outbox.NewJob(job_type, {"i": i}) for i in range(n)])
    committed = time.perf_counter()
    engine.dispose()
    rate = n / (wait_succeeded(db, job_type, n) - committed)
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        row = conn.execute(_FINISHED, [job_type]).fetchone()
        assert row is not None
        p50, p95, p99 = row[0]
        conn.execute("DELETE FROM job_attempts WHERE job_id IN (SELECT job_id FROM jobs)")
        conn.execute("DELETE FROM outbox")
        conn.execute("DELETE FROM jobs")
    return rate, {"p50_ms": round(p50, 1), "p95_ms": round(p95, 1), "p99_ms": round(p99, 1)}


def batch_sizes(folder: Path) -> dict[str, float]:
    """The batch handler's calls in all rounds and their mean size, from what each
    consumer wrote as it exited (bench.batch_apps)."""
    sizes: Counter[int] = Counter()
    for written in folder.glob("*.json"):
        sizes.update({int(k): v for k, v in json.loads(written.read_text()).items()})
    calls = sum(sizes.values())
    jobs = sum(size * n for size, n in sizes.items())
    return {
        "batch_calls": calls,
        "mean_batch_size": round(jobs / calls, 1) if calls else 0.0,
        "largest": max(sizes, default=0),
    }


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    parser = argument_parser("bench.batch_drain", __doc__)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs drained per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each, alternated")
    fleet_options(parser, concurrency=100)
    parser.add_argument("--batch", type=int, default=100, help="the batch handler's batch=")
    parser.add_argument(
        "--batch-wait", type=float, default=0.05, help="the batch handler's batch_wait="
    )
    parser.add_argument(
        "--call-ms",
        type=float,
        default=0.0,
        help="milliseconds each call holds its process's one downstream connection (0: none)",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _terminated)

    env = {
        "BENCH_BATCH": str(args.batch),
        "BENCH_BATCH_WAIT": str(args.batch_wait),
        "BENCH_CALL_MS": str(args.call_ms),
    }
    rates: dict[str, list[float]] = {"plain": [], "batch": []}
    latency: dict[str, dict[str, float]] = {}
    sizes = Path(tempfile.mkdtemp(prefix="bench-batch-sizes-"))
    env["BENCH_BATCH_SIZES"] = str(sizes)
    with scratch_system(env=env) as system:
        system.start("relay", "--pack", "50")
        for _ in range(args.consumers):
            system.start(
                "consumer",
                *("--app", "bench.batch_apps", "--concurrency", str(args.concurrency)),
            )
        time.sleep(3)  # connected, consuming
        for _ in range(args.rounds):
            for name, job_type in (("plain", "call_one"), ("batch", "call_batch")):
                rate, latency[name] = drain(system.db, job_type, args.jobs)
                rates[name].append(rate)
        system.stop()

    plain, batch = (statistics.median(rates[k]) for k in ("plain", "batch"))
    report(
        "batch_drain",
        {
            "jobs": args.jobs,
            "rounds": args.rounds,
            "consumer_processes": args.consumers,
            "concurrency_per_process": args.concurrency,
            "batch": args.batch,
            "batch_wait_s": args.batch_wait,
            "call_ms": args.call_ms,
            "drain_jobs_per_s": {"plain": round(plain), "batch": round(batch)},
            "batch_to_plain_ratio": round(batch / plain, 2),
            "batches": batch_sizes(sizes),
            "each_round_jobs_per_s": {k: [round(r) for r in v] for k, v in rates.items()},
            "enqueue_to_outcome_last_round": latency,
        },
    )


if __name__ == "__main__":
    main()
