"""One queue that fails never slows the others: real relay and consumer processes,
and real failures of one queue only (a RabbitMQ policy that refuses its publishes,
a queue declared with other arguments, a decision that waits on a lock). The
failing queue is backed off alone and says why (log, relays.failing_queues), its
wake-ups wait in the outbox, and once the cause is gone its jobs run."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from typing import Any

import aio_pika
import psycopg
import pytest
from sqlalchemy import Engine

from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.api import api_client
from tests.support.broker import queue_depth, queue_policy
from tests.support.jobs import enqueue_many, until
from tests.support.processes import BIN, Daemon, running

pytestmark = pytest.mark.timeout(240)

# Heartbeats every 0.5 s: relays.failing_queues follows within a second.
RELAY = ["--poll-interval", "0.5", "--queue-backoff-cap", "2", "--heartbeat-interval", "0.5"]
CONSUMER = ["--app", "tests.apps.queues"]
REFUSE = {"max-length": 0, "overflow": "reject-publish"}


def states(pg: psycopg.Connection, queue: str) -> dict[str, int]:
    rows = pg.execute("SELECT state, count(*) FROM jobs WHERE queue = %s GROUP BY state", [queue])
    return dict(rows.fetchall())


def unsent(pg: psycopg.Connection, queue: str) -> int:
    row = pg.execute(
        "SELECT count(*) FROM outbox WHERE queue = %s AND sent_at IS NULL", [queue]
    ).fetchone()
    return int(row[0]) if row else 0


def failing(pg: psycopg.Connection) -> dict[str, Any]:
    rows = pg.execute("SELECT failing_queues FROM relays").fetchall()
    found: dict[str, Any] = {}
    for (queues,) in rows:
        found.update(queues)
    return found


def events(daemon: Daemon, name: str) -> list[dict[str, Any]]:
    return [e for e in daemon.events() if e.get("event") == name]


def trickle(engine: Engine, job_type: str, queue: str, n: int) -> list[Any]:
    """n jobs, one transaction each: producers writing as they go."""
    ids = []
    for i in range(n):
        ids += enqueue_many(engine, [NewJob(job_type, {"i": i}, queue=queue)])
        time.sleep(0.02)
    return ids


def wait(check: Any, what: str, timeout: float = 30) -> Any:
    return asyncio.run(until(check, what, timeout))


def jobctl_stats(db: DatabaseUrl, *flags: str) -> str:
    done = subprocess.run(
        [str(BIN / "jobctl"), "stats", "--database-url", db.conninfo, *flags],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_a_queue_rabbitmq_refuses_is_backed_off_alone_and_loses_nothing(
    env: dict[str, str],
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    topology: Topology,
) -> None:
    """A policy on one queue (max-length 0, reject-publish) makes RabbitMQ nack
    every publish to it. Before, the relay's whole pass failed and it backed off
    for every queue (the healthy queue's p99 went from 9 ms to 13 s)."""
    with (
        queue_policy(topology, "refused", REFUSE) as lift,
        running("relay", RELAY, env, "relay.started") as relay,
        running("consumer", CONSUMER, env, "consumer.started"),
    ):
        for _ in range(4):
            trickle(engine, "refused_noop", "refused", 5)
            trickle(engine, "healthy_noop", "healthy", 10)
        wait(lambda: states(pg, "healthy") == {"SUCCEEDED": 40}, "every healthy job ran")
        assert not events(relay, "relay.drain_failed"), "the relay never backed off as a whole"
        (first, *_) = events(relay, "relay.queue_publish_failing")
        assert (first["queue"], first["reason"]) == ("refused", "refused")
        assert "nacked" in first["detail"]
        assert states(pg, "refused") == {"QUEUED": 20}, "none ran, none lost"
        assert unsent(pg, "refused") == 20, "their wake-ups wait in the outbox"
        wait(lambda: "refused" in failing(pg), "the relay's row says which queue fails")
        assert failing(pg)["refused"]["reason"] == "refused"
        assert "publish failing: refused (refused, 1 relay(s), since" in jobctl_stats(db_url)
        lift()
        wait(lambda: states(pg, "refused") == {"SUCCEEDED": 20}, "the refused queue's jobs ran")
        wait(lambda: failing(pg) == {}, "and the relay's row no longer lists it")
        # The end is said in the relay's output, which this test may read after the
        # row has changed: "recovered" at the queue's next good publish, or
        # "failing_ended" if a pass found none of its wake-ups due first.
        ended = wait(
            lambda: (
                events(relay, "relay.queue_publish_recovered")
                + events(relay, "relay.queue_publish_failing_ended")
            ),
            "the relay to say the queue's failure ended",
        )
        assert [e["queue"] for e in ended] == ["refused"]
    assert not events(relay, "relay.drain_failed")


def test_a_queue_whose_declaration_is_refused_fails_alone(
    env: dict[str, str],
    engine: Engine,
    pg: psycopg.Connection,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    """A queue that exists with other arguments: RabbitMQ refuses the relay's
    declaration (PRECONDITION_FAILED) and closes the channel it was made on. The
    declaration has a channel of its own, so the publishes in flight on the
    publishing channel carry on; once the queue is fixed, its wake-ups go out."""

    async def declare_mismatched() -> None:
        connection = await aio_pika.connect(amqp_url.url)
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(
                topology.queue_name("mismatch"), durable=True, arguments={"x-max-priority": 2}
            )

    async def delete_mismatched() -> None:
        connection = await aio_pika.connect(amqp_url.url)
        async with connection:
            channel = await connection.channel()
            await channel.queue_delete(topology.queue_name("mismatch"))

    asyncio.run(declare_mismatched())
    with (
        running("relay", RELAY, env, "relay.started") as relay,
        running("consumer", [*CONSUMER, "--queue", "healthy"], env, "consumer.started"),
    ):
        for _ in range(3):
            enqueue_many(engine, [NewJob("noop", {}, queue="mismatch") for _ in range(5)])
            trickle(engine, "healthy_noop", "healthy", 10)
        wait(lambda: states(pg, "healthy") == {"SUCCEEDED": 30}, "every healthy job ran")
        assert not events(relay, "relay.drain_failed"), "the relay never backed off as a whole"
        (first, *_) = events(relay, "relay.queue_publish_failing")
        assert (first["queue"], first["reason"]) == ("mismatch", "declare_refused")
        assert "PRECONDITION_FAILED" in first["detail"]
        assert unsent(pg, "mismatch") == 15
        asyncio.run(delete_mismatched())
        wait(lambda: unsent(pg, "mismatch") == 0, "declared right, its wake-ups went out")
        assert asyncio.run(queue_depth(amqp_url.url, topology, "mismatch")) >= 1
    assert not events(relay, "relay.drain_failed")


def test_a_queue_whose_decision_times_out_fails_alone(
    env: dict[str, str], engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """Another transaction holds a row the queue's decision must write (a wake-up
    in flight whose job has ended, which every pass settles first), past the relay's
    lock timeout: that queue's decision fails, every other queue's goes on; once
    the lock is gone, its jobs run."""
    pg.execute(
        "INSERT INTO jobs (job_id, job_type, queue, state, finished_at)"
        " VALUES (gen_random_uuid(), 'stuck_noop', 'stuck', 'SUCCEEDED', now())"
    )
    pg.execute(
        "INSERT INTO outbox (job_id, queue, tenant, available_at, sent_at)"
        " SELECT job_id, queue, '', now(), now() FROM jobs WHERE queue = 'stuck'"
    )
    with psycopg.connect(db_url.conninfo) as holder:
        # held before the relay starts, whose sweep would settle the row first
        holder.execute("SELECT 1 FROM outbox WHERE queue = 'stuck' FOR UPDATE")
        with (
            running("relay", RELAY, env, "relay.started") as relay,
            running("consumer", CONSUMER, env, "consumer.started"),
        ):
            enqueue_many(engine, [NewJob("stuck_noop", {}, queue="stuck") for _ in range(5)])
            wait(lambda: events(relay, "relay.queue_publish_failing"), "the stuck queue fails", 30)
            trickle(engine, "healthy_noop", "healthy", 20)
            wait(lambda: states(pg, "healthy") == {"SUCCEEDED": 20}, "every healthy job ran")
            (first, *_) = events(relay, "relay.queue_publish_failing")
            assert (first["queue"], first["reason"]) == ("stuck", "decision_timeout")
            assert states(pg, "stuck") == {"QUEUED": 5, "SUCCEEDED": 1}
            holder.rollback()
            wait(lambda: states(pg, "stuck") == {"SUCCEEDED": 6}, "the stuck queue's jobs ran")
    assert not events(relay, "relay.drain_failed")


async def test_jobctl_stats_and_the_dashboard_name_a_queue_a_relay_cannot_publish_to(
    pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """What a relay's heartbeat writes when a queue fails, read by `jobctl stats`
    (text and JSON) and the dashboard's overview; a stale relay's row counts not."""
    failing_queues = {
        "mail": {
            "reason": "refused",
            "detail": "RabbitMQ refused 3 of 3 messages (nacked: ...)",
            "since": "2026-01-01T00:00:00+00:00",
            "failures": 7,
        }
    }
    pg.execute(
        "INSERT INTO relays (relay_id, host, pid, broker_connected, last_seen_at, failing_queues)"
        " VALUES ('r:1:a', 'r', 1, true, now(), %(f)s),"
        " ('r:2:b', 'r', 2, true, now() - interval '10 minutes', %(f)s)",
        {"f": json.dumps(failing_queues)},
    )
    text = jobctl_stats(db_url)
    assert (
        "publish failing: mail (refused, 1 relay(s), since 2026-01-01 00:00:00Z):"
        " RabbitMQ refused 3 of 3 messages (nacked: ...)"
    ) in text.splitlines()
    (found,) = json.loads(jobctl_stats(db_url, "--json"))["publish_failing"]
    assert (found["queue"], found["reason"], found["relays"], found["failures"]) == (
        "mail",
        "refused",
        1,
        7,
    )
    async with api_client(db_url, token=None) as client:
        page = (await client.get("/")).text
    assert 'data-testid="publish-failing"' in page
    assert "RabbitMQ refused 3 of 3 messages" in page
