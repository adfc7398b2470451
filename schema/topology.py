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

Quorum queues count how often a message was handed back and dead-letter it past a
delivery limit: none by default in RabbitMQ 3.x, 20 since 4.0. A wake-up is never
poison (the table decides what it means, and a consumer hands one back only because
it cannot start the job now), so job queues are declared with a limit no wake-up
reaches. Not -1, which 4.x reads as "no limit" but 3.x as 0: the first hand-back
dead-letters (measured on 3.10).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import aio_pika
import aiormq.exceptions
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue

from hybrid_jobs import defaults

log = logging.getLogger("topology")

# Wake-ups carry the job's priority, clamped to this range (RabbitMQ's advice is to
# keep priority queues to a handful of levels).
MAX_PRIORITY = 9

# A quorum job queue's x-delivery-limit: hand-backs a wake-up may take before the
# queue dead-letters it. Out of reach on purpose (see above), and valid on 3.x and
# 4.x alike.
QUORUM_DELIVERY_LIMIT = 1_000_000_000


class QueueType(StrEnum):
    CLASSIC = "classic"
    QUORUM = "quorum"


DEFAULT_QUEUE_TYPE: Final = QueueType(defaults.AMQP_QUEUE_TYPE)


@dataclass(frozen=True)
class Topology:
    prefix: str = defaults.AMQP_PREFIX
    queue_type: QueueType = DEFAULT_QUEUE_TYPE

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
            args["x-delivery-limit"] = QUORUM_DELIVERY_LIMIT
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
            name = self.topology.queue_name(queue)
            arguments = self.topology.queue_arguments()
            if await self._probe(name, arguments):
                declared = await self.channel.declare_queue(name, durable=True, arguments=arguments)
            else:
                # A quorum queue declared before job queues had a delivery limit:
                # use it as it is, and say how to fix it.
                warn_no_delivery_limit(name)
                declared = await self.channel.declare_queue(name, passive=True)
            await declared.bind(exchange, routing_key=queue)
            self.queues[queue] = declared
        return declared

    async def _probe(self, name: str, arguments: dict[str, Any]) -> bool:
        """Declare the queue on a channel of its own first: RabbitMQ answers a
        refused declaration by closing the channel, and this one (its consumers,
        its publishes) must not go with it. False if the queue exists and was
        refused only for lacking the delivery limit; any other refusal raises."""
        underlay = await self.channel.get_underlay_channel()
        probe = await underlay.connection.channel(publisher_confirms=False)
        try:
            await probe.queue_declare(name, durable=True, arguments=arguments)
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            if lacks_delivery_limit(exc):
                return False
            raise
        finally:
            if not probe.is_closed:
                await probe.close()
        return True


def _dead_letter_arguments(topology: Topology) -> dict[str, Any]:
    if topology.queue_type is QueueType.QUORUM:
        return {"x-queue-type": "quorum"}
    return {}


def lacks_delivery_limit(exc: BaseException) -> bool:
    """Whether a refused declaration was refused only for the delivery limit: the
    queue exists, as a quorum queue declared without one (by an earlier release)."""
    return isinstance(
        exc, aiormq.exceptions.ChannelPreconditionFailed
    ) and "inequivalent arg 'x-delivery-limit'" in str(exc)


def warn_no_delivery_limit(queue_name: str) -> None:
    log.warning(
        "topology.queue_without_delivery_limit",
        extra={
            "queue": queue_name,
            "detail": "this quorum queue was declared by an earlier release, without "
            "x-delivery-limit: on RabbitMQ 4.x it dead-letters a wake-up handed back 20 "
            "times (the job then waits for the re-waker). Raise its limit with a policy "
            "(README, Past one machine), or delete the queue while it is empty",
        },
    )


def explain_declare_error(exc: BaseException) -> str | None:
    """A one-line explanation for a refused declaration, or None if it is not one."""
    if isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
        return (
            "RabbitMQ refused to declare a queue with different arguments than the existing "
            "one (queue type or dead-letter settings changed?). Delete the old queue, or keep "
            f"the previous AMQP_QUEUE_TYPE. Broker said: {exc}"
        )
    return None
