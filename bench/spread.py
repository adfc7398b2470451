"""Whether packed wake-ups spread over every consumer: N jobs of S seconds committed
at once, run by K consumer processes of C slots each; the time from the commit until
every job succeeded, against the ideal N*S/(K*C), and how many jobs each consumer ran.

    python -m bench.spread [--jobs 60] [--seconds 0.5] [--consumers 3]
                           [--concurrency 2] [--rounds 3] [--pack 50] [--prefetch 0]

A consumer that keeps a whole message of 30 ids while it runs 2 at a time leaves the
others idle (measured before the fix: 7.9 s against 5.0 s, split 30 / 30 / 0). Prints
one JSON object: per round the elapsed time, its ratio to the ideal and the split,
and the median ratio.
"""

from __future__ import annotations

import statistics
import time

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bench.common import argument_parser, fleet_options, report, wait_all_done
from bench.fleet import fleet
from hybrid_jobs import outbox


def one_round(
    db_conninfo: str, sqlalchemy_url: str, jobs: int, seconds: float
) -> dict[str, object]:
    engine = create_engine(sqlalchemy_url)
    try:
        with Session(engine) as session, session.begin():
            outbox.enqueue_many(
                session, [outbox.NewJob("sleep", {"seconds": seconds}) for _ in range(jobs)]
            )
        committed = time.perf_counter()
    finally:
        engine.dispose()
    with psycopg.connect(db_conninfo, autocommit=True) as conn:
        finished = wait_all_done(conn, interval=0.01)
        split = [
            n
            for (n,) in conn.execute(
                "SELECT count(a.job_id) FROM workers AS w"
                " LEFT JOIN job_attempts AS a ON a.worker = w.worker_id"
                " GROUP BY w.worker_id ORDER BY count(a.job_id) DESC"
            )
        ]
        attempts = conn.execute("SELECT count(*) FROM job_attempts").fetchone()[0]  # type: ignore[index]
        succeeded = conn.execute("SELECT count(*) FROM jobs WHERE state = 'SUCCEEDED'").fetchone()[
            0
        ]  # type: ignore[index]
        conn.execute("DELETE FROM job_attempts")
        conn.execute("DELETE FROM jobs")
    return {
        "elapsed_s": round(finished - committed, 2),
        "split": split,
        "attempts": attempts,
        "succeeded": succeeded,
    }


def main() -> None:
    parser = argument_parser("bench.spread", __doc__)
    parser.add_argument("--jobs", type=int, default=60, help="jobs committed at once")
    parser.add_argument("--seconds", type=float, default=0.5, help="how long each job sleeps")
    fleet_options(parser, consumers=3, concurrency=2)
    parser.add_argument("--rounds", type=int, default=3, help="bursts, one after another")
    parser.add_argument("--pack", type=int, default=50, help="the relay's --pack")
    parser.add_argument(
        "--prefetch", type=int, default=0, help="the consumers' --prefetch (0: their default)"
    )
    args = parser.parse_args()
    ideal = args.jobs * args.seconds / (args.consumers * args.concurrency)
    consumer_args = ["--prefetch", str(args.prefetch)] if args.prefetch else []
    with fleet(
        consumers=args.consumers,
        concurrency=args.concurrency,
        relay_args=["--pack", str(args.pack)],
        consumer_args=consumer_args,
        app="bench.apps",
    ) as f:
        rounds = [
            one_round(f.db.conninfo, f.db.sqlalchemy, args.jobs, args.seconds)
            for _ in range(args.rounds)
        ]
    for r in rounds:
        r["ratio_to_ideal"] = round(float(r["elapsed_s"]) / ideal, 2)  # type: ignore[arg-type]
    report(
        "spread",
        {
            "jobs": args.jobs,
            "job_seconds": args.seconds,
            "consumers": args.consumers,
            "concurrency": args.concurrency,
            "pack": args.pack,
            "prefetch": args.prefetch or "default",
            "ideal_s": round(ideal, 2),
            "rounds": rounds,
            "median_ratio_to_ideal": statistics.median(
                float(r["ratio_to_ideal"])
                for r in rounds  # type: ignore[arg-type]
            ),
        },
    )


if __name__ == "__main__":
    main()
