"""What one round trip costs when it is the only thing happening: the machine's
price for every hop a job's start takes at low load.

    python -m bench.wakeup_cost [--trips 200]

Three round trips, each timed back to back and then after an idle gap of 1, 5 and
50 ms (a process that sleeps between jobs, as every process on a job's path does
at 200 jobs/s):

- ``select_1``: ``SELECT 1`` on an async psycopg connection, prepared, as the
  daemons run their statements;
- ``plain_claim``: this project's claim of one plain job (JOB_CLAIM_PLAIN_MANY), as
  a consumer makes it, a real claim of a job no earlier try took;
- ``publish_confirm``: one transient message published to RabbitMQ on a channel
  with publisher confirms, the confirm awaited, as the relay publishes a wake-up.

Back to back, both ends of the connection are running and their caches warm; after
a gap, the work waits for both processes (and, on a VM, their virtual CPUs) to be
woken and their caches to be filled again. The difference is paid on each hop of a
job's path that starts from idle: the producer's commit, the relay's NOTIFY and
statements, RabbitMQ, the consumer's claim.

Prints one JSON object: per round trip and gap, p50 and p90 in microseconds.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable

import aiormq
import psycopg

from bench.common import AMQP, argument_parser, committing, report
from harness.claim import claim_params
from harness.scratch import scratch_database
from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.plumbing.db import make_pool, native
from hybrid_jobs.schema import queries as q

GAPS_MS = (0.0, 1.0, 5.0, 50.0)


async def timed(trip: Callable[[], Awaitable[None]], trips: int, gap_ms: float) -> dict[str, float]:
    walls = []
    for _ in range(trips + 10):
        if gap_ms:
            await asyncio.sleep(gap_ms / 1000)
        started = time.perf_counter()
        await trip()
        walls.append((time.perf_counter() - started) * 1e6)
    walls = sorted(walls[10:])  # the first few also prepare, declare, warm up
    return {
        "p50_us": round(statistics.median(walls)),
        "p90_us": round(walls[int(len(walls) * 0.9)]),
    }


async def measure(db: DatabaseUrl, job_ids: list[uuid.UUID], trips: int) -> dict[str, object]:
    figures: dict[str, object] = {}
    pool = make_pool(db, "bench-wakeup", max_size=1)
    await pool.open(wait=True)
    try:

        async def select_1() -> None:
            async with pool.connection() as conn:
                await (await conn.execute("SELECT 1", prepare=True)).fetchall()

        unclaimed = iter(job_ids)

        async def plain_claim() -> None:
            async with pool.connection() as conn:
                params = claim_params([next(unclaimed)], "bench-wakeup")
                rows = await (await native(q.JOB_CLAIM_PLAIN_MANY).execute(conn, params)).fetchall()
            if rows[0][0] != "claimed":
                raise RuntimeError(f"the claim took nothing: {rows}")

        figures["select_1"] = {f"gap_{g:g}_ms": await timed(select_1, trips, g) for g in GAPS_MS}
        figures["plain_claim"] = {
            f"gap_{g:g}_ms": await timed(plain_claim, trips, g) for g in GAPS_MS
        }
    finally:
        await pool.close()

    connection = await aiormq.connect(AMQP.url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        declared = await channel.queue_declare(
            f"bench-wakeup-{uuid.uuid4().hex[:8]}", exclusive=True, auto_delete=True
        )

        async def publish_confirm() -> None:
            await channel.basic_publish(b"wake", routing_key=declared.queue)

        figures["publish_confirm"] = {
            f"gap_{g:g}_ms": await timed(publish_confirm, trips, g) for g in GAPS_MS
        }
        await channel.queue_purge(declared.queue)
    finally:
        await connection.close()
    return figures


def main() -> None:
    parser = argument_parser("bench.wakeup_cost", __doc__)
    parser.add_argument("--trips", type=int, default=200, help="timed round trips per gap")
    args = parser.parse_args()
    needed = (args.trips + 10) * len(GAPS_MS)
    with scratch_database("bench_wakeup") as db:
        with committing(db) as session:
            ids = outbox.enqueue_many(
                session, [outbox.NewJob("noop", {"i": i}) for i in range(needed)]
            )
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE jobs")
        figures = asyncio.run(measure(db, ids, args.trips))
    report("wakeup_cost", {"trips": args.trips, **figures})


if __name__ == "__main__":
    main()
