"""Consumer benchmark: drain throughput, commit-to-start latency, and a plain SKIP
LOCKED loop as the baseline, in one run against one database.

    python -m bench.drain [--jobs 20000] [--consumers 2] [--concurrency 50]
                          [--rate 200] [--seconds 10] [--no-baseline]
                          [--pack 50] [--prefetch 0] [--analyze]
                          [--autovacuum server|on|off]

1. drain: N no-op jobs committed at once with enqueue_many, one relay and K
   `consumer` processes; jobs/s from the commit until the last is SUCCEEDED
   (with --analyze, the tables analyzed right after that commit, as autovacuum
   would after an insert this large: a production table's plans);
2. latency: one job per transaction at a fixed rate; from each commit to its
   handler's first line, p50/p95/p99;
3. baseline: N jobs drained by K processes each running the unbatched loop a plain
   job table would (claim one with FOR UPDATE SKIP LOCKED, commit; complete it,
   commit), on a plain table in the same database (`bench.peers.skiplocked`, b=1).

Prints one JSON object; `bench.compare` reads its `drain_jobs_per_s` and
`commit_to_handler_start`.
"""

from __future__ import annotations

import signal
import tempfile
import time
from pathlib import Path
from types import FrameType

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bench.common import (
    argument_parser,
    autovacuum_option,
    autovacuum_set,
    pace_options,
    report,
    scratch_system,
    wait_all_done,
)
from bench.marks import ENV, Marks
from bench.peers import skiplocked
from bench.peers.base import latency_figures, paced
from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import DatabaseUrl

# Autovacuum's vacuums and analyzes of the project's tables so far.
AUTOVACUUM_RUNS = """
SELECT COALESCE(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_user_tables
"""


def count(db: DatabaseUrl, sql: str) -> int:
    with psycopg.connect(db.conninfo) as conn:
        return int(conn.execute(sql).fetchone()[0])  # type: ignore[index]


def wait_succeeded(db: DatabaseUrl, job_type: str, n: int, timeout: float = 600) -> float:
    """Wait until nothing is left to run, then check that it all succeeded: the
    moment (perf_counter) the last job finished, as the poll saw it."""
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        finished = wait_all_done(conn, timeout, interval=0.01)
        succeeded = conn.execute(
            "SELECT count(*) FROM jobs WHERE job_type = %s AND state = 'SUCCEEDED'", [job_type]
        ).fetchone()[0]  # type: ignore[index]
    if succeeded < n:
        raise RuntimeError(f"{job_type}: {succeeded} of {n} jobs succeeded")
    return finished


def drain(db: DatabaseUrl, n: int, *, analyze: bool = False) -> float:
    engine = create_engine(db.sqlalchemy)
    with Session(engine) as session, session.begin():
        outbox.enqueue_many(session, [outbox.NewJob("noop", {"i": i}) for i in range(n)])
    committed = time.perf_counter()
    engine.dispose()
    if analyze:
        # as autovacuum would after an insert this large: the plans made from then
        # on know the backlog
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            conn.execute("ANALYZE jobs")
            conn.execute("ANALYZE outbox")
    return n / (wait_succeeded(db, "noop", n) - committed)


def latency(db: DatabaseUrl, rate: float, seconds: float, marks: Marks) -> dict[str, float]:
    engine = create_engine(db.sqlalchemy, pool_size=2)
    committed: dict[str, float] = {}
    for _ in paced(rate, seconds):
        with Session(engine) as session, session.begin():
            new_id = outbox.enqueue(session, "latency", {})
        committed[str(new_id)] = time.time()
    engine.dispose()
    wait_succeeded(db, "latency", len(committed))
    return latency_figures(committed, marks.starts(), rate)


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


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
    pace_options(parser, seconds=10, what="the latency run")
    parser.add_argument(
        "--no-baseline", dest="baseline", action="store_false", help="skip the SKIP LOCKED loop"
    )
    parser.add_argument(
        "--pack", type=int, default=50, help="the relay's --pack: job ids per message"
    )
    parser.add_argument(
        "--prefetch", type=int, default=0, help="the consumers' --prefetch (0: their default)"
    )
    parser.add_argument(
        "--analyze",
        action="store_true",
        help="ANALYZE jobs and outbox right after the backlog's commit, as autovacuum would",
    )
    autovacuum_option(parser)
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C: daemons stopped, database and broker namespace dropped.
    signal.signal(signal.SIGTERM, _terminated)

    # The report too: it says the autovacuum setting the run had.
    with autovacuum_set(args.autovacuum):
        marks = Marks(Path(tempfile.mkdtemp(prefix="bench-starts-")))
        with scratch_system(env={ENV: str(marks.path)}) as system:
            db = system.db
            system.start("relay", "--pack", str(args.pack))
            for _ in range(args.consumers):
                system.start(
                    "consumer",
                    *("--app", "bench.apps", "--concurrency", str(args.concurrency)),
                    *("--prefetch", str(args.prefetch)),
                )
            time.sleep(3)  # connected, consuming
            drain_rate = drain(db, args.jobs, analyze=args.analyze)
            lat = latency(db, args.rate, args.seconds, marks)
            system.stop()
            attempts = count(db, "SELECT count(*) FROM job_attempts")
            vacuums = count(db, AUTOVACUUM_RUNS)
            base_rate = skiplocked.drain(db, args.jobs, args.consumers) if args.baseline else None

        figures: dict[str, object] = {
            "jobs": args.jobs,
            "consumer_processes": args.consumers,
            "concurrency_per_process": args.concurrency,
            "pack": args.pack,
            "prefetch": args.prefetch or "default",
            "analyzed": args.analyze,
            "drain_jobs_per_s": round(drain_rate),
            "commit_to_handler_start": lat,
        }
        if base_rate is not None:
            figures["baseline_skip_locked_jobs_per_s"] = round(base_rate)
            figures["drain_to_baseline_ratio"] = round(drain_rate / base_rate, 2)
        figures["attempt_rows"] = attempts
        # Whether autovacuum (or its analyze) ran on the project's tables during the run.
        figures["autovacuum_runs"] = vacuums
        report("drain", figures)


if __name__ == "__main__":
    main()
