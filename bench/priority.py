"""Priority overtake: 10,000 low-priority no-op jobs wait; one high-priority job is
enqueued after them. How long it waits to start, and how many jobs started in
between (at most about the relay's window, whatever the backlog), on a classic
and on a quorum queue (RabbitMQ's own priorities play no part: the table orders).

Prints one JSON object.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bench.common import argument_parser, fleet_options, report
from bench.fleet import fleet
from hybrid_jobs import outbox


def run(queue_type: str, backlog: int, consumers: int, concurrency: int) -> dict[str, Any]:
    with fleet(
        consumers=consumers, concurrency=concurrency, env={"AMQP_QUEUE_TYPE": queue_type}
    ) as f:
        engine = create_engine(f.db.sqlalchemy)
        with Session(engine) as session, session.begin():
            outbox.enqueue_many(session, [outbox.NewJob("noop", {}) for _ in range(backlog)])
        with psycopg.connect(f.db.conninfo, autocommit=True) as conn:
            # Let the backlog get going, so the urgent job meets a full window.
            while conn.execute("SELECT count(*) FROM jobs WHERE state = 'SUCCEEDED'").fetchone()[
                0
            ] < min(1000, backlog // 4):  # type: ignore[index]
                time.sleep(0.01)
            with Session(engine) as session, session.begin():
                urgent = outbox.enqueue(session, "noop", {}, priority=10)
            while conn.execute(
                "SELECT started_at IS NULL FROM jobs WHERE job_id = %s", [urgent]
            ).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.002)
            created, started = conn.execute(
                "SELECT created_at, started_at FROM jobs WHERE job_id = %s", [urgent]
            ).fetchone()  # type: ignore[misc]
            ahead, waiting = conn.execute(
                "SELECT count(*) FILTER (WHERE started_at > %s AND started_at < %s),"
                " count(*) FILTER (WHERE state = 'QUEUED') FROM jobs",
                [created, started],
            ).fetchone()  # type: ignore[misc]
            window = conn.execute("SELECT 2 * sum(concurrency) FROM workers").fetchone()[0]  # type: ignore[index]
        engine.dispose()
        return {
            "queue_type": queue_type,
            "start_delay_ms": round((started - created).total_seconds() * 1000, 1),
            "jobs_started_ahead": ahead,
            "window": window,
            "still_waiting_in_backlog": waiting,
        }


def main() -> None:
    parser = argument_parser("bench.priority", __doc__)
    parser.add_argument("--backlog", type=int, default=10_000, help="low-priority jobs waiting")
    fleet_options(parser)
    args = parser.parse_args()
    runs = [run(t, args.backlog, args.consumers, args.concurrency) for t in ("classic", "quorum")]
    report("priority", {"runs": runs})


if __name__ == "__main__":
    main()
