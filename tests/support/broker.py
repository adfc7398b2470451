"""Reading wake-ups back from RabbitMQ in tests, and a RabbitMQ account of their own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import aio_pika
import pytest

from harness.broker import delete_topology, purge, queue_depth
from hybrid_jobs.schema.topology import Declared, Topology

__all__ = [
    "close_connections_of",
    "collect",
    "collect_ids",
    "delete_topology",
    "publish_raw",
    "purge",
    "queue_depth",
    "queue_policy",
    "rabbitmq_account",
]


async def collect(
    amqp_url: str,
    topology: Topology,
    queue: str,
    expected: int,
    timeout: float = 30.0,
    settle: float = 0.3,
    *,
    dead_letters: bool = False,
    ids: bool = False,
) -> list[str]:
    """Consume and ack messages from one queue (or the dead-letter queue) until
    ``expected`` arrived and nothing more came for ``settle`` seconds (so duplicates
    would be counted), or timeout; their bodies, or with ``ids`` the job ids they
    name (a message may name several, one a line)."""
    connection = await aio_pika.connect(amqp_url)
    found: list[str] = []
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=1000)
        declared = Declared(channel, topology)
        if dead_letters:
            await declared.base()
            q = await channel.get_queue(topology.dead_letter_queue_name)
        else:
            q = await declared.queue(queue)
        deadline = time.monotonic() + timeout
        async with q.iterator() as it:
            while time.monotonic() < deadline:
                wait = settle if len(found) >= expected else deadline - time.monotonic()
                try:
                    message = await asyncio.wait_for(it.__anext__(), max(wait, 0.01))
                except TimeoutError:
                    if len(found) >= expected:
                        break
                    continue
                body = message.body.decode(errors="replace")
                found += body.split() if ids else [body]
                await message.ack()
    return found


async def collect_ids(
    amqp_url: str, topology: Topology, queue: str, expected: int, **options: float
) -> list[str]:
    """:func:`collect` counting job ids instead of messages."""
    return await collect(amqp_url, topology, queue, expected, ids=True, **options)  # type: ignore[arg-type]


async def publish_raw(amqp_url: str, topology: Topology, queue: str, body: bytes) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        declared = Declared(channel, topology)
        await declared.queue(queue)
        exchange = await declared.base()
        await exchange.publish(aio_pika.Message(body), routing_key=queue)


def close_connections_of(pids: list[int], reason: str) -> int:
    """Have RabbitMQ close every connection of these processes (named ``... host:pid``
    by the daemons) and no other: the suite's other tests share the broker, and
    ``close_all_connections`` would fault them too. How many it closed."""
    listing = subprocess.run(
        ["rabbitmqctl", "-q", "--no-table-headers", "list_connections", "pid", "client_properties"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    # "relay host:pid" and "consumer host:pid:token": the pid is the field after the host.
    host = re.escape(socket.gethostname())
    alternatives = "|".join(map(str, pids))
    ours = re.compile(
        r'\{"connection_name","\w+ ' + host + ":(?:" + alternatives + r')(?::[0-9a-f]+)?"\}'
    )
    closed = 0
    for line in listing.splitlines():
        connection, _, properties = line.partition("\t")
        if ours.search(properties):
            subprocess.run(
                ["rabbitmqctl", "-q", "close_connection", connection, reason],
                check=True,
                capture_output=True,
                timeout=60,
            )
            closed += 1
    return closed


@contextlib.contextmanager
def rabbitmq_account(prefix: str = "hj_t") -> Iterator[tuple[str, str, str]]:
    """A RabbitMQ user with a password and a virtual host of its own, with full
    permissions there and none elsewhere; (user, password, vhost). Deleted afterwards
    (deleting the vhost deletes whatever was declared in it)."""
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("needs rabbitmqctl to make a RabbitMQ user")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    password = "mq-account-s3cret"

    def ctl(*args: str) -> None:
        subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True)

    ctl("add_vhost", name)
    try:
        ctl("add_user", name, password)
        try:
            ctl("set_permissions", "-p", name, name, ".*", ".*", ".*")
            yield name, password, name
        finally:
            ctl("delete_user", name)
    finally:
        ctl("delete_vhost", name)


@contextlib.contextmanager
def queue_policy(
    topology: Topology, queue: str, definition: dict[str, Any]
) -> Iterator[Callable[[], None]]:
    """A RabbitMQ policy on one of this test's queues and no other (its pattern is
    that queue's full name, anchored), removed afterwards; yields the remover, for
    a test that lifts it early."""
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("needs rabbitmqctl to set a policy")
    name = f"hj-test-{topology.prefix}-{queue}"
    pattern = "^" + re.escape(topology.queue_name(queue)) + "$"
    removed = False

    def remove() -> None:
        nonlocal removed
        if not removed:
            subprocess.run(["rabbitmqctl", "-q", "clear_policy", name], check=True)
            removed = True

    options = ["--apply-to", "queues", "--priority", "100"]
    subprocess.run(
        ["rabbitmqctl", "-q", "set_policy", *options, name, pattern, json.dumps(definition)],
        check=True,
        capture_output=True,
    )
    try:
        yield remove
    finally:
        remove()
