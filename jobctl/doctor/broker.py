"""RabbitMQ: the exchanges and queues the relay and consumers declare
(``schema.topology``), there with the types and arguments this configuration
declares them with.

RabbitMQ says nothing of a queue's arguments to a client; it compares them with a
declaration's and refuses one that differs by closing the channel
(PRECONDITION_FAILED). So each object is first looked up passively (NOT_FOUND: it
is missing) and then declared as the daemons declare it, each step on a channel of
its own. Declaring what exists with the same arguments changes nothing; what is
missing is never declared here. A refused declaration is tried again with the other
queue type's arguments, to tell a queue of another type from other differences.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import aio_pika
import aiormq.exceptions
from aio_pika.abc import AbstractChannel, AbstractConnection

from hybrid_jobs.jobctl.doctor.findings import Finding, Level
from hybrid_jobs.plumbing import diagnose
from hybrid_jobs.plumbing.amqp import CONNECT_TIMEOUT_S, first_answering
from hybrid_jobs.plumbing.config import AmqpUrl
from hybrid_jobs.schema.topology import QueueType, Topology, lacks_delivery_limit

CHECK = "rabbitmq"


async def check(
    amqp: AmqpUrl, topology: Topology, queues: Iterable[str], live: bool
) -> list[Finding]:
    """``queues``: the job queues that should exist (served by a live consumer, or
    with jobs due); ``live``: whether a relay or consumer is live, which declares
    the exchanges and the dead-letter queue at its start."""

    async def one(_index: int, node: AmqpUrl) -> AbstractConnection:
        return await aio_pika.connect(
            node.url,
            timeout=CONNECT_TIMEOUT_S,
            client_properties={"connection_name": "jobctl doctor"},
        )

    try:
        connection = await first_answering(amqp, one)
    except Exception as exc:
        found = diagnose.rabbitmq(exc, amqp)
        hint = f"; {found.hint}" if found.hint else ""
        return [
            Finding(
                CHECK,
                Level.PROBLEM,
                f"cannot reach RabbitMQ at {amqp.address}",
                f"{found.reason}{hint}",
                f"check {amqp.setting} ({amqp.redacted()}) and that RabbitMQ runs",
            )
        ]
    async with connection:
        probe = _Probe(connection, topology, live)
        out = [Finding(CHECK, Level.OK, f"RabbitMQ at {amqp.redacted()} answers")]
        out += await probe.exchange(topology.exchange_name, aio_pika.ExchangeType.DIRECT)
        out += await probe.exchange(
            topology.dead_letter_exchange_name, aio_pika.ExchangeType.FANOUT
        )
        out += await probe.queue(topology.dead_letter_queue_name, dead_letters=True)
        for queue in sorted(set(queues)):
            out += await probe.queue(topology.queue_name(queue))
    return out


class _Probe:
    def __init__(self, connection: AbstractConnection, topology: Topology, live: bool) -> None:
        self.connection = connection
        self.topology = topology
        self.live = live

    async def _try(self, step: Callable[[AbstractChannel], Awaitable[Any]]) -> BaseException | None:
        """``step`` on a fresh channel; what the broker refused it with, or None."""
        channel = await self.connection.channel(publisher_confirms=False)
        try:
            await step(channel)
        except (
            aiormq.exceptions.ChannelNotFoundEntity,
            aiormq.exceptions.ChannelPreconditionFailed,
        ) as exc:
            return exc
        finally:
            if not channel.is_closed:
                with contextlib.suppress(Exception):
                    await channel.close()
        return None

    def _missing(self, what: str, name: str) -> Finding:
        if self.live:
            return Finding(
                CHECK,
                Level.PROBLEM,
                f"{what} {name} is missing",
                "the relay and consumers declare it when they start, so it was deleted "
                "since: wake-ups to it fail or are dropped",
                "restart the relays and consumers (they declare it again); a wake-up "
                "lost meanwhile is sent again by the relay's re-waker",
            )
        return Finding(
            CHECK,
            Level.NOTE,
            f"{what} {name} does not exist yet",
            "the relay and consumers declare it when they start",
        )

    async def exchange(self, name: str, kind: aio_pika.ExchangeType) -> list[Finding]:
        missing = await self._try(lambda ch: ch.declare_exchange(name, passive=True))
        if missing is not None:
            return [self._missing("exchange", name)]
        refused = await self._try(lambda ch: ch.declare_exchange(name, kind, durable=True))
        if refused is None:
            return [Finding(CHECK, Level.OK, f"exchange {name} is {kind.value}, durable")]
        return [
            Finding(
                CHECK,
                Level.PROBLEM,
                f"exchange {name} exists with other settings than the relay declares "
                f"({kind.value}, durable)",
                f"the relay and consumers cannot declare it, so they cannot start; RabbitMQ "
                f"said: {_said(refused)}",
                f"delete the exchange (rabbitmqctl delete_exchange {name}, or the management "
                "UI) and restart the relays and consumers; or set AMQP_PREFIX to a name "
                "of their own",
            )
        ]

    def _arguments(self, queue_type: QueueType, dead_letters: bool) -> dict[str, Any]:
        topology = Topology(self.topology.prefix, queue_type)
        if dead_letters:
            return {"x-queue-type": "quorum"} if queue_type is QueueType.QUORUM else {}
        return topology.queue_arguments()

    async def _declares(self, name: str, arguments: dict[str, Any]) -> BaseException | None:
        return await self._try(lambda ch: ch.declare_queue(name, durable=True, arguments=arguments))

    async def queue(self, name: str, *, dead_letters: bool = False) -> list[Finding]:
        missing = await self._try(lambda ch: ch.declare_queue(name, passive=True))
        if missing is not None:
            return [self._missing("queue", name)]
        wanted = self.topology.queue_type
        refused = await self._declares(name, self._arguments(wanted, dead_letters))
        if refused is None:
            return [Finding(CHECK, Level.OK, f"queue {name} is {wanted}, durable")]
        if lacks_delivery_limit(refused):
            return [
                Finding(
                    CHECK,
                    Level.WARNING,
                    f"quorum queue {name} has no x-delivery-limit",
                    "an earlier release declared it without one: on RabbitMQ 4 it "
                    "dead-letters a wake-up handed back 20 times (the job then waits for "
                    "the relay's re-waker)",
                    "raise its limit with a policy (delivery-limit), or delete the queue "
                    "while it is empty and restart the consumers",
                )
            ]
        other = QueueType.CLASSIC if wanted is QueueType.QUORUM else QueueType.QUORUM
        if await self._declares(name, self._arguments(other, dead_letters)) is None:
            return [
                Finding(
                    CHECK,
                    Level.PROBLEM,
                    f"queue {name} is a {other} queue, but AMQP_QUEUE_TYPE is {wanted}",
                    "the relay and consumers declare it as a "
                    f"{wanted} queue and RabbitMQ refuses that: they cannot start (or, "
                    "running, cannot use it)",
                    f"set AMQP_QUEUE_TYPE={other} for the relays, consumers and jobctl; or, "
                    f"to move to {wanted}: stop the consumers and relays, delete the queue "
                    f"(rabbitmqctl delete_queue {name}; its wake-ups are re-sent from the "
                    "database), and start them again",
                )
            ]
        return [
            Finding(
                CHECK,
                Level.PROBLEM,
                f"queue {name} exists with other arguments than the relay and consumers declare",
                f"they cannot declare it, so they cannot start; RabbitMQ said: {_said(refused)}",
                f"delete the queue (rabbitmqctl delete_queue {name}; its wake-ups are "
                "re-sent from the database) and restart the relays and consumers; or "
                "remove the policy or client that declared it so",
            )
        ]


def _said(exc: BaseException) -> str:
    return diagnose.first_line(exc)
