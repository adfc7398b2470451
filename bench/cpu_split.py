"""Where the CPU goes during a drain, or under a steady load: this project's
processes, PostgreSQL, RabbitMQ.

    python -m bench.cpu_split [--jobs 60000] [--variant plain]   a drain
    python -m bench.cpu_split --rate 200 [--seconds 10]   a steady load

A drain: --jobs no-op jobs are committed at once and drained by one relay and
--consumers consumer processes; --variant gives them a gate, as bench.gates does
(tenants-1000: every claim takes a capped tenant's slot). A steady load (--rate): one no-op job per
transaction, --rate a second for --seconds, committed by this process as a producer
would (outbox.enqueue in a SQLAlchemy session), until all have run. The CPU time
(user + system, from /proc) each side used is reported as a share of the machine's
CPU time, and per job: the relay, the consumers, the producer (this process, a
steady load only), every PostgreSQL process (the server's, not only this
database's backends) and RabbitMQ's beam.smp. Whatever else runs on the machine
counts against PostgreSQL and RabbitMQ, so run it on a quiet machine. Linux only.

Under a steady load the machine's busy share is what the start of a job waits
behind: at 0.8 of every core, a hop's CPU queueing is several times its own cost.

Prints one JSON object.
"""

from __future__ import annotations

import os
import subprocess
import time

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bench import gates
from bench.common import (
    argument_parser,
    committing,
    cpu_seconds,
    fleet_options,
    report,
    wait_all_done,
)
from bench.fleet import Fleet, fleet
from bench.peers.base import paced
from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import DatabaseUrl


def pids_of(program: str) -> list[int]:
    found = subprocess.run(["pgrep", "-x", program], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def snapshot(f: Fleet, relays: int) -> dict[str, float]:
    return {
        "relay": sum(cpu_seconds(p.pid) for p in f.processes[:relays]),
        "consumers": sum(cpu_seconds(p.pid) for p in f.processes[relays:]),
        "postgresql": sum(cpu_seconds(pid) for pid in pids_of("postgres")),
        "rabbitmq": sum(cpu_seconds(pid) for pid in pids_of("beam.smp")),
        "producer": cpu_seconds(os.getpid()),
    }


def commit_at_rate(db: DatabaseUrl, rate: float, seconds: float) -> int:
    """One no-op job per transaction, ``rate`` a second: the jobs committed."""
    engine = create_engine(db.sqlalchemy, pool_size=2)
    try:
        committed = 0
        for _ in paced(rate, seconds):
            with Session(engine) as session, session.begin():
                outbox.enqueue(session, "noop", {})
            committed += 1
        return committed
    finally:
        engine.dispose()


def main() -> None:
    parser = argument_parser("bench.cpu_split", __doc__)
    parser.add_argument("--jobs", type=int, default=60_000, help="jobs drained")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="instead of a drain, commit this many jobs a second, one per transaction",
    )
    parser.add_argument("--seconds", type=float, default=10, help="length of the steady load")
    fleet_options(parser)
    parser.add_argument(
        "--variant",
        choices=gates.VARIANTS,
        default="plain",
        help="a drain's jobs, as bench.gates makes them (a gate's bookkeeping)",
    )
    gates.variant_options(parser)
    args = parser.parse_args()
    if args.rate is not None and args.variant != "plain":
        parser.error("--variant is for a drain: a steady load (--rate) commits plain jobs")

    with fleet(consumers=args.consumers, concurrency=args.concurrency) as f:
        if args.rate is None:
            jobs = gates.VARIANTS[args.variant](args, f.db)
            with committing(f.db) as session:
                outbox.enqueue_many(session, jobs)
        before, started = snapshot(f, 1), time.perf_counter()
        count = args.jobs if args.rate is None else commit_at_rate(f.db, args.rate, args.seconds)
        with psycopg.connect(f.db.conninfo, autocommit=True) as conn:
            finished = wait_all_done(conn)
        after = snapshot(f, 1)
    elapsed = finished - started
    available = elapsed * (os.cpu_count() or 1)
    used = {side: after[side] - before[side] for side in before}
    if args.rate is None:
        del used["producer"]  # the set-up's enqueue, not the drain
    shape = (
        {"jobs": count, "variant": args.variant, "drain_jobs_per_s": round(count / elapsed)}
        if args.rate is None
        else {"jobs": count, "rate_per_s": args.rate}
    )
    report(
        "cpu_split",
        shape
        | {
            "cpu_share_of_machine": {s: round(u / available, 3) for s, u in used.items()},
            "cpu_ms_per_job": {s: round(1000 * u / count, 4) for s, u in used.items()},
            "machine_busy": round(sum(used.values()) / available, 3),
        },
    )


if __name__ == "__main__":
    main()
