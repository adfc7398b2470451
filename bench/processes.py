"""What `consumer --processes N` buys a CPU-bound plain-function handler.

    python -m bench.processes [--jobs 2000] [--work 100000] [--processes 1 2]
                              [--concurrency 4]

For each N in --processes: a fresh database, one relay and one `consumer
--processes N --concurrency C`; --jobs jobs of the `cpu` handler (bench.apps: a
plain `def` that spends --work rounds of Python arithmetic holding the GIL, about
50 ms at 100,000 on this machine) committed at once, and drained. Reports jobs/s
from the commit until the last SUCCEEDED, the handlers' run time per job
(p50/p95/p99, from the attempt rows), and the ratio of each N's jobs/s to the first
N's. Within one process the threads take turns on one core; each process adds a
core, so on a 2-core machine (which also runs PostgreSQL, RabbitMQ and the relay)
two processes can at best double the rate.

Prints one JSON object.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bench.common import argument_parser, percentiles, report, wait_all_done
from bench.fleet import fleet, wait_for_workers
from hybrid_jobs import outbox


@dataclass(frozen=True)
class Run:
    jobs_per_s: float
    handler_run_ms: dict[str, float]
    workers_that_ran_jobs: int


def drain(processes: int, jobs: int, work: int, concurrency: int) -> Run:
    args = ["--processes", str(processes)]
    with fleet(consumers=1, concurrency=concurrency, consumer_args=args) as f:
        wait_for_workers(f.db, processes)
        engine = create_engine(f.db.sqlalchemy)
        with Session(engine) as session, session.begin():
            outbox.enqueue_many(
                session, [outbox.NewJob("cpu", {"work": work}) for _ in range(jobs)]
            )
        committed = time.perf_counter()
        engine.dispose()
        with psycopg.connect(f.db.conninfo, autocommit=True) as conn:
            finished = wait_all_done(conn)
            succeeded = conn.execute("SELECT count(*) FROM jobs WHERE state = 'SUCCEEDED'")
            if succeeded.fetchone() != (jobs,):
                raise RuntimeError("not every job succeeded")
            run_ms = [
                float(ms)
                for (ms,) in conn.execute(
                    "SELECT extract(epoch FROM finished_at - started_at) * 1000 FROM job_attempts"
                )
            ]
            workers = conn.execute("SELECT count(DISTINCT worker) FROM job_attempts").fetchone()
    return Run(
        round(jobs / (finished - committed), 1), percentiles(run_ms), workers[0] if workers else 0
    )


def main() -> None:
    parser = argument_parser("bench.processes", __doc__)
    parser.add_argument("--jobs", type=int, default=2000, help="jobs drained per run")
    parser.add_argument(
        "--work", type=int, default=100_000, help="rounds of arithmetic per job (CPU time)"
    )
    parser.add_argument(
        "--processes", type=int, nargs="+", default=[1, 2], help="worker process counts to run"
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, help="slots (threads) per worker process"
    )
    args = parser.parse_args()
    runs = {n: drain(n, args.jobs, args.work, args.concurrency) for n in args.processes}
    first = runs[args.processes[0]].jobs_per_s
    report(
        "processes",
        {
            "jobs": args.jobs,
            "work": args.work,
            "concurrency_per_process": args.concurrency,
            "runs": {str(n): asdict(run) for n, run in runs.items()},
            "ratio_to_first": {str(n): round(r.jobs_per_s / first, 2) for n, r in runs.items()},
        },
    )


if __name__ == "__main__":
    main()
