"""A broker namespace's queues, read and cleared from outside the daemons: how deep
one is, emptying it, deleting a whole namespace afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import aio_pika

from hybrid_jobs.schema.topology import Declared, Topology


async def queue_depth(amqp_url: str, topology: Topology, queue: str) -> int:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        q = await Declared(channel, topology).queue(queue)
        return q.declaration_result.message_count or 0


async def purge(amqp_url: str, topology: Topology, queue: str) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        q = await Declared(channel, topology).queue(queue)
        with contextlib.suppress(Exception):
            await q.purge()


async def delete_topology(amqp_url: str, topology: Topology, queues: Iterable[str]) -> None:
    """Delete a namespace's job queues, dead-letter queue and exchanges, whichever
    exist (deleting one that does not closes the channel, so each gets its own)."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        for name in [*(topology.queue_name(q) for q in queues), topology.dead_letter_queue_name]:
            channel = await connection.channel()
            with contextlib.suppress(Exception):
                await channel.queue_delete(name)
        for name in (topology.exchange_name, topology.dead_letter_exchange_name):
            channel = await connection.channel()
            with contextlib.suppress(Exception):
                await channel.exchange_delete(name)
