"""Quorum queues never dead-letter a well-formed wake-up: a wake-up handed back to
the queue any number of times is still a wake-up, and reaches a consumer that can
start its job. RabbitMQ 3.x sets no delivery limit; 4.0 and later dead-letter a
message handed back 20 times unless the queue says otherwise."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import AsyncIterator

import aio_pika
import psycopg
import pytest
from sqlalchemy import Engine

from hybrid_jobs import consumers
from hybrid_jobs.consumers import Registry
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import QUORUM_DELIVERY_LIMIT, QueueType, Topology
from tests.support.broker import delete_topology, queue_depth
from tests.support.inproc import consumer_running, relay_running
from tests.support.jobs import enqueue, until, wait_for_state
from tests.support.services import AMQP_URL

pytestmark = pytest.mark.timeout(120)

# More hand-backs than RabbitMQ 4.x allows by default (20).
HAND_BACKS = 25


@pytest.fixture
async def quorum(db_url: DatabaseUrl) -> AsyncIterator[Topology]:
    topology = Topology(prefix=f"t{uuid.uuid4().hex[:10]}", queue_type=QueueType.QUORUM)
    yield topology
    await delete_topology(AMQP_URL, topology, ["default"])


def queue_arguments(name: str) -> str:
    """The queue's arguments as RabbitMQ lists them."""
    out = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "name", "arguments"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return next(line for line in out.splitlines() if line.split("\t")[0] == name)


async def hand_back(amqp: AmqpUrl, topology: Topology, times: int) -> list[int]:
    """Take the queue's one message and give it back, ``times`` times, the way a
    consumer that cannot start its job does; the delivery counts RabbitMQ saw."""
    counts = []
    connection = await aio_pika.connect(amqp.url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(topology.queue_name("default"))
        for _ in range(times):
            message = await queue.get(timeout=10)
            counts.append(int((message.headers or {}).get("x-delivery-count", 0) or 0))
            await message.nack(requeue=True)
    return counts


async def test_a_wakeup_handed_back_more_than_twenty_times_still_runs_its_job(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, amqp_url: AmqpUrl, quorum: Topology
) -> None:
    registry = Registry()

    @registry.handler("patient")
    async def patient(job: consumers.Job) -> None:
        return None

    job_id = enqueue(engine, "patient")
    async with relay_running(db_url, amqp_url, quorum, rewake_interval=300):
        await until(lambda: pg.execute("SELECT count(sent_at) FROM outbox").fetchone()[0], "sent")
        name = quorum.queue_name("default")
        # Today's code declared quorum job queues with no limit, which RabbitMQ 4.x
        # reads as 20: the 21st hand-back dead-letters the wake-up.
        assert f'"x-delivery-limit",{QUORUM_DELIVERY_LIMIT}' in queue_arguments(name)
        counts = await hand_back(amqp_url, quorum, HAND_BACKS)
        assert counts[-1] == HAND_BACKS - 1, "RabbitMQ counted every hand-back"
        async with consumer_running(db_url, amqp_url, quorum, registry):
            await wait_for_state(pg, job_id, "SUCCEEDED", timeout=30)
    connection = await aio_pika.connect(amqp_url.url)
    async with connection:
        channel = await connection.channel()
        dead = await channel.declare_queue(quorum.dead_letter_queue_name, passive=True)
        assert dead.declaration_result.message_count == 0, "nothing was dead-lettered"


async def test_a_quorum_queue_declared_by_an_earlier_release_keeps_working(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    quorum: Topology,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Declaring an existing queue with an argument it lacks is refused
    (PRECONDITION_FAILED): the relay and the consumer use the queue as it is and
    say how to raise its limit, rather than stop publishing or consuming."""
    connection = await aio_pika.connect(amqp_url.url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(
            quorum.queue_name("default"),
            durable=True,
            arguments={
                "x-dead-letter-exchange": quorum.dead_letter_exchange_name,
                "x-queue-type": "quorum",
            },
        )
    registry = Registry()

    @registry.handler("old_queue")
    async def old_queue(job: consumers.Job) -> None:
        return None

    async with (
        relay_running(db_url, amqp_url, quorum),
        consumer_running(db_url, amqp_url, quorum, registry),
    ):
        ids = [enqueue(engine, "old_queue") for _ in range(5)]
        for job_id in ids:
            await wait_for_state(pg, job_id, "SUCCEEDED", timeout=30)
    warned = {
        (r.name, r.msg) for r in caplog.records if r.msg == "topology.queue_without_delivery_limit"
    }
    assert warned == {("topology", "topology.queue_without_delivery_limit")}
    assert "x-delivery-limit" not in queue_arguments(quorum.queue_name("default"))
    assert await queue_depth(amqp_url.url, quorum, "default") == 0
