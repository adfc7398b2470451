"""How soon does outbox.wait_for return after the commit that ended the job?

In a scratch database, jobs are ended by hand (an UPDATE to SUCCEEDED with a
result, committed) while someone waits for them; latency is from just before the
COMMIT was sent to the moment wait_for returned in the waiter, so it includes the
commit itself. Two ways:

- sync: one thread waits on one job at a time (``--rounds`` times), the job ended
  from another connection once the waiter is listening;
- async: ``--waiters`` coroutines of one event loop wait at once, each on its own
  job, and the jobs are ended one commit at a time, in random order, while all the
  others still wait; the listening connections of the process are counted
  (pg_stat_activity, application_name outbox-wait) while they do.

- cost: what the trigger costs the consumers: ``--drain-jobs`` noop jobs drained by
  a relay and two consumers, with the trigger and with it disabled (each in a fresh
  database; alternated ``--drain-rounds`` times, since the machine's load drifts).
  The trigger (jobs_finished) also owes the jobs' webhook calls, of which these
  jobs have none.

Prints one JSON object: p50/p95/p99 per way (target p50 <= 10 ms), and of the
COMMIT's own duration (commit_itself), the part of the latency that is the
database flushing the commit rather than the notification reaching the waiter.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import threading
import time
import uuid
from typing import Any

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine

from bench.common import argument_parser, committing, percentiles, report
from bench.fleet import drain_rate, fleet
from harness.scratch import scratch_database
from hybrid_jobs import outbox
from hybrid_jobs.outbox.waiting import APPLICATION_NAME
from hybrid_jobs.plumbing.config import DatabaseUrl

_END = "UPDATE jobs SET state = 'SUCCEEDED', finished_at = now(), result = %s WHERE job_id = %s"


def _enqueue(db: DatabaseUrl, n: int) -> list[uuid.UUID]:
    with committing(db) as session:
        return outbox.enqueue_many(
            session, [outbox.NewJob("bench_wait", {"i": i}) for i in range(n)]
        )


def sync_way(db: DatabaseUrl, rounds: int) -> dict[str, Any]:
    ids = _enqueue(db, rounds)
    engine = create_engine(db.sqlalchemy)
    samples: list[float] = []
    commits: list[float] = []
    try:
        with psycopg.connect(db.conninfo) as ender:
            for job_id in ids:
                returned: list[float] = []

                def wait(job_id: uuid.UUID = job_id, returned: list[float] = returned) -> None:
                    outbox.wait_for(engine, job_id, timeout=30)
                    returned.append(time.perf_counter())

                waiter = threading.Thread(target=wait)
                waiter.start()
                time.sleep(0.02)  # listening by now (its first read found it waiting)
                ender.execute(_END, ['{"ok": true}', job_id])
                sent = time.perf_counter()
                ender.commit()
                commits.append((time.perf_counter() - sent) * 1000)
                waiter.join(30)
                samples.append((returned[0] - sent) * 1000)
    finally:
        engine.dispose()
    return {
        "way": "sync",
        "rounds": rounds,
        "latency": percentiles(samples),
        "commit_itself": percentiles(commits),
    }


async def async_way(db: DatabaseUrl, waiters: int) -> dict[str, Any]:
    ids = _enqueue(db, waiters)
    engine = create_async_engine(db.sqlalchemy, pool_size=10, max_overflow=10, pool_timeout=120)
    returned: dict[uuid.UUID, float] = {}
    back = {i: asyncio.Event() for i in ids}

    async def wait(job_id: uuid.UUID) -> None:
        await outbox.wait_for_async(engine, job_id, timeout=300)
        returned[job_id] = time.perf_counter()
        back[job_id].set()

    try:
        tasks = [asyncio.create_task(wait(i)) for i in ids]
        await asyncio.sleep(2 + waiters / 500)  # every first read done
        async with await psycopg.AsyncConnection.connect(db.conninfo) as ender:
            cur = await ender.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = %s",
                [APPLICATION_NAME],
            )
            row = await cur.fetchone()
            listening = row[0] if row else None
            await ender.commit()
            order = list(ids)
            random.shuffle(order)
            sent: dict[uuid.UUID, float] = {}
            commits: list[float] = []
            for job_id in order:
                await ender.execute(_END, ['{"ok": true}', job_id])
                sent[job_id] = time.perf_counter()
                await ender.commit()
                commits.append((time.perf_counter() - sent[job_id]) * 1000)
                await asyncio.wait_for(back[job_id].wait(), 30)
        await asyncio.gather(*tasks)
    finally:
        await engine.dispose()
    samples = [(returned[i] - sent[i]) * 1000 for i in ids]
    return {
        "way": "async",
        "waiters": waiters,
        "listening_connections": listening,
        "latency": percentiles(samples),
        "commit_itself": percentiles(commits),
    }


def cost_way(jobs: int, rounds: int) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"trigger": [], "no_trigger": []}
    for _ in range(rounds):
        for way in rates:
            with fleet(consumers=2) as f:
                if way == "no_trigger":
                    with psycopg.connect(f.db.conninfo, autocommit=True) as conn:
                        conn.execute("ALTER TABLE jobs DISABLE TRIGGER jobs_finished")
                batch = [outbox.NewJob("noop", {}) for _ in range(jobs)]
                rates[way].append(round(drain_rate(f, batch)))
    return {
        "way": "cost",
        "jobs": jobs,
        "jobs_per_s": rates,
        "median_ratio": round(
            statistics.median(rates["trigger"]) / statistics.median(rates["no_trigger"]), 3
        ),
    }


def main() -> None:
    parser = argument_parser("bench.wait_for", __doc__)
    parser.add_argument("--rounds", type=int, default=200, help="sync: jobs waited for in turn")
    parser.add_argument("--waiters", type=int, default=1000, help="async: waiters at once")
    parser.add_argument("--drain-jobs", type=int, default=5000, help="cost: jobs drained")
    parser.add_argument("--drain-rounds", type=int, default=3, help="cost: rounds of each")
    parser.add_argument(
        "--ways", default="sync,async,cost", help="which ways to run, comma-separated"
    )
    args = parser.parse_args()
    ways = set(args.ways.split(","))
    with scratch_database("bench_wait") as db:
        runs = []
        if "sync" in ways:
            runs.append(sync_way(db, args.rounds))
        if "async" in ways:
            runs.append(asyncio.run(async_way(db, args.waiters)))
    if "cost" in ways:
        runs.append(cost_way(args.drain_jobs, args.drain_rounds))
    report("wait_for", {"runs": runs})


if __name__ == "__main__":
    main()
