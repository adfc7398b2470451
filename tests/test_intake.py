"""What a consumer takes in, and what it costs while it waits: it holds only what it
has room for soon (free slots plus a small prefetch, in job ids) and hands the rest
back for others; a backlog of slow jobs costs it no CPU; the re-waker leaves the
wake-ups it holds alone."""

from __future__ import annotations

import asyncio
import os
import time

import psycopg
import pytest
from sqlalchemy import Engine

from outbox import NewJob
from plumbing.config import AmqpUrl, DatabaseUrl
from schema.topology import Topology
from tests.support.jobs import enqueue_many, until
from tests.support.processes import running, service_env

pytestmark = pytest.mark.timeout(180)

APP = ["--app", "tests.apps.basic"]


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used (from /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_backlog_of_slow_jobs_costs_a_waiting_consumer_no_cpu(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    """Every slot busy and job ids waiting: the consumer sleeps until a slot frees
    up (it used to spin on a zero-second wait, a whole core)."""
    env = service_env(db_url, amqp_url, topology)
    with (
        running("relay", [], env, "relay.started"),
        running("consumer", [*APP, "--concurrency", "2"], env, "consumer.started") as consumer,
    ):
        enqueue_many(engine, [NewJob("sleep", {"seconds": 20}) for _ in range(20)])
        asyncio.run(
            until(
                lambda: (
                    pg.execute("SELECT count(*) FROM jobs WHERE state = 'RUNNING'").fetchone()[0]
                    == 2
                ),
                "both slots busy",
            )
        )
        time.sleep(0.5)  # the claim settles: two running, the rest waiting
        before, started = cpu_seconds(consumer.pid), time.monotonic()
        time.sleep(3)
        used = (cpu_seconds(consumer.pid) - before) / (time.monotonic() - started)
    print(f"consumer CPU while waiting: {used:.1%} of a core")
    assert used < 0.2, f"the waiting consumer used {used:.0%} of a core"
