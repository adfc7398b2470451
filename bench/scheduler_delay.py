"""The scheduler's delay: how late recurring schedules fire, with two relays.

--schedules schedules of `every=1s` (a no-op job each) run for --seconds under
--relays relays (every relay fires due occurrences; the schedule_fires primary key
arbitrates) and one consumer. Then, from the ledger: occurrences fired per
schedule against the seconds that passed, the delay (fired_at minus the nominal
instant, the database clock's) percentiles, and whether every enqueued job ran
once. The delay is bounded by the relay's --schedule-interval (1 s by default):
a relay looks for due occurrences that often.

Prints one JSON object.
"""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg

from bench.common import argument_parser, committing, percentiles, report
from bench.fleet import fleet
from hybrid_jobs import outbox


def main() -> None:
    parser = argument_parser("bench.scheduler_delay", __doc__)
    parser.add_argument("--schedules", type=int, default=20, help="schedules, every=1s each")
    parser.add_argument("--seconds", type=float, default=30, help="how long they run")
    parser.add_argument("--relays", type=int, default=2, help="relay processes")
    parser.add_argument(
        "--schedule-interval", type=float, default=1.0, help="the relays' --schedule-interval"
    )
    args = parser.parse_args()

    relay_args = ["--schedule-interval", str(args.schedule_interval)]
    with fleet(consumers=1, relays=args.relays, relay_args=relay_args) as f:
        with committing(f.db) as session:
            for i in range(args.schedules):
                outbox.schedule(session, f"tick-{i}", "noop", every=timedelta(seconds=1))
        time.sleep(args.seconds)
        with committing(f.db) as session:
            for i in range(args.schedules):
                outbox.pause_schedule(session, f"tick-{i}")
        time.sleep(2)  # the last fires' jobs run
        with psycopg.connect(f.db.conninfo, autocommit=True) as conn:
            delays = [
                row[0] * 1000
                for row in conn.execute(
                    "SELECT delay_seconds FROM schedule_fires WHERE outcome = 'enqueued'"
                ).fetchall()
            ]
            per_schedule = [
                row[0]
                for row in conn.execute(
                    "SELECT count(*) FROM schedule_fires GROUP BY schedule_name"
                ).fetchall()
            ]
            skipped = conn.execute(
                "SELECT count(*) FROM schedule_fires WHERE outcome = 'skipped'"
            ).fetchone()[0]  # type: ignore[index]
            jobs = dict(conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())
            attempts = conn.execute(
                "SELECT count(*), count(DISTINCT job_id) FROM job_attempts"
            ).fetchone()
    report(
        "scheduler_delay",
        {
            "schedules": args.schedules,
            "seconds": args.seconds,
            "relays": args.relays,
            "schedule_interval_s": args.schedule_interval,
            "fires_enqueued": len(delays),
            "fires_skipped": skipped,
            "fires_per_schedule": {"min": min(per_schedule), "max": max(per_schedule)},
            "delay": percentiles(delays),
            "jobs_by_state": jobs,
            "attempts": {"rows": attempts[0], "jobs": attempts[1]} if attempts else None,
        },
    )


if __name__ == "__main__":
    main()
