"""A healthy queue's latency alone, and beside a queue that RabbitMQ refuses.

    python -m bench.refused_queue [--rate 50] [--seconds 20] [--refused-rate 50]

One relay and one consumer process (`consumer --app bench.refused_queue`, which
serves both queues), in one run:

1. alone: jobs on queue "healthy", committed one per transaction at --rate per
   second for --seconds;
2. beside a refused queue: a RabbitMQ policy on queue "refused" only (its pattern is
   that queue's full name: max-length 0, overflow reject-publish, so RabbitMQ nacks
   every publish to it), and producers writing to it at --refused-rate per second
   while the healthy queue gets the same load as in phase 1;
3. the policy is lifted: how long until every refused job has run, and how many
   were lost (none should be).

For the healthy queue in phases 1 and 2: commit to claim (the claim's database
time, jobs.started_at) and commit to the handler's first line, p50/p95/p99. Prints
one JSON object.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import argument_parser, pace_options, percentiles, report, scratch_system
from bench.marks import ENV, Marks, process_marks
from hybrid_jobs import consumers

HEALTHY, REFUSED = "healthy", "refused"
POLICY = {"max-length": 0, "overflow": "reject-publish"}


@consumers.handler("rq_healthy", queue=HEALTHY)
async def rq_healthy(job: consumers.Job) -> None:
    """Notes when it started."""
    process_marks().started(job.id)


@consumers.handler("rq_refused", queue=REFUSED)
async def rq_refused(job: consumers.Job) -> None:
    return None


def _produce(db: Any, plan: list[tuple[float, str, str]]) -> dict[str, float]:
    """Commit one job per entry (seconds from now, job type, queue), one transaction
    each; the wall-clock time each healthy job's commit returned, by job id."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from hybrid_jobs import outbox

    engine = create_engine(db.sqlalchemy, pool_size=2)
    committed: dict[str, float] = {}
    began = time.perf_counter()
    try:
        for at, job_type, queue in plan:
            delay = began + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            with Session(engine) as session, session.begin():
                job_id = outbox.enqueue(session, job_type, {}, queue=queue)
            if queue == HEALTHY:
                committed[str(job_id)] = time.time()
    finally:
        engine.dispose()
    return committed


def _plan(rate: float, seconds: float, job_type: str, queue: str) -> list[tuple[float, str, str]]:
    return [(i / rate, job_type, queue) for i in range(int(rate * seconds))]


def _latencies(
    conn: Any, committed: dict[str, float], starts: dict[str, float]
) -> dict[str, dict[str, float]]:
    claimed = {
        str(job_id): at.timestamp()
        for job_id, at in conn.execute(
            "SELECT job_id, started_at FROM jobs WHERE job_id = ANY(%s::uuid[])",
            [list(committed)],
        ).fetchall()
    }
    to_claim = [(claimed[j] - t) * 1000 for j, t in committed.items() if j in claimed]
    to_start = [(starts[j] - t) * 1000 for j, t in committed.items() if j in starts]
    return {"commit_to_claim": percentiles(to_claim), "commit_to_start": percentiles(to_start)}


def _policy(action: str, name: str, pattern: str = "") -> None:
    args = ["rabbitmqctl", "-q"]
    if action == "set":
        args += ["set_policy", "--apply-to", "queues", "--priority", "100"]
        args += [name, pattern, json.dumps(POLICY)]
    else:
        args += ["clear_policy", name]
    subprocess.run(args, check=True, capture_output=True)


def _count(db: Any, queue: str) -> int:
    import psycopg

    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM jobs WHERE queue = %s AND state = 'SUCCEEDED'", [queue]
        ).fetchone()
    return int(row[0]) if row else 0


def _wait_succeeded(db: Any, queue: str, want: int, timeout: float) -> float:
    """Seconds until ``want`` jobs of the queue have succeeded."""
    began = time.monotonic()
    while _count(db, queue) < want:
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"{queue}: fewer than {want} jobs succeeded after {timeout:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - began


def run(args: Any, db: Any, topology: Any, logs: Path) -> dict[str, Any]:
    import psycopg

    warm = _plan(10, 1, "rq_healthy", HEALTHY) + _plan(10, 1, "rq_refused", REFUSED)
    _produce(db, sorted(warm))  # connected and consuming: not measured
    _wait_succeeded(db, HEALTHY, 10, 60)
    _wait_succeeded(db, REFUSED, 10, 60)

    alone = _produce(db, _plan(args.rate, args.seconds, "rq_healthy", HEALTHY))
    policy = f"bench-{topology.prefix}-{REFUSED}"
    _policy("set", policy, "^" + re.escape(topology.queue_name(REFUSED)) + "$")
    try:
        plan = _plan(args.rate, args.seconds, "rq_healthy", HEALTHY)
        plan += _plan(args.refused_rate, args.seconds, "rq_refused", REFUSED)
        beside = _produce(db, sorted(plan))
        _wait_succeeded(db, HEALTHY, 10 + len(alone) + len(beside), 120)
        ran_while_refused = _count(db, REFUSED) - 10
    finally:
        _policy("clear", policy)
    refused = int(args.refused_rate * args.seconds)
    drained = _wait_succeeded(db, REFUSED, 10 + refused, args.drain_timeout)
    starts = Marks(logs).starts()
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        return {
            "healthy_alone": _latencies(conn, alone, starts),
            "healthy_beside_refused": _latencies(conn, beside, starts),
            "refused": {
                "enqueued": refused,
                "ran_while_refused": ran_while_refused,
                "seconds_to_run_all_after_lift": round(drained, 2),
                "lost": 10 + refused - _count(db, REFUSED),
            },
        }


def main() -> None:
    parser = argument_parser("bench.refused_queue", __doc__)
    pace_options(parser, rate=50, seconds=20, what="each phase")
    parser.add_argument(
        "--refused-rate", type=float, default=50, help="jobs per second for the refused queue"
    )
    parser.add_argument(
        "--drain-timeout", type=float, default=300, help="seconds to wait for the refused jobs"
    )
    args = parser.parse_args()

    logs = Path(tempfile.mkdtemp(prefix="bench-refused-"))
    with scratch_system(
        "bench_refused", [HEALTHY, REFUSED], env={ENV: str(logs)}, logs=logs
    ) as system:
        system.start("relay")
        system.start("consumer", "--app", "bench.refused_queue")
        figures = run(args, system.db, system.topology, logs)
    relay_log = (logs / "p0.log").read_text(errors="replace")
    alone = figures["healthy_alone"]["commit_to_claim"]["p99_ms"]
    beside = figures["healthy_beside_refused"]["commit_to_claim"]["p99_ms"]
    result = {
        "rate_per_s": args.rate,
        "refused_rate_per_s": args.refused_rate,
        "seconds_per_phase": args.seconds,
        **figures,
        "p99_beside_over_alone": round(beside / alone, 2) if alone else None,
        "relay_log": {
            event: relay_log.count(f'"{event}"')
            for event in ("relay.drain_failed", "relay.queue_publish_failing")
        },
    }
    report("refused_queue", result)


if __name__ == "__main__":
    main()
