"""Broker topology, declared idempotently by the relay and the consumer alike.

::

    producer ─► relay ─► exchange "<prefix>" (direct, durable)
                            │ routing key = job queue name
                            ▼
                         queue "<prefix>.<queue>" (durable; classic or quorum)
                            │ rejected without requeue (a garbage body)
                            ▼
                         exchange "<prefix>.dlx" (fanout) ─► queue "<prefix>.dead"

Both sides declare a queue before they first use it, so a wake-up never goes to a
queue that does not exist yet; the relay also publishes with ``mandatory`` so an
unroutable message is an error, not a silent drop. Declaring with arguments that
differ from an existing queue's (say, switching to quorum) is refused by RabbitMQ;
:func:`explain_declare_error` turns that refusal into an instruction.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aio_pika
import aiormq.exceptions
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue

# Wake-ups carry the job's priority, clamped to this range (RabbitMQ's advice is to
# keep priority queues to a handful of levels).
MAX_PRIORITY = 9


class QueueType(StrEnum):
    CLASSIC = "classic"
    QUORUM = "quorum"


@dataclass(frozen=True)
class Topology:
    prefix: str = "jobs"
    queue_type: QueueType = QueueType.CLASSIC

    @property
    def exchange_name(self) -> str:
        return self.prefix

    @property
    def dead_letter_exchange_name(self) -> str:
        return f"{self.prefix}.dlx"

    @property
    def dead_letter_queue_name(self) -> str:
        return f"{self.prefix}.dead"

    def queue_name(self, queue: str) -> str:
        return f"{self.prefix}.{queue}"

    def queue_arguments(self) -> dict[str, Any]:
        args: dict[str, Any] = {"x-dead-letter-exchange": self.dead_letter_exchange_name}
        if self.queue_type is QueueType.QUORUM:
            args["x-queue-type"] = "quorum"
        else:
            # Quorum queues in RabbitMQ 3.x ignore priorities; classic ones honour them.
            args["x-max-priority"] = MAX_PRIORITY
        return args


class Declared:
    """The exchange and queues one channel has declared, declared once each.

    On a robust channel aio-pika re-declares all of them after a reconnect.
    """

    def __init__(self, channel: AbstractChannel, topology: Topology) -> None:
        self.channel = channel
        self.topology = topology
        self.exchange: AbstractExchange | None = None
        self.queues: dict[str, AbstractQueue] = {}

    async def base(self) -> AbstractExchange:
        if self.exchange is None:
            t = self.topology
            dlx = await self.channel.declare_exchange(
                t.dead_letter_exchange_name, aio_pika.ExchangeType.FANOUT, durable=True
            )
            dead = await self.channel.declare_queue(
                t.dead_letter_queue_name, durable=True, arguments=_dead_letter_arguments(t)
            )
            await dead.bind(dlx, routing_key="")
            self.exchange = await self.channel.declare_exchange(
                t.exchange_name, aio_pika.ExchangeType.DIRECT, durable=True
            )
        return self.exchange

    async def queue(self, queue: str) -> AbstractQueue:
        declared = self.queues.get(queue)
        if declared is None:
            exchange = await self.base()
            declared = await self.channel.declare_queue(
                self.topology.queue_name(queue),
                durable=True,
                arguments=self.topology.queue_arguments(),
            )
            await declared.bind(exchange, routing_key=queue)
            self.queues[queue] = declared
        return declared

    def forget_queues(self) -> None:
        self.queues.clear()


def _dead_letter_arguments(topology: Topology) -> dict[str, Any]:
    if topology.queue_type is QueueType.QUORUM:
        return {"x-queue-type": "quorum"}
    return {}


def explain_declare_error(exc: BaseException) -> str | None:
    """A one-line explanation for a refused declaration, or None if it is not one."""
    if isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
        return (
            "RabbitMQ refused to declare a queue with different arguments than the existing "
            "one (queue type or dead-letter settings changed?). Delete the old queue, or keep "
            f"the previous AMQP_QUEUE_TYPE. Broker said: {exc}"
        )
    return None
