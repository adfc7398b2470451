"""The consumer's side of RabbitMQ: deliveries in, each naming one or more jobs.

A message body is text, one job id a line (the relay packs several into one message
when it has a backlog; one id alone at low load). Each id is a wake-up of its own.
A message is settled once every id in it has been claimed or explained: acked, or
handed back to the queue if the consumer declined one it could not start. A body
that is not a list of job ids is rejected without requeue, which routes it to the
dead-letter queue, and logged; nothing else about it is trusted.

Every message is settled on its own (no ``multiple`` flag): ids of different
messages are claimed out of order, so "everything up to this tag" is never known
to be safe.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from hybrid_jobs.plumbing.amqp import FailoverConnection, connect_and_set_up
from hybrid_jobs.plumbing.config import AmqpUrl
from hybrid_jobs.schema.topology import Declared, Topology

log = logging.getLogger("consumer")

# The most ids one message may carry, and so the longest body worth decoding: 36
# characters and a newline each ("urn:uuid:" prefixes are accepted too).
MAX_IDS_PER_MESSAGE = 1000
MAX_BODY_BYTES = MAX_IDS_PER_MESSAGE * 46


def parse_job_ids(body: bytes) -> list[uuid.UUID] | None:
    """The job ids a body names, in order; None if it is not such a list."""
    if not body or len(body) > MAX_BODY_BYTES:
        return None
    try:
        lines = body.decode("ascii").split()
    except UnicodeDecodeError:
        return None
    if not lines or len(lines) > MAX_IDS_PER_MESSAGE:
        return None
    try:
        return [uuid.UUID(line) for line in lines]
    except ValueError:
        return None


@dataclass(eq=False)
class Delivery:
    """One message and the ids in it still waiting to be claimed or explained."""

    message: AbstractIncomingMessage
    job_ids: list[uuid.UUID]
    open: set[uuid.UUID] = field(default_factory=set)
    # Some id was declined (this worker could not start it): give the message back
    # rather than ack it, so the wake-up reaches someone who can.
    declined: bool = False
    settled: bool = False

    def __post_init__(self) -> None:
        self.open = set(self.job_ids)


async def settle(delivery: Delivery, *, requeue_if_declined: bool = True) -> bool:
    """Ack the message, or nack it back to the queue if an id was declined; False if
    the channel it came on is gone (the broker requeued it when the channel closed)."""
    if delivery.settled:
        return True
    delivery.settled = True
    try:
        if delivery.declined and requeue_if_declined:
            await delivery.message.nack(requeue=True)
        else:
            await delivery.message.ack()
    except Exception as exc:
        log.debug("consumer.settle_failed", extra={"error": str(exc)})
        return False
    return True


async def give_back(delivery: Delivery) -> None:
    """Return an unsettled message to the queue, whatever became of its ids: a
    redelivery of an id that was claimed meanwhile is explained as running."""
    if delivery.settled:
        return
    delivery.settled = True
    try:
        await delivery.message.nack(requeue=True)
    except Exception as exc:  # a dead channel returned it already
        log.debug("consumer.nack_failed", extra={"error": str(exc)})


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
        self.connection: FailoverConnection | None = None
        self.queues: list[AbstractQueue] = []
        self.tags: dict[str, str] = {}
        self.garbage = 0
        self.closing = False

    async def connect(self) -> None:
        async def set_up(connection: FailoverConnection) -> None:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=self.prefetch)
            declared = Declared(channel, self.topology)
            self.queues = [await declared.queue(name) for name in self.queue_names]

        connection = await connect_and_set_up(
            self.amqp,
            name=f"consumer {self.worker}",
            set_up=set_up,
            on_reconnect=self._on_reconnect,
            on_close=self._on_close,
        )
        self.connection = connection
        log.info(
            "consumer.broker_connected",
            extra={
                "node": connection.node,
                "amqp": self.amqp.redacted(),
                "queues": [q.name for q in self.queues],
            },
        )

    def _on_reconnect(self, *_: object) -> None:
        node = self.connection.node if self.connection else None
        log.info("consumer.broker_reconnected", extra={"node": node, "amqp": self.amqp.redacted()})

    def _on_close(self, _connection: object, exc: BaseException | None = None) -> None:
        if exc is not None and not self.closing:
            node = self.connection.node if self.connection else None
            log.warning("consumer.broker_connection_lost", extra={"node": node, "error": str(exc)})

    @property
    def consuming(self) -> bool:
        return bool(self.tags)

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
        job_ids = parse_job_ids(message.body)
        if job_ids is None:
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
            try:
                await message.reject(requeue=False)
            except Exception as exc:
                log.debug("consumer.reject_failed", extra={"error": str(exc)})
            return
        if log.isEnabledFor(logging.DEBUG):  # a trace of each wake-up, for latency work
            log.debug(
                "consumer.delivered",
                extra={"t": time.time(), "job_ids": [str(i) for i in job_ids]},
            )
        await self.on_delivery(Delivery(message, job_ids))

    async def close(self) -> None:
        self.closing = True
        if self.connection is not None:
            await self.connection.close()
