"""How soon does a fan-in callback start after the last of its parents ends?

Each round commits, in one transaction, ``--parents`` no-op jobs and a callback
enqueued ``after=`` all of them, on a relay and ``--consumers`` consumer processes
(the parents run in parallel on both). The end of each parent counts the
callback's parents down in the statement that ended it (the trigger
jobs_release_dependants); the one that ends the last makes the callback due and
writes its wake-up, so the relay sends it at that commit, with no polling.

Latency, from the database's clock (job_attempts): the callback's first attempt's
start minus the latest end of its parents' attempts. That spans the commit of the
last parent, the relay's NOTIFY and publish, the delivery and the claim. Every
round also checks that the callback ran exactly once, and counts the rounds whose
last two parents ended within a millisecond of each other on different consumers
(the race the count in the statement settles).

Prints one JSON object: p50/p95/p99 over the rounds (target p99 <= 100 ms).
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bench.common import argument_parser, fleet_options, percentiles, report
from bench.fleet import fleet
from hybrid_jobs import outbox

# The callback's first attempt and its parents' attempts, of one round: the
# latency in ms, how many attempts the callback had, how it ended, and the last two
# parents' ends (when and on which consumer).
_ROUND = """
WITH parents AS (
    SELECT a.finished_at, a.worker
    FROM job_dependencies AS d JOIN job_attempts AS a ON a.job_id = d.parent_id
    WHERE d.child_id = %(callback)s AND a.outcome = 'SUCCEEDED'
), last_two AS (
    SELECT finished_at, worker FROM parents ORDER BY finished_at DESC LIMIT 2
)
SELECT EXTRACT(EPOCH FROM (SELECT min(started_at) FROM job_attempts
                           WHERE job_id = %(callback)s)
                          - (SELECT max(finished_at) FROM parents)) * 1000,
       (SELECT count(*) FROM job_attempts WHERE job_id = %(callback)s),
       (SELECT state FROM jobs WHERE job_id = %(callback)s),
       (SELECT count(*) FROM parents),
       (SELECT EXTRACT(EPOCH FROM max(finished_at) - min(finished_at)) * 1000
               < 1 AND count(DISTINCT worker) = 2 FROM last_two)
"""


def one_round(engine: Any, conninfo: str, parents: int) -> dict[str, Any]:
    with Session(engine) as session, session.begin():
        ids = outbox.enqueue_many(session, [outbox.NewJob("noop", {}) for _ in range(parents)])
        callback: uuid.UUID = outbox.enqueue(session, "noop", {"callback": True}, after=ids)
    ended = outbox.wait_for(engine, callback, timeout=120)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(_ROUND, {"callback": callback}).fetchone()
    assert row is not None
    latency, attempts, state, parents_ran, tied = row
    return {
        "latency_ms": float(latency),
        "ran_once": attempts == 1 and state == ended.state == "SUCCEEDED",
        "parents_ran": int(parents_ran),
        "last_two_tied": bool(tied),
    }


def main() -> None:
    parser = argument_parser("bench.fan_in", __doc__)
    parser.add_argument("--rounds", type=int, default=20, help="callbacks, one per round")
    parser.add_argument("--parents", type=int, default=1000, help="parents of each callback")
    fleet_options(parser, consumers=2, concurrency=50)
    args = parser.parse_args()
    with fleet(consumers=args.consumers, concurrency=args.concurrency) as f:
        engine = create_engine(f.db.sqlalchemy)
        try:
            rounds = [one_round(engine, f.db.conninfo, args.parents) for _ in range(args.rounds)]
        finally:
            engine.dispose()
    once = sum(r["ran_once"] for r in rounds)
    report(
        "fan_in",
        {
            "rounds": args.rounds,
            "parents": args.parents,
            "consumers": args.consumers,
            "callback_start_after_last_parent": percentiles([r["latency_ms"] for r in rounds]),
            "max_ms": round(max(r["latency_ms"] for r in rounds), 2),
            "callbacks_ran_exactly_once": f"{once}/{args.rounds}",
            "every_parent_ran": all(r["parents_ran"] == args.parents for r in rounds),
            "rounds_last_two_parents_tied_on_two_consumers": sum(
                r["last_two_tied"] for r in rounds
            ),
            "target_p99_ms": 100,
        },
    )
    if once != args.rounds:
        raise SystemExit(f"a callback did not run exactly once: {once}/{args.rounds}")


if __name__ == "__main__":
    main()
