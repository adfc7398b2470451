"""Relay throughput: N outbox rows from one commit until every one is confirmed by
RabbitMQ and marked sent, through the real `relay` process. No consumer runs, so the
relay's window is opened wide (--window, default the row count): this measures the
relay deciding, packing (--pack ids a message) and publishing. In the same run, a
bare aio-pika publisher sends N persistent messages of one id each, with pipelined
confirms: the ceiling of one message per wake-up.

    python -m bench.relay_throughput [--rows 20000] [--publishers 2] [--batch-size 500]

Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import time

import aio_pika
import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bench.common import AMQP, argument_parser, report, scratch_system
from hybrid_jobs import outbox
from hybrid_jobs.plumbing.cli import event_loop_runner
from hybrid_jobs.schema.topology import Declared, Topology


async def bare_publisher(topology: Topology, n: int, window: int) -> float:
    """Messages per second for plain aio-pika: persistent, mandatory, confirms awaited
    in windows of ``window`` (the relay's batch size)."""
    connection = await aio_pika.connect_robust(AMQP.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        declared = Declared(channel, topology)
        queue = await declared.queue("bare")
        exchange = await declared.base()
        body = b"00000000-0000-0000-0000-000000000000"
        started = time.perf_counter()
        for start in range(0, n, window):
            await asyncio.gather(
                *(
                    exchange.publish(
                        aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key="bare",
                        mandatory=True,
                    )
                    for _ in range(min(window, n - start))
                )
            )
        elapsed = time.perf_counter() - started
        await queue.purge()
    return n / elapsed


def main() -> None:
    parser = argument_parser("bench.relay_throughput", __doc__)
    parser.add_argument(
        "--rows", type=int, default=20_000, help="outbox rows committed at once (and bare messages)"
    )
    parser.add_argument(
        "--publishers", type=int, default=2, help="the relay's --publishers: batches in flight"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=500,
        help="the relay's --batch-size, and the bare publisher's confirm window",
    )
    parser.add_argument("--pack", type=int, default=50, help="the relay's --pack")
    parser.add_argument(
        "--window", type=int, default=0, help="the relay's --window (0: the row count)"
    )
    args = parser.parse_args()

    with scratch_system(queues=["default", "bare"]) as system:
        db = system.db
        bare = event_loop_runner()(bare_publisher(system.topology, args.rows, args.batch_size))
        relay = system.start(
            "relay",
            *("--publishers", str(args.publishers), "--batch-size", str(args.batch_size)),
            *("--pack", str(args.pack), "--window", str(args.window or args.rows)),
        )
        time.sleep(2)  # connected and listening
        engine = create_engine(db.sqlalchemy)
        jobs = [outbox.NewJob("noop", {"i": i}) for i in range(args.rows)]
        with Session(engine) as session, session.begin():
            outbox.enqueue_many(session, jobs)
        committed = time.perf_counter()
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            while True:
                sent = conn.execute("SELECT count(sent_at) FROM outbox").fetchone()[0]
                if sent >= args.rows:
                    break
                if relay.poll() is not None:
                    raise SystemExit(f"relay exited with {relay.returncode}")
                time.sleep(0.02)
        elapsed = time.perf_counter() - committed
        engine.dispose()

    relay_rate = args.rows / elapsed
    report(
        "relay_throughput",
        {
            "rows": args.rows,
            "publishers": args.publishers,
            "batch_size": args.batch_size,
            "pack": args.pack,
            "relay_rows_per_s": round(relay_rate),
            "bare_aio_pika_msgs_per_s": round(bare),
            "relay_to_bare_ratio": round(relay_rate / bare, 2),
            "seconds": round(elapsed, 2),
        },
    )


if __name__ == "__main__":
    main()
