"""The relay and the consumer run inside the test's event loop, for tests that need
to reach into them (a handler that signals the test, a registry of its own)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from consumers.registry import Registry
from consumers.settings import ConsumerSettings
from consumers.worker import Consumer
from plumbing.config import AmqpUrl, DatabaseUrl
from relay.service import Relay
from relay.settings import RelaySettings
from schema.topology import Topology

FAST_RELAY = {"poll_interval": 0.2, "sweep_interval": 0.2, "rewake_interval": 1.0}


@asynccontextmanager
async def relay_running(
    db: DatabaseUrl, amqp: AmqpUrl, topology: Topology, **overrides: Any
) -> AsyncIterator[Relay]:
    relay = Relay(RelaySettings(db, amqp, topology, **(FAST_RELAY | overrides)))
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    for _ in range(200):
        if relay.publisher.declared is not None or task.done():
            break
        await asyncio.sleep(0.05)
    try:
        yield relay
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


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
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    for _ in range(200):
        if consumer.inbox.tags or task.done():
            break
        await asyncio.sleep(0.05)
    try:
        yield consumer
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


async def chore_rounds(relay: Relay, chore: str, rounds: int, timeout: float = 30) -> None:
    """Wait until the relay has completed ``rounds`` more rounds of a chore
    (sweep, rewake, reconcile, usage, workers)."""
    target = relay.rounds[chore] + rounds
    async with asyncio.timeout(timeout):
        while relay.rounds[chore] < target:
            await asyncio.sleep(0.02)
