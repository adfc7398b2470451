"""Refused wake-ups: a job type that only a busy consumer knows.

    python -m bench.refusals [--jobs 20] [--busy 10] [--job-seconds 0.2]

One relay and two consumer processes on one queue (`consumer --app
bench.refusals`): one has the handler of job type "rare" and one slot
(--concurrency 1), the other knows only another job type. A "rare" job that takes
--busy seconds occupies the one slot; meanwhile --jobs more "rare" jobs are
committed, one per transaction. Every wake-up the second consumer is given for
them it must turn down (NO_HANDLER).

Prints, for the busy stretch, the wake-ups written (outbox rows, each job's first
one included) per waiting job per 10 s (the target is at most 2), and once the slot
frees, the delay from "handler free" (the previous job's handler returned) to the
next job's start, p50/p95/max, and how long the waiting jobs took to run. Prints one
JSON object.

    python -m bench.refusals --killed [--jobs 20] [--busy 10] [--lease-seconds 60]

The other shape: the one consumer with the handler is killed (SIGKILL) while its
job runs and the others wait, so the fleet has no handler for them at all; its row
in ``workers`` still looks live until its heartbeat lapses. The wake-ups are
counted the same way over --busy seconds from the kill; then a consumer with the
handler starts again and every job, the killed one's after its lease lapses, must
run. With a lease shorter than the worker TTL (60 s), the killed consumer's lease
lapses while its row is still fresh.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import argument_parser, report, scratch_system
from bench.marks import ENV, Marks, process_marks
from hybrid_jobs import consumers

ROLE = "BENCH_REFUSALS_ROLE"


if os.environ.get(ROLE) == "capable":

    @consumers.handler("rare")
    async def rare(job: consumers.Job) -> None:
        """Notes when it started and when it returned; ``then``, how long it takes
        from its second attempt on (the killed shape's first job)."""
        process_marks().started(job.id)
        seconds = job.payload.get("then") if job.attempt > 1 else None
        await asyncio.sleep(float(seconds or job.payload.get("seconds", 0)))
        process_marks().ended(job.id)

else:

    @consumers.handler("common")
    async def common(job: consumers.Job) -> None:
        return None


def _outbox_written(conn: Any) -> int:
    """Outbox rows ever written: the identity only grows."""
    row = conn.execute(
        "SELECT last_value FROM pg_sequences WHERE sequencename LIKE 'outbox_id%'"
    ).fetchone()
    return int(row[0] or 0) if row else 0


def _enqueue(engine: Any, seconds: float, then: float | None = None) -> str:
    from sqlalchemy.orm import Session

    from hybrid_jobs import outbox

    with Session(engine) as session, session.begin():
        return str(outbox.enqueue(session, "rare", {"seconds": seconds, "then": then}))


def _state(conn: Any, job_id: str) -> str:
    return str(conn.execute("SELECT state FROM jobs WHERE job_id = %s", [job_id]).fetchone()[0])


def run(args: Any, db: Any, logs: Path, capable: Any = None, restart: Any = None) -> dict[str, Any]:
    """With ``capable`` (the consumer with the handler) and ``restart`` (starts a
    new one), the killed shape."""
    import psycopg
    from sqlalchemy import create_engine

    engine = create_engine(db.sqlalchemy, pool_size=2)
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        # Killed, its consumer is gone before it could end; run again, it is short.
        if capable:
            blocker = _enqueue(engine, 3600, then=args.job_seconds)
        else:
            blocker = _enqueue(engine, args.busy)
        deadline = time.monotonic() + 60
        while _state(conn, blocker) != "RUNNING":
            if time.monotonic() > deadline:
                raise TimeoutError("the blocking job never started")
            time.sleep(0.02)
        # Counted from before the waiting jobs' own wake-ups, as the issue counted.
        before, began = _outbox_written(conn), time.monotonic()
        if capable:
            capable.kill()
            capable.wait()
        waiting = [_enqueue(engine, args.job_seconds) for _ in range(args.jobs)]
        if capable:
            time.sleep(max(0.0, args.busy - (time.monotonic() - began)))
        else:
            while _state(conn, blocker) == "RUNNING":
                time.sleep(0.02)
        window = time.monotonic() - began
        written = _outbox_written(conn) - before
        drained_from = time.monotonic()
        if restart:
            restart()
        ids = [blocker, *waiting]
        while conn.execute(
            "SELECT count(*) FROM jobs WHERE job_id = ANY(%s::uuid[]) AND state <> 'SUCCEEDED'",
            [ids],
        ).fetchone()[0]:  # type: ignore[index]
            if time.monotonic() - drained_from > args.drain_timeout:
                raise TimeoutError("the waiting jobs did not all run")
            time.sleep(0.02)
        drained = time.monotonic() - drained_from
    engine.dispose()
    marks = Marks(logs)
    starts, ends = marks.starts(), marks.ends()
    # One slot: each job starts after the one before it returned. Killed, the
    # blocker's first run never returned: its second one counts.
    order = sorted(ids, key=lambda j: starts[j])
    if capable:
        order = [j for j in order if j in ends]
    delays = [(starts[b] - ends[a]) * 1000 for a, b in itertools.pairwise(order)]
    return {
        "shape": "killed" if capable else "busy",
        "waiting_jobs": args.jobs,
        "busy_seconds_measured": round(window, 2),
        "wakeups_written_while_busy": written,
        "of_which_sent_again": written - args.jobs,
        "wakeups_per_waiting_job_per_10s": round(written / args.jobs * 10 / window, 2),
        "handler_free_to_start_ms": {
            "first": round(delays[0], 1),
            "p50": round(statistics.median(delays), 1),
            "p95": round(sorted(delays)[int(0.95 * (len(delays) - 1))], 1),
            "max": round(max(delays), 1),
        },
        "seconds_to_run_the_waiting_jobs": round(drained, 2),
    }


def main() -> None:
    parser = argument_parser("bench.refusals", __doc__)
    parser.add_argument("--jobs", type=int, default=20, help="jobs waiting for the busy handler")
    parser.add_argument(
        "--busy", type=float, default=10, help="seconds the one slot with the handler is busy"
    )
    parser.add_argument(
        "--job-seconds", type=float, default=0.2, help="how long each waiting job runs"
    )
    parser.add_argument(
        "--drain-timeout", type=float, default=300, help="seconds to wait for them to run"
    )
    parser.add_argument(
        "--lease-seconds",
        type=float,
        default=60,
        help="the lease of the consumers with the handler (the consumer's default: 60)",
    )
    parser.add_argument(
        "--killed",
        action="store_true",
        help="kill the one consumer with the handler instead of keeping it busy",
    )
    args = parser.parse_args()

    logs = Path(tempfile.mkdtemp(prefix="bench-refusals-"))
    with scratch_system("bench_refusals", env={ENV: str(logs)}, logs=logs) as system:
        app = ["--app", "bench.refusals"]
        system.start("relay")
        capable = [
            *("consumer", *app, "--concurrency", "1"),
            *("--lease-seconds", str(args.lease_seconds)),
        ]
        first = system.start(*capable, env={ROLE: "capable"})
        system.start("consumer", *app, env={ROLE: "other"})
        time.sleep(3)  # connected, consuming, announced
        if args.killed:
            figures = run(
                args,
                system.db,
                logs,
                capable=first,
                restart=lambda: system.start(*capable, env={ROLE: "capable"}),
            )
        else:
            figures = run(args, system.db, logs)
    report("refusals", figures)


if __name__ == "__main__":
    main()
