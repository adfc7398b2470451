"""Several RabbitMQ nodes in AMQP_URL: clients connect to the first that answers,
and when they lose their node, go to the next live one.

Here the nodes are TCP proxies in front of the machine's broker, each of which can
be taken down on its own: fast, and enough to show which address each process
tries. ``tests/test_cluster.py`` does the same on a real three-node cluster with
quorum queues and a node killed with kill -9.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack

import psycopg
import pytest
from sqlalchemy import Engine

from hybrid_jobs.jobctl.check import check, violations
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.chaos.app import EFFECTS_TABLE
from tests.support.api import api_client
from tests.support.jobs import enqueue_many, wait_until_all
from tests.support.processes import Daemon, running, service_env
from tests.support.proxy import TcpProxy

pytestmark = pytest.mark.timeout(180)

SECRET = "hunter2-mq"
CONSUMER = ["--app", "tests.chaos.app", "--lease-seconds", "5", "--heartbeat-seconds", "1"]
RELAY = ["--sweep-interval", "0.5", "--rewake-interval", "3"]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


def node(port: int) -> str:
    # The machine's guest account ignores no password: it is there to be kept secret.
    return f"amqp://guest:guest@127.0.0.1:{port}/"


# ---------------------------------------------------------------- parsing


# ---------------------------------------------------------------- real processes


@pytest.fixture
def env(db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, pg: psycopg.Connection):
    pg.execute(EFFECTS_TABLE)
    return service_env(db_url, amqp_url, topology)


@pytest.fixture
def proxies() -> Iterator[list[TcpProxy]]:
    made = [TcpProxy("127.0.0.1", 5672) for _ in range(2)]
    yield made
    for proxy in made:
        proxy.close()


def effect_jobs(engine: Engine, n: int, tag: str) -> list:
    return enqueue_many(engine, [NewJob("effect", {"key": f"{tag}-{i}"}) for i in range(n)])


def nodes_of(daemon: Daemon, event: str) -> list[str]:
    return [e["node"] for e in daemon.events() if e.get("event") == event]


def wait_for_node(daemon: Daemon, event: str, node: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while node not in nodes_of(daemon, event):
        assert daemon.proc.poll() is None, daemon.text()
        assert time.monotonic() < deadline, f"no {event} on {node}:\n{daemon.text()[-3000:]}"
        time.sleep(0.05)


def test_processes_connect_to_the_first_node_that_answers(
    env: dict[str, str], engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    down = closed_port()
    env["AMQP_URL"] = f"amqp://guest:{SECRET}@127.0.0.1:{down}/,{node(5672)}"
    with (
        running("relay", RELAY, env, "relay.started") as relay,
        running("consumer", CONSUMER, env, "consumer.started") as consumer,
    ):
        ids = effect_jobs(engine, 50, "first")
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(ids)))
    assert nodes_of(relay, "relay.broker_connected") == ["127.0.0.1:5672"]
    assert nodes_of(consumer, "consumer.broker_connected") == ["127.0.0.1:5672"]
    ready = consumer.wait_for_event("consumer.services_ready")
    assert "127.0.0.1:5672 answered first" in ready["rabbitmq"]
    for daemon in (relay, consumer):
        assert SECRET not in daemon.text()
    assert violations(check(db_url.conninfo)) == {}


def test_a_lost_node_sends_every_client_to_the_next_one(
    env: dict[str, str],
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    proxies: list[TcpProxy],
) -> None:
    first, second = proxies
    env["AMQP_URL"] = ",".join(node(p.port) for p in proxies)
    ids = []
    with ExitStack() as stack:
        relay = stack.enter_context(running("relay", RELAY, env, "relay.started"))
        consumers = [
            stack.enter_context(running("consumer", CONSUMER, env, "consumer.started"))
            for _ in range(2)
        ]
        ids += effect_jobs(engine, 100, "before")
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(ids)))
        first.down()  # the node dies: its connections drop, and it refuses new ones
        ids += effect_jobs(engine, 100, "after")
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(ids), timeout=60))
        wait_for_node(relay, "relay.broker_reconnected", f"127.0.0.1:{second.port}")
        for consumer in consumers:
            wait_for_node(consumer, "consumer.broker_reconnected", f"127.0.0.1:{second.port}")
        # The first node returns and the second dies: back round the list.
        first.up()
        second.down()
        ids += effect_jobs(engine, 100, "again")
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(ids), timeout=60))
        for daemon in (relay, *consumers):
            reconnected = "relay" if daemon is relay else "consumer"
            wait_for_node(daemon, f"{reconnected}.broker_reconnected", f"127.0.0.1:{first.port}")
    for daemon in (relay, *consumers):
        name = daemon.command
        assert nodes_of(daemon, f"{name}.broker_connected") == [f"127.0.0.1:{first.port}"]
        lost = nodes_of(daemon, f"{name}.broker_connection_lost")
        assert f"127.0.0.1:{first.port}" in lost and f"127.0.0.1:{second.port}" in lost
    report = check(db_url.conninfo)
    assert violations(report) == {}, report
    assert report["by_state"] == {"SUCCEEDED": 300}
    assert report["effects_applied_more_than_once"] == 0


async def test_readiness_is_ready_while_any_node_answers(db_url: DatabaseUrl) -> None:
    down = closed_port()
    either = AmqpUrl.parse(f"{node(down)},{node(5672)}")
    async with api_client(db_url, either) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 200, ready.text
    other = closed_port()
    neither = AmqpUrl.parse(f"{node(down)},{node(other)}")
    async with api_client(db_url, neither) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 503
    rabbitmq = {c["service"]: c for c in ready.json()["checks"]}["rabbitmq"]
    assert rabbitmq["address"] == f"127.0.0.1:{down},127.0.0.1:{other}"
    assert rabbitmq["detail"] == "no node answered (connection refused)"
