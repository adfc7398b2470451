"""The relay's side of RabbitMQ: a robust connection (to the next node of a cluster
when it loses one), and batches of wake-ups published with their confirms awaited
together."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import aio_pika
import aiormq
import aiormq.exceptions

from plumbing.amqp import FailoverConnection, connect_failover
from plumbing.config import AmqpUrl
from schema.topology import MAX_PRIORITY, Declared, Topology

log = logging.getLogger("relay")


@dataclass(frozen=True)
class WakeUp:
    """One message: the job ids it wakes (one a line in its body), for one queue."""

    queue: str
    job_ids: tuple[uuid.UUID, ...]
    priority: int
    # The first outbox row's id: aiormq matches a returned (unroutable) message to
    # its publish by message_id.
    message_id: str

    @property
    def body(self) -> bytes:
        return "\n".join(str(i) for i in self.job_ids).encode()


def pack(queue: str, rows: Sequence[tuple[int, uuid.UUID, int]], most: int) -> list[WakeUp]:
    """Pack (outbox id, job id, priority) rows into as few messages as ``most`` ids
    a message allows, evenly: 30 rows at most 20 make two messages of 15, so the
    consumers share a batch rather than one taking it all. One row, one message."""
    if not rows:
        return []
    count = -(-len(rows) // most)
    size = -(-len(rows) // count)
    return [
        WakeUp(
            queue,
            tuple(job_id for _, job_id, _ in chunk),
            max(priority for _, _, priority in chunk),
            str(chunk[0][0]),
        )
        for chunk in (rows[i : i + size] for i in range(0, len(rows), size))
    ]


class Publisher:
    def __init__(self, amqp: AmqpUrl, topology: Topology) -> None:
        self.amqp = amqp
        self.topology = topology
        self.connection: FailoverConnection | None = None
        self.declared: Declared | None = None
        self._replacing = asyncio.Lock()
        self.closing = False

    async def connect(self) -> None:
        connection = await connect_failover(
            self.amqp, name=f"relay {socket.gethostname()}:{os.getpid()}"
        )
        try:
            # on_return_raises: an unroutable wake-up fails its publish instead of
            # being dropped by the broker.
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            self.declared = Declared(channel, self.topology)
            await self.declared.base()
        except BaseException:
            # Retried from scratch: a robust connection left open would go on
            # reconnecting beside its successor.
            await connection.close()
            raise
        self.connection = connection
        connection.reconnect_callbacks.add(self._on_reconnect)
        connection.close_callbacks.add(self._on_close)
        log.info(
            "relay.broker_connected", extra={"node": connection.node, "amqp": self.amqp.redacted()}
        )

    @property
    def connected(self) -> bool:
        return self.connection is not None and self.connection.connected.is_set()

    def _on_reconnect(self, *_: object) -> None:
        node = self.connection.node if self.connection else None
        log.info("relay.broker_reconnected", extra={"node": node, "amqp": self.amqp.redacted()})

    def _on_close(self, _connection: object, exc: BaseException | None = None) -> None:
        if exc is not None and not self.closing:
            node = self.connection.node if self.connection else None
            log.warning("relay.broker_connection_lost", extra={"node": node, "error": str(exc)})

    async def publish(self, wakeups: Sequence[WakeUp], confirm_timeout: float) -> None:
        """Publish every message and wait for all the broker's confirms.

        Raises if any is not confirmed (nacked, returned as unroutable, or not
        confirmed within ``confirm_timeout`` seconds, declaring included); the caller
        then rolls the batch back.
        """
        assert self.declared is not None, "connect() first"
        declared = self.declared
        try:
            # All of it under the timeout: with the broker away, declaring the queue
            # or finding the channel waits for a reconnect, inside the caller's
            # transaction, which must not stay open for that.
            async with asyncio.timeout(confirm_timeout):
                await self._publish(wakeups)
        except aiormq.exceptions.PublishError:
            # Returned as unroutable: the queue was deleted behind our back (say, from
            # the management UI). Declare it again before the batch is retried.
            declared.forget_queues()
            raise
        except aiormq.exceptions.DeliveryError as exc:
            if isinstance(exc.frame, aiormq.spec.Basic.Nack):
                await self._replace_channel(declared, confirm_timeout)
            raise

    async def _replace_channel(self, nacked: Declared, within: float) -> None:
        """A fresh channel after the broker nacked a publish. A channel that
        published to a quorum queue while its leader was being elected (a node
        lost) goes on nacking every publish to it (RabbitMQ 3.10, measured on a
        three-node cluster), while a new channel is confirmed at once."""
        async with self._replacing:
            if self.declared is not nacked or self.connection is None:
                return  # another publisher replaced it already
            try:
                async with asyncio.timeout(within):
                    channel = await self.connection.channel(
                        publisher_confirms=True, on_return_raises=True
                    )
                    fresh = Declared(channel, self.topology)
                    await fresh.base()
            except Exception as exc:  # still nacked at the next batch: tried again then
                log.warning("relay.channel_replace_failed", extra={"error": str(exc)})
                return
            self.declared = fresh
        log.info("relay.channel_replaced", extra={"reason": "publish nacked"})
        try:
            await nacked.channel.close()
        except Exception as exc:  # gone already
            log.debug("relay.channel_close_failed", extra={"error": str(exc)})

    async def wait_connected(self, within: float) -> None:
        """Return once connected to RabbitMQ, or raise ConnectionError: checked
        before the relay opens a transaction, so an outage keeps none open."""
        assert self.connection is not None, "connect() first"
        try:
            async with asyncio.timeout(within):
                await self.connection.connected.wait()
        except TimeoutError:
            raise ConnectionError("not connected to RabbitMQ") from None

    async def _publish(self, wakeups: Sequence[WakeUp]) -> None:
        assert self.declared is not None
        for queue in {w.queue for w in wakeups}:
            await self.declared.queue(queue)
        exchange = (await self.declared.base()).name
        # The wake-up is the hot path: publish on the channel under aio-pika's robust
        # one (the current one, after any reconnect) instead of building an
        # aio_pika.Message per wake-up, which measured at about a fifth of the relay's
        # CPU. Each message gets its own properties: aiormq matches a returned
        # (unroutable) message to its publish by message_id, the outbox row's id.
        channel = await self.declared.channel.get_underlay_channel()
        persistent = int(aio_pika.DeliveryMode.PERSISTENT)
        await asyncio.gather(
            *(
                channel.basic_publish(
                    w.body,
                    exchange=exchange,
                    routing_key=w.queue,
                    properties=aiormq.spec.Basic.Properties(
                        delivery_mode=persistent,
                        priority=min(max(w.priority, 0), MAX_PRIORITY),
                        message_id=w.message_id,
                        content_type="text/plain",
                    ),
                    mandatory=True,
                )
                for w in wakeups
            )
        )

    async def ready_counts(self, queues: list[str]) -> dict[str, int]:
        """Messages ready (not yet delivered) in each job queue; a queue that does not
        exist counts as empty. Asked on plain AMQP channels, one per queue, outside
        aio-pika's robust bookkeeping: a passive declare of a missing queue closes the
        channel it is made on, and nothing should try to restore that channel."""
        assert self.connection is not None, "connect() first"
        await self.connection.ready()
        transport = self.connection.transport
        if transport is None:
            raise ConnectionError("not connected to RabbitMQ")
        counts: dict[str, int] = {}
        for queue in queues:
            channel = await transport.connection.channel(publisher_confirms=False)
            try:
                ok = await channel.queue_declare(self.topology.queue_name(queue), passive=True)
                counts[queue] = ok.message_count or 0
            except aiormq.exceptions.ChannelNotFoundEntity:
                counts[queue] = 0
            finally:
                if not channel.is_closed:
                    await channel.close()
        return counts

    async def close(self) -> None:
        self.closing = True
        if self.connection is not None:
            await self.connection.close()
