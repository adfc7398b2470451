"""Where the CPU goes during a drain: this project's processes, PostgreSQL, RabbitMQ.

--jobs no-op jobs are committed at once and drained by one relay and --consumers
consumer processes. The CPU time (user + system, from /proc) each side used during
the drain is reported as a share of the machine's CPU time, and per job: the relay,
the consumers, every PostgreSQL process (the server's, not only this database's
backends) and RabbitMQ's beam.smp. Whatever else runs on the machine counts against
PostgreSQL and RabbitMQ, so run it on a quiet machine. Linux only.

Prints one JSON object.
"""

from __future__ import annotations

import os
import subprocess
import time

import psycopg

import outbox
from bench.common import (
    argument_parser,
    committing,
    cpu_seconds,
    fleet_options,
    report,
    wait_all_done,
)
from bench.fleet import Fleet, fleet


def pids_of(program: str) -> list[int]:
    found = subprocess.run(["pgrep", "-x", program], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def snapshot(f: Fleet, relays: int) -> dict[str, float]:
    return {
        "relay": sum(cpu_seconds(p.pid) for p in f.processes[:relays]),
        "consumers": sum(cpu_seconds(p.pid) for p in f.processes[relays:]),
        "postgresql": sum(cpu_seconds(pid) for pid in pids_of("postgres")),
        "rabbitmq": sum(cpu_seconds(pid) for pid in pids_of("beam.smp")),
    }


def main() -> None:
    parser = argument_parser("bench.cpu_split", __doc__)
    parser.add_argument("--jobs", type=int, default=60_000, help="jobs drained")
    fleet_options(parser)
    args = parser.parse_args()

    with fleet(consumers=args.consumers, concurrency=args.concurrency) as f:
        with committing(f.db) as session:
            outbox.enqueue_many(session, [outbox.NewJob("noop", {}) for _ in range(args.jobs)])
        before, started = snapshot(f, 1), time.perf_counter()
        with psycopg.connect(f.db.conninfo, autocommit=True) as conn:
            finished = wait_all_done(conn)
        after = snapshot(f, 1)
    elapsed = finished - started
    available = elapsed * (os.cpu_count() or 1)
    used = {side: after[side] - before[side] for side in before}
    report(
        "cpu_split",
        {
            "jobs": args.jobs,
            "drain_jobs_per_s": round(args.jobs / elapsed),
            "cpu_share_of_machine": {s: round(u / available, 3) for s, u in used.items()},
            "cpu_ms_per_job": {s: round(1000 * u / args.jobs, 4) for s, u in used.items()},
            "machine_busy": round(sum(used.values()) / available, 3),
        },
    )


if __name__ == "__main__":
    main()
