"""The relay against real PostgreSQL and RabbitMQ: wake-ups go out once each, late
ones wait, outages delay and never lose them, several relays share the work."""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import timedelta
from typing import Any

import aio_pika
import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Declared, Topology
from tests.support import inproc
from tests.support.broker import collect_ids, queue_depth
from tests.support.jobs import until
from tests.support.processes import refused, running, service_env
from tests.support.proxy import TcpProxy


def enqueue(engine: Engine, n: int, queue: str = "default", **kw: Any) -> list[str]:
    with Session(engine) as session, session.begin():
        ids = outbox.enqueue_many(
            session, [NewJob("t", {"i": i}, queue=queue, **kw) for i in range(n)]
        )
    return [str(i) for i in ids]


def relay_running(*args: Any, **overrides: Any) -> Any:
    """The relay on its own. No consumer claims anything in these tests, so the
    re-waker (rightly) would re-wake every job, and nothing would ever make room in
    the window: keep the re-waker to its production interval and the window wide
    (tests/test_order.py is where the window is tested)."""
    return inproc.relay_running(*args, **({"rewake_interval": 30.0, "window": 100_000} | overrides))


def unsent(pg: psycopg.Connection) -> int:
    return pg.execute("SELECT count(*) FROM outbox WHERE sent_at IS NULL").fetchone()[0]


async def test_publishes_each_wakeup_and_marks_it_sent(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    a = enqueue(engine, 30, queue="a")
    b = enqueue(engine, 20, queue="b", priority=5)
    async with relay_running(db_url, amqp_url, topology):
        got_a = await collect_ids(amqp_url.url, topology, "a", 30)
        got_b = await collect_ids(amqp_url.url, topology, "b", 20)
    assert sorted(got_a) == sorted(a)
    assert sorted(got_b) == sorted(b)
    assert unsent(pg) == 0


async def test_a_queue_woken_again_during_its_pass_is_left_to_the_drainer_waking_it(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    # One job per transaction, faster than a pass: most notifications arrive while
    # a drainer is waking the queue. The other drainer must leave it to that one
    # (which goes again), not find the queue's lock taken and then wait out a
    # refill interval with the new job behind it.
    ids: list[str] = []
    async with relay_running(db_url, amqp_url, topology, publishers=2) as relay:
        collecting = asyncio.create_task(collect_ids(amqp_url.url, topology, "default", 120))
        for _ in range(120):
            ids += await asyncio.to_thread(enqueue, engine, 1)
            await asyncio.sleep(0.004)
        got = await collecting
        assert relay.busy_passes == 0
    assert sorted(got) == sorted(ids)
    assert unsent(pg) == 0


async def test_messages_are_persistent_and_name_the_job(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    (job_id,) = enqueue(engine, 1, priority=42)
    async with relay_running(db_url, amqp_url, topology) as relay:
        while relay.published < 1:
            await asyncio.sleep(0.02)
    connection = await aio_pika.connect(amqp_url.url)
    async with connection:
        channel = await connection.channel()
        # Declaring it durable succeeds only if it is: RabbitMQ refuses a mismatch.
        queue = await Declared(channel, topology).queue("default")
        message = await queue.get(timeout=5)
        assert message.body.decode() == job_id
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert message.priority == 9, "priority is clamped to the queue's range"
        outbox_id = pg.execute("SELECT id FROM outbox").fetchone()[0]
        assert message.message_id == str(outbox_id), "unique: returns are matched on it"
        await message.ack()


async def test_delayed_wakeup_waits_for_available_at(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    now = enqueue(engine, 1)
    later = enqueue(engine, 1, run_after=timedelta(seconds=3))
    async with relay_running(db_url, amqp_url, topology, poll_interval=0.2) as relay:
        assert await collect_ids(amqp_url.url, topology, "default", 1) == now
        await inproc.chore_rounds(relay, "drain", 3)  # polls that found it not yet due
        assert unsent(pg) == 1, "the delayed wake-up went out early"
        assert await queue_depth(amqp_url.url, topology, "default") == 0
        assert await collect_ids(amqp_url.url, topology, "default", 1, timeout=10) == later
    assert unsent(pg) == 0


async def test_a_delayed_wakeup_comes_due_behind_another_queues_held_backlog(
    engine: Engine, db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology
) -> None:
    """No consumer takes queue a's wake-ups, so its window stays full and the relay
    keeps coming back to it; b's delayed wake-up notifies nobody when it comes due,
    and is found by the look everywhere that happens at least every poll interval."""
    enqueue(engine, 100, queue="a")
    later = enqueue(engine, 1, queue="b", run_after=timedelta(seconds=1))
    async with relay_running(db_url, amqp_url, topology, window=10, poll_interval=0.5):
        assert len(await collect_ids(amqp_url.url, topology, "a", 10)) == 10
        assert await collect_ids(amqp_url.url, topology, "b", 1, timeout=10) == later


async def test_broker_outage_leaves_rows_unsent_until_it_returns(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = TcpProxy("127.0.0.1", 5672)
    try:
        via_proxy = AmqpUrl.parse(f"amqp://127.0.0.1:{proxy.port}/")
        async with relay_running(db_url, via_proxy, topology, poll_interval=0.2, publish_timeout=1):
            first = enqueue(engine, 10)
            assert sorted(await collect_ids(amqp_url.url, topology, "default", 10)) == sorted(first)
            proxy.down()
            during = enqueue(engine, 100)
            # The relay tried to send them and failed: that, not the passing of
            # time, shows nothing goes out while the broker is away.
            while not any(r.msg == "relay.drain_failed" for r in caplog.records):
                await asyncio.sleep(0.05)
            assert unsent(pg) == 100
            assert await queue_depth(amqp_url.url, topology, "default") == 0
            proxy.up()
            got = await collect_ids(amqp_url.url, topology, "default", 100, timeout=60)
    finally:
        proxy.close()
    assert sorted(got) == sorted(during)
    assert unsent(pg) == 0


def relay_rows(pg: psycopg.Connection) -> dict[str, tuple[bool, int]]:
    rows = pg.execute("SELECT relay_id, broker_connected, published FROM relays").fetchall()
    return {relay_id: (connected, published) for relay_id, connected, published in rows}


async def test_heartbeat_says_whether_the_relay_can_publish(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    proxy = TcpProxy("127.0.0.1", 5672)
    try:
        via_proxy = AmqpUrl.parse(f"amqp://127.0.0.1:{proxy.port}/")
        settings = {"heartbeat_interval": 0.1, "publish_timeout": 1}
        async with relay_running(db_url, via_proxy, topology, **settings) as relay:
            me = relay.relay_id
            enqueue(engine, 3)
            await until(lambda: relay_rows(pg).get(me) == (True, 3), "connected, 3 published")
            proxy.down()
            await until(lambda: relay_rows(pg).get(me, (True,))[0] is False, "disconnected")
            proxy.up()
            await until(lambda: relay_rows(pg).get(me, (False,))[0] is True, "reconnected")
    finally:
        proxy.close()
    assert me not in relay_rows(pg), "a relay that stops cleanly takes its row away"


async def test_a_relay_that_stopped_heartbeating_is_forgotten(
    pg: psycopg.Connection, db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology
) -> None:
    pg.execute(
        "INSERT INTO relays (relay_id, host, pid, last_seen_at, broker_connected)"
        " VALUES ('gone:1:abc', 'gone', 1, now() - interval '10 minutes', true)"
    )
    async with relay_running(
        db_url, amqp_url, topology, worker_ttl=3.0, heartbeat_interval=0.1
    ) as relay:
        await inproc.chore_rounds(relay, "workers", 2)
        await until(lambda: relay.relay_id in relay_rows(pg), "its own row")
        assert "gone:1:abc" not in relay_rows(pg)
        assert relay_rows(pg)[relay.relay_id][0] is True


async def test_database_connections_cut_loses_nothing(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    proxy = TcpProxy("127.0.0.1", 5432)
    try:
        base = db_url.conninfo.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
        async with relay_running(DatabaseUrl.parse(base), amqp_url, topology, poll_interval=0.2):
            ids = []
            for _ in range(5):
                ids += enqueue(engine, 200)
                proxy.cut()
                await asyncio.sleep(0.3)
            got = await collect_ids(amqp_url.url, topology, "default", 1000, timeout=60, settle=1)
    finally:
        proxy.close()
    assert set(got) == set(ids), "every wake-up arrives (a duplicate is allowed, a loss is not)"
    assert unsent(pg) == 0


async def test_queue_deleted_behind_the_relays_back_is_declared_again(
    engine: Engine, db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology
) -> None:
    async with relay_running(db_url, amqp_url, topology, poll_interval=0.2):
        first = enqueue(engine, 5)
        assert sorted(await collect_ids(amqp_url.url, topology, "default", 5)) == sorted(first)
        connection = await aio_pika.connect(amqp_url.url)
        async with connection:
            channel = await connection.channel()
            await channel.queue_delete(topology.queue_name("default"))
        second = enqueue(engine, 5)
        assert sorted(
            await collect_ids(amqp_url.url, topology, "default", 5, timeout=30)
        ) == sorted(second)


async def test_wakeups_leave_the_outbox_once_their_job_was_taken_up(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    enqueue(engine, 20)
    enqueue(engine, 5, run_after=timedelta(hours=1))
    async with relay_running(db_url, amqp_url, topology, sweep_interval=0.2) as relay:
        await collect_ids(amqp_url.url, topology, "default", 20)
        assert pg.execute("SELECT count(sent_at) FROM outbox").fetchone()[0] == 20, "in flight"
        # A consumer takes the jobs up (as its claim would).
        pg.execute(
            "UPDATE jobs SET state = 'RUNNING', lease_owner = 'w', started_at = now(),"
            " lease_expires_at = now() + interval '1 hour' WHERE run_after <= now()"
        )
        await inproc.chore_rounds(relay, "sweep", 2)
    rows = pg.execute("SELECT count(*), count(sent_at) FROM outbox").fetchone()
    assert rows == (5, 0), "taken-up wake-ups settled, the delayed ones wait"


def test_two_relay_processes_share_5000_rows(
    engine: Engine,
    pg: psycopg.Connection,
    amqp_url: AmqpUrl,
    topology: Topology,
    env: dict[str, str],
) -> None:
    # Ten queues in small batches: a queue is woken by one relay at a time (its
    # advisory lock), so while one relay holds a queue the other takes the next; with
    # one queue a fast relay could take every batch before the other woke.
    args = ["--batch-size", "50", "--pack", "10", "--poll-interval", "0.2", "--window", "100000"]
    queues = [f"q{i}" for i in range(10)]
    with (
        running("relay", args, env, "relay.started") as r1,
        running("relay", args, env, "relay.started") as r2,
    ):
        ids = []
        for queue in queues:
            ids += enqueue(engine, 500, queue=queue)

        async def collect_all() -> list[str]:
            found = await asyncio.gather(
                *(
                    collect_ids(amqp_url.url, topology, q, 500, timeout=120, settle=1.0)
                    for q in queues
                )
            )
            return [i for part in found for i in part]

        got = asyncio.run(collect_all())
        assert r1.stop() == 0
        assert r2.stop() == 0
    assert len(got) == 5000, "each row published exactly once"
    assert set(got) == set(ids)
    assert unsent(pg) == 0
    published = [
        e["published"] for r in (r1, r2) for e in r.events() if e["event"] == "relay.stopped"
    ]
    assert sum(published) == 5000
    assert all(p > 0 for p in published), f"both relays should have taken a share: {published}"


def test_sigterm_and_sigint_stop_the_relay_cleanly(
    env: dict[str, str],
) -> None:
    for signum in (signal.SIGTERM, signal.SIGINT):
        with running("relay", [], env, "relay.started") as relay:
            relay.signal(signum)
            assert relay.proc.wait(15) == 0
            assert relay.has_event("relay.stopped")


def test_credentials_never_reach_the_logs(
    engine: Engine, db_url: DatabaseUrl, topology: Topology
) -> None:
    # Trust authentication ignores the password, so a made-up one connects fine.
    secret_db = DatabaseUrl.parse(db_url.conninfo.replace("127.0.0.1", "root:pg-s3cret@127.0.0.1"))
    env = service_env(secret_db, "amqp://guest:guest@127.0.0.1:5672/", topology)
    enqueue(engine, 3)
    with running("relay", ["--poll-interval", "0.2"], env, "relay.started") as relay:
        asyncio.run(collect_ids("amqp://127.0.0.1:5672/", topology, "default", 3))
    text = relay.text()
    assert "relay.starting" in text
    assert "pg-s3cret" not in text
    assert "guest:guest" not in text


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("DATABASE_URL", "not a url", "DATABASE_URL must be a postgresql:// URL"),
        ("DATABASE_URL", "mysql://u:hunter2@h/db", "DATABASE_URL must be a postgresql:// URL"),
        (
            "DATABASE_URL",
            "postgresql://u:hunter2@h/db?sslmode=bogus=x=y",
            "DATABASE_URL is not a valid",
        ),
        ("AMQP_URL", "http://u:hunter2@h/", "AMQP_URL must be an amqp:// or amqps:// URL"),
        ("AMQP_URL", "amqp://u:hunter2@h:notaport/", "AMQP_URL"),
        ("AMQP_URL", "amqp:///vhost", "AMQP_URL must name a host"),
    ],
)
def test_malformed_urls_give_one_line_naming_the_variable(
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
    variable: str,
    value: str,
    message: str,
) -> None:
    env = service_env(db_url, amqp_url, topology) | {variable: value}
    done = refused("relay", [], env)
    assert message in done.stderr
    assert "hunter2" not in done.stderr + done.stdout


def test_url_from_file(
    tmp_path,
    db_url: DatabaseUrl,
    env: dict[str, str],
) -> None:
    secret = tmp_path / "database_url"
    secret.write_text(db_url.conninfo + "\n")
    del env["DATABASE_URL"]
    env["DATABASE_URL_FILE"] = str(secret)
    with running("relay", [], env, "relay.started") as relay:
        assert (
            os.path.basename(db_url.conninfo) in relay.wait_for_event("relay.starting")["database"]
        )
