"""Does NOTIFY at commit cost producers? Four producer processes enqueue one job per
transaction as fast as they can for a while, with one relay and two consumers
draining, two ways:

- notify: the outbox trigger NOTIFYs the relay at commit (the default); PostgreSQL
  serialises committing transactions that NOTIFY, database-wide;
- poll: the trigger disabled, the relay polling every --poll-interval instead.

Reports, for each: enqueues per second (all producers), and queue wait (claim minus
enqueue, from the database's own clock) p50/p99. Each way in a fresh database.

Prints one JSON object.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import psycopg

from bench.common import argument_parser, percentiles, report, wait_all_done
from bench.fleet import fleet
from bench.load import producer


def run(way: str, producers: int, seconds: float, poll_interval: float) -> dict[str, Any]:
    relay_args = ["--poll-interval", str(poll_interval)] if way == "poll" else []
    with fleet(consumers=2, relay_args=relay_args) as f:
        if way == "poll":
            with psycopg.connect(f.db.conninfo, autocommit=True) as conn:
                conn.execute("ALTER TABLE outbox DISABLE TRIGGER outbox_notify")
        out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
        procs = [
            multiprocessing.Process(target=producer, args=(f.db.sqlalchemy, seconds, out))
            for _ in range(producers)
        ]
        for p in procs:
            p.start()
        results = [out.get() for _ in procs]
        for p in procs:
            p.join()
        enqueued = sum(done for done, _ in results)
        with psycopg.connect(f.db.conninfo, autocommit=True) as conn:
            wait_all_done(conn)
            waits = [
                float(r[0])
                for r in conn.execute(
                    "SELECT EXTRACT(EPOCH FROM started_at - created_at) * 1000 FROM jobs"
                ).fetchall()
            ]
        return {
            "way": way,
            "enqueues_per_s": round(enqueued / seconds),
            "queue_wait": percentiles(waits),
            "producer_errors": {k: v for _, e in results for k, v in e.items()},
        }


def main() -> None:
    parser = argument_parser("bench.notify", __doc__)
    parser.add_argument("--producers", type=int, default=4, help="producer processes")
    parser.add_argument("--seconds", type=float, default=15, help="how long they enqueue")
    parser.add_argument(
        "--poll-interval", type=float, default=0.02, help="the relay's poll without NOTIFY"
    )
    args = parser.parse_args()
    runs = [run(w, args.producers, args.seconds, args.poll_interval) for w in ("notify", "poll")]
    report("notify", {"runs": runs})


if __name__ == "__main__":
    main()
