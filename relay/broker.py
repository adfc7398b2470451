"""The relay's side of RabbitMQ: a robust connection (to the next node of a cluster
when it loses one), and batches of wake-ups published with their confirms awaited
together. A failure that belongs to one queue is raised as QueueFailure, so the
relay can back that queue off alone."""

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

from hybrid_jobs.plumbing.amqp import FailoverConnection, connect_and_set_up
from hybrid_jobs.plumbing.config import AmqpUrl
from hybrid_jobs.schema.topology import (
    MAX_PRIORITY,
    Declared,
    Topology,
    explain_declare_error,
    lacks_delivery_limit,
    warn_no_delivery_limit,
)

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


class QueueFailure(Exception):
    """A failure that belongs to one queue: RabbitMQ refused its wake-ups or its
    declaration, or confirmed none in time, or its decision statement timed out.
    The relay backs that queue off alone; its batch rolled back, so nothing is lost.

    ``reason`` is a short code (for metrics and the dashboard): refused,
    unroutable, declare_refused, unconfirmed, decision_timeout.
    """

    def __init__(self, queue: str, reason: str, detail: str) -> None:
        super().__init__(f"queue {queue!r}: {reason}: {detail}")
        self.queue = queue
        self.reason = reason
        self.detail = detail


class Publisher:
    """Publishes on one robust channel with publisher confirms. Job queues are
    declared on a channel of their own: RabbitMQ answers a refused declaration by
    closing the channel, and that must not take every other queue's publishes in
    flight with it."""

    def __init__(self, amqp: AmqpUrl, topology: Topology) -> None:
        self.amqp = amqp
        self.topology = topology
        self.connection: FailoverConnection | None = None
        self.declared: Declared | None = None
        self._replacing = asyncio.Lock()
        # Channels replaced after a nack, closed once their publishes had their time.
        self._retiring: set[asyncio.Task[None]] = set()
        # Job queues declared since the last (re)connect.
        self.queues: set[str] = set()
        self._declaring: aiormq.abc.AbstractChannel | None = None
        self._declare_lock = asyncio.Lock()
        self.closing = False

    async def connect(self) -> None:
        async def set_up(connection: FailoverConnection) -> None:
            # on_return_raises: an unroutable wake-up fails its publish instead of
            # being dropped by the broker. The exchanges and the dead-letter queue are
            # declared on the publishing channel: aio-pika declares them again after
            # a reconnect.
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            self.declared = Declared(channel, self.topology)
            await self.declared.base()

        connection = await connect_and_set_up(
            self.amqp,
            name=f"relay {socket.gethostname()}:{os.getpid()}",
            set_up=set_up,
            on_reconnect=self._on_reconnect,
            on_close=self._on_close,
        )
        self.connection = connection
        log.info(
            "relay.broker_connected", extra={"node": connection.node, "amqp": self.amqp.redacted()}
        )

    @property
    def connected(self) -> bool:
        return self.connection is not None and self.connection.connected.is_set()

    def _on_reconnect(self, *_: object) -> None:
        # A new connection: its declaring channel is new, and a queue deleted
        # meanwhile must be declared again before the first publish to it.
        self.queues.clear()
        self._declaring = None
        node = self.connection.node if self.connection else None
        log.info("relay.broker_reconnected", extra={"node": node, "amqp": self.amqp.redacted()})

    def _on_close(self, _connection: object, exc: BaseException | None = None) -> None:
        if exc is not None and not self.closing:
            node = self.connection.node if self.connection else None
            log.warning("relay.broker_connection_lost", extra={"node": node, "error": str(exc)})

    async def publish(self, queue: str, wakeups: Sequence[WakeUp], confirm_timeout: float) -> None:
        """Publish every message (all for ``queue``) and wait for all the broker's
        confirms.

        Raises QueueFailure if RabbitMQ refused the queue's declaration, nacked or
        returned a message, or confirmed none within ``confirm_timeout`` seconds
        (declaring included) while connected; ConnectionError or an AMQP connection
        error if the broker went away. Either way the caller rolls the batch back.
        """
        assert self.declared is not None, "connect() first"
        declared = self.declared
        try:
            # All of it under the timeout: with the broker away, declaring the queue
            # or finding the channel waits for a reconnect, inside the caller's
            # transaction, which must not stay open for that.
            async with asyncio.timeout(confirm_timeout):
                await self._declare(queue)
                outcomes = await self._publish(wakeups)
        except TimeoutError:
            if not self.connected:
                raise ConnectionError("RabbitMQ went away during a publish") from None
            raise QueueFailure(
                queue,
                "unconfirmed",
                f"RabbitMQ confirmed none of {len(wakeups)} messages within "
                f"{confirm_timeout:g} s (a quorum queue without a majority of its "
                "replicas online?)",
            ) from None
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if not failed:
            return
        returned = [o for o in failed if isinstance(o, aiormq.exceptions.PublishError)]
        if returned:
            # Returned as unroutable: the queue was deleted behind our back (say, from
            # the management UI). Declare it again before the batch is retried.
            self.queues.discard(queue)
            raise QueueFailure(
                queue,
                "unroutable",
                f"RabbitMQ returned {len(returned)} of {len(wakeups)} messages as "
                "unroutable (the queue or its binding was deleted?); declaring it again",
            ) from returned[0]
        nacked = [o for o in failed if isinstance(o, aiormq.exceptions.DeliveryError)]
        if len(nacked) < len(failed):
            # Not the queue's doing: the channel or the connection failed.
            raise next(o for o in failed if o not in nacked)
        await self._replace_channel(declared, confirm_timeout)
        raise QueueFailure(
            queue,
            "refused",
            f"RabbitMQ refused {len(nacked)} of {len(wakeups)} messages (nacked: a "
            "length limit with overflow reject-publish, a full disk, or an internal "
            "error of the queue)",
        ) from nacked[0]

    async def _replace_channel(self, nacked: Declared, within: float) -> None:
        """A fresh publishing channel after the broker nacked a publish. A channel
        that published to a quorum queue while its leader was being elected (a node
        lost) goes on nacking every publish to it (RabbitMQ 3.10, measured on a
        three-node cluster), while a new channel is confirmed at once. The old one is
        closed only once the publishes still in flight on it have had their time, so
        another queue's batch is not failed by this queue's nack."""
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
        closing = asyncio.create_task(self._close_later(nacked, within))
        self._retiring.add(closing)
        closing.add_done_callback(self._retiring.discard)

    async def _close_later(self, retired: Declared, after: float) -> None:
        await asyncio.sleep(after)
        try:
            await retired.channel.close()
        except Exception as exc:  # gone already
            log.debug("relay.channel_close_failed", extra={"error": str(exc)})

    async def wait_connected(self, within: float) -> None:
        """Return once connected to RabbitMQ, or raise ConnectionError: checked
        before the relay opens a transaction, so an outage keeps none open."""
        assert self.connection is not None, "connect() first"
        if self.connection.connected.is_set():
            return  # (every pass asks: no timer for the usual answer)
        try:
            async with asyncio.timeout(within):
                await self.connection.connected.wait()
        except TimeoutError:
            raise ConnectionError("not connected to RabbitMQ") from None

    async def _declare(self, queue: str) -> None:
        """Declare a job queue and its binding once per connection, on the
        declaring channel; QueueFailure if RabbitMQ refuses."""
        if queue in self.queues:
            return
        async with self._declare_lock:
            if queue in self.queues:
                return
            name = self.topology.queue_name(queue)
            try:
                try:
                    channel = await self._declaring_channel()
                    await channel.queue_declare(
                        name, durable=True, arguments=self.topology.queue_arguments()
                    )
                except aiormq.exceptions.ChannelPreconditionFailed as exc:
                    if not lacks_delivery_limit(exc):
                        raise
                    warn_no_delivery_limit(name)
                    channel = await self._declaring_channel()
                    await channel.queue_declare(name, passive=True)
                await channel.queue_bind(name, self.topology.exchange_name, routing_key=queue)
            except aiormq.exceptions.ChannelClosed as exc:
                # The refusal closed the declaring channel; the next declare opens
                # another.
                self._declaring = None
                raise QueueFailure(
                    queue, "declare_refused", explain_declare_error(exc) or str(exc)
                ) from exc
            self.queues.add(queue)

    async def _declaring_channel(self) -> aiormq.abc.AbstractChannel:
        """A plain channel for declarations, outside aio-pika's robust bookkeeping
        (which would declare a refused queue again at every reconnect, and fail the
        reconnect with it); opened again when a refusal closed it."""
        if self._declaring is None or self._declaring.is_closed:
            assert self.connection is not None, "connect() first"
            await self.connection.ready()
            transport = self.connection.transport
            if transport is None:
                raise ConnectionError("not connected to RabbitMQ")
            self._declaring = await transport.connection.channel(publisher_confirms=False)
        return self._declaring

    async def _publish(self, wakeups: Sequence[WakeUp]) -> list[object]:
        """Each message's confirmation, or the exception it ended in."""
        assert self.declared is not None
        exchange = self.topology.exchange_name
        # The wake-up is the hot path: publish on the channel under aio-pika's robust
        # one (the current one, after any reconnect) instead of building an
        # aio_pika.Message per wake-up, which measured at about a fifth of the relay's
        # CPU. Each message gets its own properties: aiormq matches a returned
        # (unroutable) message to its publish by message_id, the outbox row's id.
        channel = await self.declared.channel.get_underlay_channel()
        persistent = int(aio_pika.DeliveryMode.PERSISTENT)
        sends = [
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
        ]
        if len(sends) == 1:
            # One message, as at low load: awaited here, not wrapped in a task of
            # its own (which costs the start a turn of the event loop), with what
            # gather would answer: its exception as its outcome, and a cancellation
            # of this task (the confirm timeout) raised.
            try:
                return [await sends[0]]
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                return [exc]
            except Exception as exc:
                return [exc]
        return await asyncio.gather(*sends, return_exceptions=True)

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
        for task in self._retiring:
            task.cancel()
        if self.connection is not None:
            await self.connection.close()
