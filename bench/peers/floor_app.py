"""The two worker processes of `bench.peers.floor`: ``python -m bench.peers.floor_app
relay`` and ``python -m bench.peers.floor_app consumer``, with the database in
``FLOOR_DSN``, the broker in ``AMQP_URL`` and the queue in ``FLOOR_QUEUE``.

They take every hop a job of this project takes from its commit to its handler, and
do at each the least that hop needs to keep this design's guarantees; nothing else:

- relay: hears the producer's NOTIFY; in one transaction (BEGIN, one statement,
  COMMIT, asynchronous as ours), locks and marks up to 500 unsent outbox rows with
  ``FOR UPDATE SKIP LOCKED``, publishes their ids (persistent, mandatory, packed at
  most 20 to a message) and awaits the broker's confirms before it commits;
- consumer: takes each delivery as a wake-up; claims its ids in one fenced UPDATE
  (state, owner, generation + 1; its own synchronous commit), acks the delivery,
  runs the no-op handlers, and records their end in one fenced UPDATE (its own
  synchronous commit).

No window, no priorities, no fair share, no tenants, no caps, no history, no
heartbeats, no retries, no error handling: what is left is the cost of the shape.

With ``BENCH_HOPS`` set, each process notes in its marks when a wake-up passes each
hop (the relay: a NOTIFY heard, ids marked, published and confirmed; a consumer: ids
delivered, about to be claimed, claimed), at the points where ours traces the same
hops at DEBUG, so
`bench.latency --only floor` splits the floor's start as it splits ours.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal

import aiormq
import aiormq.abc
import psycopg
import uvloop

from bench.marks import HOPS_ENV, Marks

CHANNEL = "floor_outbox"
BATCH = 500
PACK = 20
PREFETCH = 10

MARK = """
UPDATE floor_outbox SET sent = true
WHERE id IN (SELECT id FROM floor_outbox WHERE NOT sent ORDER BY id LIMIT %(batch)s
             FOR UPDATE SKIP LOCKED)
RETURNING job_id
"""
CLAIM = """
UPDATE floor_jobs
SET state = 'running', lease_owner = %(worker)s, lease_generation = lease_generation + 1
WHERE id = ANY(%(ids)s) AND state = 'queued'
RETURNING id, kind, lease_generation
"""
FINISH = """
UPDATE floor_jobs AS j SET state = 'done', lease_owner = NULL
FROM unnest(%(ids)s::bigint[], %(generations)s::bigint[]) AS f(id, generation)
WHERE j.id = f.id AND j.lease_owner = %(worker)s AND j.lease_generation = f.generation
  AND j.state = 'running'
"""


def _stopping(*also: asyncio.Event) -> asyncio.Event:
    """An event set by SIGTERM or SIGINT, which sets ``also`` too."""
    stop = asyncio.Event()

    def stopped() -> None:
        for event in (stop, *also):
            event.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped)
    return stop


async def relay(dsn: str, amqp: str, queue: str) -> None:
    wake = asyncio.Event()
    stop = _stopping(wake)
    hops = Marks.from_env() if os.environ.get(HOPS_ENV) else None
    broker = await aiormq.connect(amqp)
    channel = await broker.channel(publisher_confirms=True)
    await channel.queue_declare(queue, durable=True)
    persistent = aiormq.spec.Basic.Properties(delivery_mode=2)
    listen = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    work = await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, options="-c synchronous_commit=off"
    )
    await listen.execute(f"LISTEN {CHANNEL}")

    async def hear() -> None:
        async for _ in listen.notifies():
            if hops:
                hops.hop("notified")
            wake.set()

    listening = asyncio.create_task(hear())
    try:
        while not stop.is_set():
            wake.clear()
            async with work.transaction():
                rows = await (await work.execute(MARK, {"batch": BATCH})).fetchall()
                ids = [str(r[0]) for r in rows]
                if hops and ids:
                    hops.hop("decided", ids)
                confirms = [
                    channel.basic_publish(
                        "\n".join(ids[i : i + PACK]).encode(),
                        routing_key=queue,
                        properties=persistent,
                        mandatory=True,
                    )
                    for i in range(0, len(ids), PACK)
                ]
                for confirm in await asyncio.gather(*confirms):
                    if not isinstance(confirm, aiormq.spec.Basic.Ack):
                        raise RuntimeError(f"not confirmed: {confirm!r}")
                if hops and ids:
                    hops.hop("sent", ids)
            if len(rows) == BATCH:
                continue
            with contextlib.suppress(TimeoutError):  # a NOTIFY, the stop, or a look anyway
                async with asyncio.timeout(0.5):
                    await wake.wait()
    finally:
        listening.cancel()
        await listen.close()
        await work.close()
        await broker.close()


async def consumer(dsn: str, amqp: str, queue: str) -> None:
    stop = _stopping()
    worker = f"floor-{os.getpid()}"
    marks = Marks.from_env()
    hops = os.environ.get(HOPS_ENV) is not None
    pool = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(PREFETCH)]
    idle: asyncio.Queue[psycopg.AsyncConnection] = asyncio.Queue()
    for conn in pool:
        idle.put_nowait(conn)
    broker = await aiormq.connect(amqp)
    channel = await broker.channel()
    await channel.queue_declare(queue, durable=True)
    await channel.basic_qos(prefetch_count=PREFETCH)

    async def handle(message: aiormq.abc.DeliveredMessage) -> None:
        ids = [int(line) for line in message.body.split(b"\n")]
        if hops:
            marks.hop("delivered", ids)
        conn = await idle.get()
        try:
            if hops:
                marks.hop("claiming", ids)
            claimed = await (await conn.execute(CLAIM, {"ids": ids, "worker": worker})).fetchall()
            if hops:
                marks.hop("claimed", [r[0] for r in claimed])
            assert message.delivery_tag is not None  # a consumer's delivery has one
            await message.channel.basic_ack(message.delivery_tag)
            for job_id, kind, _ in claimed:
                if kind == "latency":
                    marks.started(job_id)
                elif kind == "ready":
                    marks.ready()
            await conn.execute(
                FINISH,
                {
                    "ids": [r[0] for r in claimed],
                    "generations": [r[2] for r in claimed],
                    "worker": worker,
                },
            )
            marks.done(sum(1 for r in claimed if r[1] == "noop"))
        finally:
            idle.put_nowait(conn)

    tasks: set[asyncio.Task[None]] = set()

    async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
        task = asyncio.create_task(handle(message))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    await channel.basic_consume(queue, on_message)
    await stop.wait()
    await channel.close()
    if tasks:
        await asyncio.wait(tasks, timeout=5)
    await broker.close()
    for conn in pool:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="A worker process of bench.peers.floor.")
    parser.add_argument("role", choices=["relay", "consumer"])
    role = parser.parse_args().role
    run = relay if role == "relay" else consumer
    uvloop.run(run(os.environ["FLOOR_DSN"], os.environ["AMQP_URL"], os.environ["FLOOR_QUEUE"]))


if __name__ == "__main__":
    main()
