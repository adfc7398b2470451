"""What deriving the async producer API from the sync one costs: --jobs no-op jobs
enqueued through an ``AsyncSession`` two ways, in one scratch database, one after
another in the same run:

- hand: an async body written by hand, ``await conn.exec_driver_sql`` for each
  statement (the producer API's twins were written so until they were derived;
  the bench keeps that body as its baseline);
- run_sync: the sync function run in the session's greenlet,
  ``await session.run_sync(outbox.enqueue, ...)``, which is how SQLAlchemy runs
  every ``AsyncSession`` call underneath, and what ``outbox.enqueue_async`` is.

Each way enqueues one job per transaction (``enqueue``) and --batch jobs per
transaction (``enqueue_many``), from --concurrency tasks sharing one engine. The
ways alternate for --repeats rounds (tables emptied before each round), so load
from elsewhere on the machine falls on both alike. The bench's sessions commit
with synchronous_commit off: the two ways differ only in Python, and a disk flush
per commit would bury that difference in the disk's noise (so the ratio printed
is the harsher one; with flushes, run_sync's share of a transaction is smaller).

Prints one JSON object: for each way and shape, the median over the rounds of
jobs/s, per-transaction latency (begin to commit) p50/p95/p99, and this process's
CPU time per job (the cost run_sync could add, and the figure least moved by other
work on the machine); and run_sync's figures as ratios of hand's (jobs/s below 1,
CPU above 1: run_sync costs more).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from bench.common import argument_parser, percentiles, report, scratch_database
from hybrid_jobs import outbox
from hybrid_jobs.outbox import backpressure
from hybrid_jobs.outbox.enqueue import _plan, _resolve, check_driver
from hybrid_jobs.outbox.validation import max_payload_bytes
from hybrid_jobs.schema.queries import JOB_FIND_BY_DEDUP_MANY, JOB_INSERT_MANY

Enqueue = Callable[[AsyncSession, int], Awaitable[object]]


async def _hand_enqueue_many(session: AsyncSession, jobs: Iterable[outbox.NewJob]) -> list[Any]:
    """outbox.enqueue_many's body as its async twin had it by hand."""
    plan, ids = _plan(jobs, max_payload_bytes())
    if not ids:
        return []
    conn = await session.connection()
    check_driver(conn)
    if plan.tenants:
        limits = await conn.exec_driver_sql(
            backpressure.STATEMENT, backpressure.params(plan.tenants)
        )
        backpressure.refuse_over_limit(plan.tenants, limits.all())
    result = await conn.exec_driver_sql(JOB_INSERT_MANY, {"jobs": plan.document})
    inserted = set(result.scalars())
    lookup = plan.lookup_document(inserted, ids)
    found: Sequence[Any] = []
    if lookup:
        found = (await conn.exec_driver_sql(JOB_FIND_BY_DEDUP_MANY, {"keys": lookup})).all()
    return _resolve(plan, ids, inserted, found)


def _jobs(start: int, count: int) -> list[outbox.NewJob]:
    return [outbox.NewJob("noop", {"n": n}) for n in range(start, start + count)]


async def _hand_one(session: AsyncSession, n: int) -> object:
    return (await _hand_enqueue_many(session, [outbox.NewJob("noop", {"n": n})]))[0]


async def _run_sync_one(session: AsyncSession, n: int) -> object:
    return await session.run_sync(outbox.enqueue, "noop", {"n": n})


def _many(batch: int, derived: bool) -> Enqueue:
    async def hand(session: AsyncSession, n: int) -> object:
        return await _hand_enqueue_many(session, _jobs(n, batch))

    async def run_sync(session: AsyncSession, n: int) -> object:
        return await session.run_sync(outbox.enqueue_many, _jobs(n, batch))

    return run_sync if derived else hand


async def _measure(
    engine: AsyncEngine, enqueue: Enqueue, jobs: int, per_tx: int, concurrency: int
) -> dict[str, Any]:
    """Jobs/s and each transaction's latency, ``concurrency`` tasks taking the next
    transaction's first job number from a shared counter."""
    transactions = iter(range(0, jobs, per_tx))
    latencies: list[float] = []

    async def task() -> None:
        async with AsyncSession(engine) as session:
            for n in transactions:
                began = time.perf_counter()
                async with session.begin():
                    await enqueue(session, n)
                latencies.append((time.perf_counter() - began) * 1000)

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(task() for _ in range(concurrency)))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {
        "jobs_per_s": round(jobs / elapsed),
        **percentiles(latencies),
        "cpu_us_per_job": round(cpu / jobs * 1e6, 1),
    }


def _empty(conninfo: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("TRUNCATE jobs, outbox CASCADE")


async def run(conninfo: str, url: str, args: Any) -> dict[str, Any]:
    shapes: dict[str, tuple[int, dict[str, Enqueue]]] = {
        "enqueue": (1, {"hand": _hand_one, "run_sync": _run_sync_one}),
        f"enqueue_many x{args.batch}": (
            args.batch,
            {"hand": _many(args.batch, False), "run_sync": _many(args.batch, True)},
        ),
    }
    engine = create_async_engine(
        url,
        pool_size=args.concurrency,
        connect_args={"options": "-c synchronous_commit=off"},
    )
    rounds: dict[str, dict[str, list[dict[str, Any]]]] = {
        shape: {way: [] for way in ways} for shape, (_, ways) in shapes.items()
    }
    try:
        # One round unmeasured: connections opened, statements prepared, caches warm.
        for per_tx, ways in shapes.values():
            for enqueue in ways.values():
                await _measure(engine, enqueue, min(args.jobs, 200), per_tx, args.concurrency)
        for r in range(args.repeats):
            for shape, (per_tx, ways) in shapes.items():
                # Alternate which way goes first, so neither always runs on a fresher table.
                order = list(ways.items()) if r % 2 == 0 else list(reversed(ways.items()))
                for way, enqueue in order:
                    _empty(conninfo)
                    figures = await _measure(engine, enqueue, args.jobs, per_tx, args.concurrency)
                    rounds[shape][way].append(figures)
    finally:
        await engine.dispose()
    result: dict[str, Any] = {}
    for shape, by_way in rounds.items():
        median = {
            way: {key: statistics.median(f[key] for f in figures) for key in figures[0]}
            for way, figures in by_way.items()
        }
        pairs = list(zip(by_way["hand"], by_way["run_sync"], strict=True))
        speed = [round(d["jobs_per_s"] / h["jobs_per_s"], 3) for h, d in pairs]
        cpu = [round(d["cpu_us_per_job"] / h["cpu_us_per_job"], 3) for h, d in pairs]
        result[shape] = {
            "median": median,
            "run_sync_to_hand": {
                "jobs_per_s": round(statistics.median(speed), 3),
                "cpu_per_job": round(statistics.median(cpu), 3),
            },
            "per_round": {"jobs_per_s": speed, "cpu_per_job": cpu},
        }
    return result


def main() -> None:
    parser = argument_parser("bench.enqueue_async", __doc__)
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per way, shape and round")
    parser.add_argument("--batch", type=int, default=100, help="jobs per enqueue_many")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of both ways")
    parser.add_argument("--concurrency", type=int, default=4, help="tasks enqueueing at once")
    args = parser.parse_args()
    with scratch_database("bench_enqueue_async") as db:
        shapes = asyncio.run(run(db.conninfo, db.sqlalchemy, args))
    report(
        "enqueue_async",
        {
            "jobs": args.jobs,
            "batch": args.batch,
            "repeats": args.repeats,
            "concurrency": args.concurrency,
            "shapes": shapes,
        },
    )


if __name__ == "__main__":
    main()
