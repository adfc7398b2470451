"""The relay and the consumer run inside the test's event loop, for tests that need
to reach into them (a handler that signals the test, a registry of its own)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.consumers.settings import ConsumerSettings
from hybrid_jobs.consumers.worker import Consumer
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.relay.service import Relay
from hybrid_jobs.relay.settings import RelaySettings
from hybrid_jobs.schema.topology import Topology

FAST_RELAY = {"poll_interval": 0.2, "sweep_interval": 0.2, "rewake_interval": 1.0}


@asynccontextmanager
async def _serving(
    run: Callable[[asyncio.Event], Awaitable[None]],
    ready: Callable[[], bool],
    stop_timeout: float,
) -> AsyncIterator[None]:
    """Run a daemon's ``run(stop)`` as a task; wait (up to 10 s) until it is ready
    or has ended, and set ``stop`` and wait for it afterwards."""
    stop = asyncio.Event()
    task = asyncio.create_task(run(stop))
    for _ in range(200):
        if ready() or task.done():
            break
        await asyncio.sleep(0.05)
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, stop_timeout)


@asynccontextmanager
async def relay_running(
    db: DatabaseUrl, amqp: AmqpUrl, topology: Topology, **overrides: Any
) -> AsyncIterator[Relay]:
    relay = Relay(RelaySettings(db, amqp, topology, **(FAST_RELAY | overrides)))
    async with _serving(relay.run, lambda: relay.publisher.declared is not None, 30):
        yield relay


@asynccontextmanager
async def consumer_running(
    db: DatabaseUrl,
    amqp: AmqpUrl,
    topology: Topology,
    registry: Registry,
    **overrides: Any,
) -> AsyncIterator[Consumer]:
    settings = ConsumerSettings(
        db,
        amqp,
        queues=tuple(overrides.pop("queues", registry.queues())),
        topology=topology,
        **({"stats_interval": 5.0} | overrides),
    )
    consumer = Consumer(settings, registry)
    async with _serving(consumer.run, lambda: bool(consumer.inbox.tags), 60):
        yield consumer


@asynccontextmanager
async def both_running(
    db: DatabaseUrl, amqp: AmqpUrl, topology: Topology, registry: Registry, **overrides: Any
) -> AsyncIterator[tuple[Relay, Consumer]]:
    """A relay as :func:`relay_running` starts it, then a consumer of ``registry``
    (``overrides`` are the consumer's); stopped in the reverse order."""
    async with (
        relay_running(db, amqp, topology) as relay,
        consumer_running(db, amqp, topology, registry, **overrides) as consumer,
    ):
        yield relay, consumer


async def chore_rounds(relay: Relay, chore: str, rounds: int, timeout: float = 30) -> None:
    """Wait until the relay has completed ``rounds`` more rounds of a chore
    (sweep, rewake, reconcile, usage, workers)."""
    target = relay.rounds[chore] + rounds
    async with asyncio.timeout(timeout):
        while relay.rounds[chore] < target:
            await asyncio.sleep(0.02)
