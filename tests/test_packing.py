"""Several job ids per wake-up: a consumer claims what it has room for and keeps the
rest, acks a message only when every id in it is accounted for, loses nothing when
it dies holding a half-claimed message; malformed packed bodies are dead-lettered;
old single-id and packed bodies mix. And the scale-out run: two relays and four
consumer processes on one database and one broker."""

from __future__ import annotations

import asyncio
import json
import uuid

import psycopg
import pytest
from sqlalchemy import Engine

from hybrid_jobs import consumers
from hybrid_jobs.consumers import Registry, prefetch
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.relay import spread
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.topology import Topology
from tests.support.broker import collect, publish_raw, queue_depth
from tests.support.inproc import consumer_running, relay_running
from tests.support.jobs import (
    attempts,
    enqueue,
    enqueue_many,
    job,
    until,
    wait_for_state,
    wait_until_all,
)
from tests.support.processes import running

pytestmark = pytest.mark.timeout(240)


def silent_jobs(
    pg: psycopg.Connection, job_type: str, n: int, **payload: object
) -> list[uuid.UUID]:
    """Jobs with no wake-up of their own: the test publishes the wake-ups itself."""
    ids = [uuid.uuid4() for _ in range(n)]
    pg.execute(
        "INSERT INTO jobs (job_id, job_type, payload) SELECT unnest(%s::uuid[]), %s, %s::jsonb",
        [ids, job_type, json.dumps(payload)],
    )
    return ids


def body(ids: list[uuid.UUID]) -> bytes:
    return "\n".join(str(i) for i in ids).encode()


async def test_a_packed_message_is_claimed_as_slots_free_and_acked_when_all_are(
    db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, pg
) -> None:
    registry = Registry()
    gate = asyncio.Event()

    @registry.handler("gated")
    async def gated(j: consumers.Job) -> None:
        await gate.wait()

    ids = silent_jobs(pg, "gated", 10)
    await publish_raw(amqp_url.url, topology, "default", body(ids))
    # Room for all ten: two slots and a prefetch of eight ids (a smaller prefetch
    # hands the rest back: tests/test_intake.py).
    async with consumer_running(
        db_url, amqp_url, topology, registry, concurrency=2, prefetch=8
    ) as consumer:
        for _ in range(200):
            if consumer.claimer.buffered == 8:
                break
            await asyncio.sleep(0.02)
        assert consumer.claimer.buffered == 8, "two claimed, eight kept"
        states = [job(pg, i)["state"] for i in ids]
        assert states.count("RUNNING") == 2 and states.count("QUEUED") == 8
        gate.set()
        for job_id in ids:
            await wait_for_state(pg, job_id, "SUCCEEDED")
        assert consumer.claimer.buffered == 0
    assert await queue_depth(amqp_url.url, topology, "default") == 0, "acked once, at the end"
    for job_id in ids:
        assert [a["outcome"] for a in attempts(pg, job_id)] == ["SUCCEEDED"]


def test_a_consumer_killed_holding_a_half_claimed_message_loses_nothing(
    amqp_url: AmqpUrl,
    topology: Topology,
    pg,
    env: dict[str, str],
) -> None:
    consumer = ["--app", "tests.apps.basic", "--lease-seconds", "2", "--heartbeat-seconds", "0.5"]
    ids = silent_jobs(pg, "sleep", 10, seconds=1.0)
    asyncio.run(publish_raw(amqp_url.url, topology, "default", body(ids)))
    with running("relay", ["--sweep-interval", "0.3"], env, "relay.started"):
        with running("consumer", [*consumer, "--concurrency", "3"], env, "consumer.started") as a:
            asyncio.run(wait_until_all(pg, "RUNNING", 3))
            a.kill()  # three claimed, seven waiting in its buffer, message unacked
        claimed_by_the_dead = [i for i in ids if job(pg, i)["state"] == "RUNNING"]
        assert len(claimed_by_the_dead) == 3
        with running("consumer", consumer, env, "consumer.started"):
            for job_id in ids:
                asyncio.run(wait_for_state(pg, job_id, "SUCCEEDED", timeout=60))
    for job_id in ids:
        outcomes = [a["outcome"] for a in attempts(pg, job_id)]
        assert outcomes.count("SUCCEEDED") == 1
        expected = ["RETRY_WAIT", "SUCCEEDED"] if job_id in claimed_by_the_dead else ["SUCCEEDED"]
        assert outcomes == expected, "the redelivery claimed the rest at once"


@pytest.fixture
def short_run(monkeypatch: pytest.MonkeyPatch) -> float:
    """A short run, for these tests: long enough that a loaded machine's no-op
    jobs all count as short."""
    monkeypatch.setattr(prefetch, "SHORT_RUN", 0.3)
    return prefetch.SHORT_RUN


def prefetch_row(pg: psycopg.Connection) -> int | None:
    found = pg.execute("SELECT prefetch FROM workers").fetchone()
    return found[0] if found else None


def pack_limit(pg: psycopg.Connection) -> int:
    row = pg.execute(q.WORKER_PACK_LIMIT, {"queue": "default", "worker_ttl": 60}).fetchone()
    return row[0]


async def test_short_jobs_double_a_consumers_prefetch_and_a_long_one_brings_it_back(
    db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, engine: Engine, pg, short_run
) -> None:
    """Left at 0, a consumer's prefetch is its concurrency (4), and the relay packs
    half of it into a message. After a streak of short runs it holds twice that: its
    workers row says so at once, and the relay packs twice as many ids. A run that
    reaches SHORT_RUN brings it back."""
    registry = Registry()

    @registry.handler("quick")
    async def quick(j: consumers.Job) -> None:
        return None

    @registry.handler("slow")
    async def slow(j: consumers.Job) -> None:
        await asyncio.sleep(2 * short_run)

    services = (db_url, amqp_url, topology)
    async with (
        relay_running(*services),
        consumer_running(*services, registry, concurrency=4) as consumer,
    ):
        await until(lambda: prefetch_row(pg) == 4, "the consumer announced")
        assert consumer.intake.capacity == 8 and pack_limit(pg) == 2
        quick_ids = enqueue_many(engine, [NewJob("quick", {}) for _ in range(20)])
        for job_id in quick_ids:
            await wait_for_state(pg, job_id, "SUCCEEDED")
        await until(lambda: prefetch_row(pg) == 8, "the row says the doubled prefetch")
        assert consumer.intake.capacity == 12 and pack_limit(pg) == 4
        slow_id = enqueue(engine, "slow", {})
        await wait_for_state(pg, slow_id, "SUCCEEDED")
        await until(lambda: prefetch_row(pg) == 4, "back to the concurrency")
        assert consumer.intake.capacity == 8 and pack_limit(pg) == 2
    for job_id in [*quick_ids, slow_id]:
        assert [a["outcome"] for a in attempts(pg, job_id)] == ["SUCCEEDED"]


async def test_short_weighed_jobs_leave_the_prefetch_as_it_is(
    db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, engine: Engine, pg, short_run
) -> None:
    """Jobs of weight 2, however short, count as long runs: twice the ids of them
    would mostly find no room to start (their drain fell from 0.64 to 0.51 of
    plain with the prefetch doubled)."""
    registry = Registry()

    @registry.handler("quick")
    async def quick(j: consumers.Job) -> None:
        return None

    services = (db_url, amqp_url, topology)
    async with (
        relay_running(*services),
        consumer_running(*services, registry, concurrency=4) as consumer,
    ):
        ids = enqueue_many(engine, [NewJob("quick", {}, weight=2) for _ in range(30)])
        for job_id in ids:
            await wait_for_state(pg, job_id, "SUCCEEDED")
        assert consumer.prefetch.ids == 4 and prefetch_row(pg) == 4


async def test_long_jobs_after_short_ones_halve_the_prefetch_while_they_run(
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
    engine: Engine,
    pg,
    short_run,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A consumer of two slots whose prefetch doubled on short jobs (4 ids) meets a
    backlog of long ones: it halves its prefetch while the first long runs go on,
    not when they end, and hands the ids it holds beyond its room back to the
    outbox's backlog rather than keep them waiting behind the long runs."""
    monkeypatch.setattr(spread, "FRESH_SECONDS", 0.0)  # the relay packs by the row at once
    registry = Registry()
    release = asyncio.Event()

    @registry.handler("quick")
    async def quick(j: consumers.Job) -> None:
        return None

    @registry.handler("long")
    async def long(j: consumers.Job) -> None:
        await release.wait()

    services = (db_url, amqp_url, topology)
    async with (
        relay_running(*services),
        consumer_running(*services, registry, concurrency=2) as consumer,
    ):
        quick_ids = enqueue_many(engine, [NewJob("quick", {}) for _ in range(10)])
        for job_id in quick_ids:
            await wait_for_state(pg, job_id, "SUCCEEDED")
        await until(lambda: prefetch_row(pg) == 4, "doubled")
        long_ids = enqueue_many(engine, [NewJob("long", {}) for _ in range(6)])
        await until(lambda: consumer.ledger.running == 2, "both slots on long jobs")
        await until(lambda: prefetch_row(pg) == 2, "halved while they run", timeout=10)
        await until(lambda: consumer.claimer.held <= consumer.intake.capacity == 4, "shed")
        # (given back by the shed; or, should the last message come after the
        # halving, turned away on delivery)
        counts = consumer.claimer.counts
        assert counts["prefetch_shed"] + counts["wakeup_handed_back"] == 2
        release.set()
        for job_id in long_ids:
            await wait_for_state(pg, job_id, "SUCCEEDED", timeout=60)
    for job_id in [*quick_ids, *long_ids]:
        assert [a["outcome"] for a in attempts(pg, job_id)] == ["SUCCEEDED"]


async def test_malformed_packed_bodies_go_to_the_dead_letter_queue_and_forms_mix(
    db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, pg
) -> None:
    registry = Registry()

    @registry.handler("plain")
    async def plain(j: consumers.Job) -> None:
        return None

    ids = silent_jobs(pg, "plain", 12)
    good = [
        str(ids[0]).encode(),  # the old form: one id
        f"urn:uuid:{ids[1]}".encode(),
        body(ids[2:7]),  # packed
        body(ids[7:12]) + b"\n",  # packed, trailing newline
    ]
    bad = [
        body(ids[:2]) + b"\nnot-an-id",
        b"\n".join([str(uuid.uuid4()).encode()] * 1001),  # more ids than a message may name
        b"\xff\xfe" + body(ids[:1]),
    ]
    async with consumer_running(db_url, amqp_url, topology, registry) as consumer:
        for message in [*good, *bad]:
            await publish_raw(amqp_url.url, topology, "default", message)
        for job_id in ids:
            await wait_for_state(pg, job_id, "SUCCEEDED")
        dead = await collect(amqp_url.url, topology, "", len(bad), timeout=10, dead_letters=True)
        assert consumer.inbox.garbage == len(bad)
    assert len(dead) == len(bad)


@pytest.mark.parametrize(
    "jobs",
    # Three batches of 1,000 (each more than a relay's pass of 500) show two relays
    # sharing the work and every job run once; the full 20,000, in batches of 2,000
    # (about 100 s on a loaded machine), is a soak.
    [3_000, pytest.param(20_000, marks=pytest.mark.soak)],
)
def test_two_relays_and_four_consumers_drain_every_job_once(
    jobs: int,
    engine: Engine,
    pg,
    env: dict[str, str],
) -> None:
    consumer = ["--app", "tests.apps.basic", "--concurrency", "50"]
    batch = min(2_000, jobs // 3)
    with (
        running("relay", [], env, "relay.started") as r1,
        running("relay", [], env, "relay.started") as r2,
        running("consumer", consumer, env, "consumer.started"),
        running("consumer", consumer, env, "consumer.started"),
        running("consumer", consumer, env, "consumer.started"),
        running("consumer", consumer, env, "consumer.started"),
    ):
        for _ in range(jobs // batch):
            enqueue_many(engine, [NewJob("noop", {}) for _ in range(batch)])
        asyncio.run(wait_until_all(pg, "SUCCEEDED", jobs, timeout=180))
        assert r1.stop() == 0 and r2.stop() == 0
    once = pg.execute(
        "SELECT count(*) FROM (SELECT job_id FROM job_attempts WHERE outcome = 'SUCCEEDED'"
        " GROUP BY job_id HAVING count(*) = 1) AS t"
    ).fetchone()[0]
    assert once == jobs, "each job succeeded exactly once"
    assert pg.execute("SELECT max(attempt_count) FROM jobs").fetchone()[0] == 1
    stopped = [e for r in (r1, r2) for e in r.events() if e["event"] == "relay.stopped"]
    # Both took part: each published, or found the queue's lock held by the other (the
    # lock, not luck, keeps them apart; which of them wins each pass is the machine's
    # timing, and one relay sending every batch is allowed).
    assert len(stopped) == 2
    assert all(e["published"] > 0 or e["busy_passes"] > 0 for e in stopped), stopped
    assert sum(e["published"] for e in stopped) >= jobs
