"""The consumer's side of RabbitMQ: deliveries in, each one a wake-up naming a job.

A body that is not a job id is rejected without requeue, which routes it to the
dead-letter queue, and logged; nothing else about it is trusted.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue, AbstractRobustConnection
from aiormq.exceptions import ChannelInvalidStateError

from plumbing.config import AmqpUrl
from schema.topology import Declared, Topology

log = logging.getLogger("consumer")

# "urn:uuid:" plus the 36 characters of the canonical form; anything longer is not a
# job id and is not worth decoding.
MAX_BODY_BYTES = 45


@dataclass(frozen=True)
class Delivery:
    job_id: uuid.UUID
    message: AbstractIncomingMessage


def parse_job_id(body: bytes) -> uuid.UUID | None:
    if not body or len(body) > MAX_BODY_BYTES:
        return None
    try:
        return uuid.UUID(body.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None


async def settle(message: AbstractIncomingMessage, *, ack: bool, requeue: bool = True) -> bool:
    """Ack, or nack with requeue; False if the channel it came on is gone (the broker
    requeued the delivery already when the channel closed)."""
    try:
        if ack:
            await message.ack()
        else:
            await message.nack(requeue=requeue)
    except Exception:
        return False
    return True


async def ack_in_order(deliveries: list[Delivery]) -> None:
    """Ack a batch the claimer took: one frame per channel, ``multiple`` on the
    highest delivery tag.

    Sound because deliveries are settled in the order they arrive: every delivery
    on that channel with a lower tag has been acked, rejected or nacked already, so
    "up to and including" covers exactly this batch.
    """
    newest: dict[int, AbstractIncomingMessage] = {}
    for delivery in deliveries:
        message = delivery.message
        try:
            key = id(message.channel)
        except ChannelInvalidStateError:
            log.debug("consumer.ack_skipped", extra={"why": "channel closed; broker requeued it"})
            continue
        tag = message.delivery_tag or 0
        if key not in newest or tag > (newest[key].delivery_tag or 0):
            newest[key] = message
    for message in newest.values():
        try:
            await message.ack(multiple=True)
        except Exception as exc:
            log.debug("consumer.ack_failed", extra={"error": str(exc)})


class Inbox:
    """Consumes the given queues into a callback, and can pause and resume."""

    def __init__(
        self,
        amqp: AmqpUrl,
        topology: Topology,
        queues: tuple[str, ...],
        prefetch: int,
        on_delivery: Callable[[Delivery], Awaitable[None]],
        worker: str,
    ) -> None:
        self.amqp = amqp
        self.topology = topology
        self.queue_names = queues
        self.prefetch = prefetch
        self.on_delivery = on_delivery
        self.worker = worker
        self.connection: AbstractRobustConnection | None = None
        self.queues: list[AbstractQueue] = []
        self.tags: dict[str, str] = {}
        self.garbage = 0
        self.closing = False

    async def connect(self) -> None:
        self.connection = await aio_pika.connect_robust(
            self.amqp.url, client_properties={"connection_name": f"consumer {self.worker}"}
        )
        self.connection.reconnect_callbacks.add(self._on_reconnect)
        self.connection.close_callbacks.add(self._on_close)
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=self.prefetch)
        declared = Declared(channel, self.topology)
        self.queues = [await declared.queue(name) for name in self.queue_names]
        log.info(
            "consumer.broker_connected",
            extra={"amqp": self.amqp.redacted(), "queues": [q.name for q in self.queues]},
        )

    def _on_reconnect(self, *_: object) -> None:
        log.info("consumer.broker_reconnected", extra={"amqp": self.amqp.redacted()})

    def _on_close(self, _connection: object, exc: BaseException | None = None) -> None:
        if exc is not None and not self.closing:
            log.warning("consumer.broker_connection_lost", extra={"error": str(exc)})

    async def start(self) -> None:
        for queue in self.queues:
            if queue.name not in self.tags:
                self.tags[queue.name] = await queue.consume(self._receive)

    async def pause(self) -> None:
        """Stop deliveries from coming (basic.cancel on every queue)."""
        for queue in self.queues:
            tag = self.tags.pop(queue.name, None)
            if tag is not None:
                try:
                    await queue.cancel(tag)
                except Exception as exc:  # a dead channel delivers nothing anyway
                    log.debug("consumer.cancel_failed", extra={"error": str(exc)})

    async def _receive(self, message: AbstractIncomingMessage) -> None:
        job_id = parse_job_id(message.body)
        if job_id is None:
            self.garbage += 1
            log.warning(
                "consumer.garbage_delivery",
                extra={
                    "queue": message.routing_key,
                    "bytes": len(message.body),
                    "body_start": repr(message.body[:64]),
                    "action": "rejected to the dead-letter queue",
                },
            )
            await settle(message, ack=False, requeue=False)
            return
        await self.on_delivery(Delivery(job_id, message))

    async def close(self) -> None:
        self.closing = True
        if self.connection is not None:
            await self.connection.close()
