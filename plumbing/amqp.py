"""Connections to RabbitMQ that know every node of a cluster.

aio-pika's robust connection reconnects to the URL it was made with, so a client
whose node dies would knock on that node for ever. ``FailoverConnection`` is that
robust connection (channels, queues and consumers restored after a reconnect)
holding every node's URL: aio-pika calls ``_on_connection_close`` both when an open
connection is lost and when a connection attempt fails (``UnderlayConnection.connect``
reports the failure through the same callback before raising it), and reads
``self.url`` afresh at every attempt (``Connection.connect``). So turning to the
next node there makes every reconnect attempt go to the node after the one that
just failed. While a round of the nodes is not yet exhausted the next attempt
comes at once; after a full round of failures, aio-pika's ``reconnect_interval``
paces the next round.

The first connection goes to the first node that answers, in the order given.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aio_pika import RobustConnection
from yarl import URL

from hybrid_jobs.plumbing.config import AmqpUrl

log = logging.getLogger(__name__)

T = TypeVar("T")

# Between attempts within a round of the nodes: long enough not to spin on a node
# that refuses at once, short enough that a client is on a live node within a second.
NEXT_NODE_PAUSE_S = 0.2
# A host that drops packets would otherwise hold each attempt for the kernel's TCP
# timeout (minutes).
CONNECT_TIMEOUT_S = 10.0


def node_address(url: URL | str) -> str:
    """``host:port`` of one node: what logs say about where a client is."""
    parsed = URL(url)
    return f"{parsed.host}:{parsed.port or (5671 if parsed.scheme == 'amqps' else 5672)}"


class NoNodeAnswered(ConnectionError):
    """No node of a multi-node AMQP_URL answered; ``failures`` says why each did not."""

    def __init__(self, failures: Sequence[tuple[AmqpUrl, BaseException]]) -> None:
        self.failures = tuple(failures)
        super().__init__(
            "no RabbitMQ node answered: "
            + "; ".join(f"{node.address}: {type(exc).__name__}" for node, exc in self.failures)
        )


async def first_answering(amqp: AmqpUrl, attempt: Callable[[int, AmqpUrl], Awaitable[T]]) -> T:
    """``attempt(index, node)`` on each node in turn; the first that succeeds. With
    one node its own error is raised; with several, ``NoNodeAnswered`` holding each
    node's."""
    nodes = amqp.nodes
    failures: list[tuple[AmqpUrl, BaseException]] = []
    for index, node in enumerate(nodes):
        try:
            return await attempt(index, node)
        except Exception as exc:
            if len(nodes) == 1:
                raise
            failures.append((node, exc))
    raise NoNodeAnswered(failures)


class FailoverConnection(RobustConnection):
    """A robust connection that reconnects to the next node of its list."""

    def __init__(self, nodes: Sequence[URL], start: int = 0, **kwargs: Any) -> None:
        super().__init__(nodes[start], **kwargs)
        self.nodes = tuple(nodes)
        self.node_index = start
        self.round_interval = self.reconnect_interval
        self.missed = 0  # attempts failed (or connections lost) since the last success

    @property
    def node(self) -> str:
        """The node this connection is on, or tries next: ``host:port``."""
        return node_address(self.url)

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        # The close callbacks (our "connection lost" line) still see the node lost.
        await super()._on_connection_close(closing)
        if self._close_called or self.is_closed:
            return
        self.missed += 1
        if len(self.nodes) > 1:
            self.node_index = (self.node_index + 1) % len(self.nodes)
            self.url = self.nodes[self.node_index]
        # Read by aio-pika's reconnect loop before its next attempt.
        self.reconnect_interval = (
            NEXT_NODE_PAUSE_S if self.missed % len(self.nodes) else self.round_interval
        )

    async def _on_connected(self) -> None:
        self.missed = 0
        # aio-pika pauses for this long after connecting too: a loss right after a
        # failover should not wait a whole round's interval.
        self.reconnect_interval = NEXT_NODE_PAUSE_S
        await super()._on_connected()


async def connect_failover(amqp: AmqpUrl, *, name: str) -> FailoverConnection:
    """A robust connection to the first node that answers, named ``name`` in
    RabbitMQ's connection list; raises as ``first_answering`` does."""
    urls = [URL(url) for url in amqp.urls]

    async def one(index: int, _node: AmqpUrl) -> FailoverConnection:
        connection = FailoverConnection(
            urls, start=index, client_properties={"connection_name": name}
        )
        try:
            # Also the limit of each reconnect attempt later on.
            await connection.connect(timeout=CONNECT_TIMEOUT_S)
        except BaseException:
            await connection.close()
            raise
        return connection

    return await first_answering(amqp, one)


async def connect_and_set_up(
    amqp: AmqpUrl,
    *,
    name: str,
    set_up: Callable[[FailoverConnection], Awaitable[None]],
    on_reconnect: Callable[..., Any],
    on_close: Callable[..., Any],
) -> FailoverConnection:
    """:func:`connect_failover`, then ``set_up`` on the connection (its channels and
    declarations), then the caller's callbacks. A set-up that fails closes the
    connection before raising: retried from scratch, a robust connection left open
    would go on reconnecting beside its successor."""
    connection = await connect_failover(amqp, name=name)
    try:
        await set_up(connection)
    except BaseException:
        await connection.close()
        raise
    connection.reconnect_callbacks.add(on_reconnect)
    connection.close_callbacks.add(on_close)
    return connection
