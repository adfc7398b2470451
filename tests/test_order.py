"""What runs next is the table's decision: tenant caps reserved in the claim, the
relay's window, weighted fair share between tenants, priorities that hold under a
backlog, and backpressure at enqueue. Real PostgreSQL and RabbitMQ throughout."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.tables import TENANT_SLOTS_FREED
from hybrid_jobs.schema.topology import QueueType, Topology
from tests.support.broker import collect, delete_topology, publish_raw
from tests.support.inproc import chore_rounds, consumer_running, relay_running
from tests.support.jobs import enqueue, enqueue_many, job, wait_for_state, wait_until_all
from tests.support.services import AMQP_URL

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def services(db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology):
    return db_url, amqp_url, topology


def set_limit(engine: Engine, tenant: str, **limits: Any) -> None:
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, tenant, **limits)


def held_reason(pg: psycopg.Connection, tenant: str) -> str | None:
    row = pg.execute(
        "SELECT held_reason FROM fair_shares WHERE queue = 'default' AND tenant = %s", [tenant]
    ).fetchone()
    return row[0] if row else None


def started_order(pg: psycopg.Connection, job_type: str) -> list[tuple[str | None, int]]:
    """(tenant, priority) of each job of a type, in the order they started."""
    return pg.execute(
        "SELECT tenant, priority FROM jobs WHERE job_type = %s ORDER BY started_at, job_id",
        [job_type],
    ).fetchall()


async def test_two_consumers_racing_never_run_more_than_the_tenants_cap(
    services, engine: Engine, pg
) -> None:
    """The relay sends a capped tenant no more wake-ups than it has free slots; here
    every job is also woken directly, all at once, to both consumers, so only the
    claim's reservation stands between them and the cap."""
    _db, amqp, topology = services
    registry = Registry()

    @registry.handler("slow")
    async def slow(j: consumers.Job) -> None:
        await asyncio.sleep(0.3)

    set_limit(engine, "acme", max_running=3)
    ids = enqueue_many(engine, [NewJob("slow", {}, tenant="acme") for _ in range(30)])
    others = enqueue_many(engine, [NewJob("slow", {}) for _ in range(10)])
    for half in (ids[:15], ids[15:], ids[:15], ids[15:]):
        await publish_raw(amqp.url, topology, "default", "\n".join(map(str, half)).encode())
    peak = 0
    samples = 0

    async def sample() -> None:
        nonlocal peak, samples
        while True:
            running = pg.execute(
                "SELECT count(*) FROM jobs WHERE tenant = 'acme'"
                " AND state IN ('RUNNING', 'CANCEL_REQUESTED')"
            ).fetchone()[0]
            peak, samples = max(peak, running), samples + 1
            await asyncio.sleep(0.005)

    sampler = asyncio.create_task(sample())
    try:
        async with (
            relay_running(*services),
            consumer_running(*services, registry, concurrency=20),
            consumer_running(*services, registry, concurrency=20),
        ):
            for job_id in others:  # the capped tenant holds nobody else up
                await wait_for_state(pg, job_id, "SUCCEEDED", timeout=10)
            for job_id in ids:
                await wait_for_state(pg, job_id, "SUCCEEDED", timeout=60)
    finally:
        sampler.cancel()
    assert samples > 100
    assert peak == 3, f"at most 3 of acme's jobs at once, and the cap was used: saw {peak}"
    usage = pg.execute("SELECT running FROM tenant_usage WHERE tenant = 'acme'").fetchone()[0]
    assert usage == 0, "every slot released once"
    assert pg.execute("SELECT count(*) FROM jobs WHERE holds_slot").fetchone()[0] == 0


async def test_a_capped_tenants_waiting_jobs_say_so(services, engine: Engine, pg) -> None:
    registry = Registry()
    gate = asyncio.Event()

    @registry.handler("held")
    async def held(j: consumers.Job) -> None:
        await gate.wait()

    set_limit(engine, "acme", max_running=1)
    first, *rest = enqueue_many(engine, [NewJob("held", {}, tenant="acme") for _ in range(3)])
    async with relay_running(*services) as relay, consumer_running(*services, registry):
        await wait_for_state(pg, first, "RUNNING")
        await chore_rounds(relay, "sweep", 2)
        assert held_reason(pg, "acme") == "TENANT_CAP"
        assert [job(pg, j)["attempt_count"] for j in rest] == [0, 0], "waiting spends nothing"
        gate.set()
        for job_id in rest:
            await wait_for_state(pg, job_id, "SUCCEEDED")


async def test_the_window_keeps_the_backlog_in_the_tables(
    services, engine: Engine, pg, amqp_url: AmqpUrl, topology: Topology
) -> None:
    """With no consumer, the relay sends a window's worth and keeps the rest; a
    consumer drains everything; one that stops leaves at most a window in flight."""
    registry = Registry()

    @registry.handler("item")
    async def item(j: consumers.Job) -> None:
        await asyncio.sleep(0.02)

    in_flight = "SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL"
    pending = "SELECT count(*) FROM outbox WHERE sent_at IS NULL"
    ids = enqueue_many(engine, [NewJob("item", {"i": i}) for i in range(400)])
    async with relay_running(*services, window=25) as relay:
        for _ in range(200):
            if relay.published >= 25:
                break
            await asyncio.sleep(0.02)
        await chore_rounds(relay, "sweep", 2)
        assert relay.published == 25, "a window's worth, no more"
        assert pg.execute(in_flight).fetchone()[0] == 25
        assert pg.execute(pending).fetchone()[0] == 375, "the backlog waits in the table"
        assert held_reason(pg, "") == "WINDOW"
        async with consumer_running(*services, registry, concurrency=5):
            await wait_until_all(pg, "SUCCEEDED", 150, timeout=60)
        # The consumer stopped mid-backlog: what it had not taken went back.
        await chore_rounds(relay, "sweep", 2)
        assert pg.execute(in_flight).fetchone()[0] <= 25
        assert pg.execute(pending).fetchone()[0] > 150
        async with consumer_running(*services, registry, concurrency=5):
            for job_id in ids:
                await wait_for_state(pg, job_id, "SUCCEEDED", timeout=60)
    assert pg.execute("SELECT max(attempt_count) FROM jobs").fetchone()[0] == 1


async def _share_while_a_backlogs(
    services: Any, engine: Engine, pg: psycopg.Connection, weight_b: float
) -> float:
    """Tenant A has a long backlog, then B enqueues 40: of the jobs that start
    between B's first and last, how many are A's for each of B's."""
    registry = Registry()

    @registry.handler("unit")
    async def unit(j: consumers.Job) -> None:
        await asyncio.sleep(0.01)

    set_limit(engine, "tenant-b", weight=weight_b)
    a = enqueue_many(engine, [NewJob("unit", {}, tenant="tenant-a") for _ in range(1500)])
    async with relay_running(*services, window=20) as relay:
        await chore_rounds(relay, "sweep", 1)  # A's backlog has the queue to itself
        async with consumer_running(*services, registry, concurrency=4):
            await wait_until_all(pg, "SUCCEEDED", 60, timeout=60)
            b = enqueue_many(engine, [NewJob("unit", {}, tenant="tenant-b") for _ in range(40)])
            for job_id in b:
                await wait_for_state(pg, job_id, "SUCCEEDED", timeout=60)
            waiting_a = sum(1 for j in a if job(pg, j)["state"] == "QUEUED")
    assert waiting_a > 500, "B finished long before A's backlog did"
    order = [tenant for tenant, _ in started_order(pg, "unit")]
    first_b = order.index("tenant-b")
    last_b = len(order) - 1 - order[::-1].index("tenant-b")
    # Skip the window of A's that was already in flight when B arrived.
    span = order[first_b : last_b + 1]
    ratio = span.count("tenant-a") / span.count("tenant-b")
    print(f"fair share 1:{weight_b:g}: {ratio:.2f} of A's per B's, {waiting_a} of A's waiting")
    return ratio


async def test_fair_share_one_to_one(services, engine: Engine, pg) -> None:
    ratio = await _share_while_a_backlogs(services, engine, pg, weight_b=1.0)
    assert 0.6 <= ratio <= 1.6, f"equal weights: about one of A's per one of B's, got {ratio:.2f}"


async def test_fair_share_one_to_three(services, engine: Engine, pg) -> None:
    ratio = await _share_while_a_backlogs(services, engine, pg, weight_b=3.0)
    assert ratio <= 0.6, f"B weighs three times A: about a third of A's per B's, got {ratio:.2f}"


@pytest.mark.parametrize("queue_type", [QueueType.CLASSIC, QueueType.QUORUM])
async def test_a_high_priority_job_overtakes_a_backlog(
    queue_type: QueueType, db_url: DatabaseUrl, amqp_url: AmqpUrl, engine: Engine, pg
) -> None:
    topology = Topology(prefix=f"t{uuid.uuid4().hex[:10]}", queue_type=queue_type)
    registry = Registry()

    @registry.handler("unit")
    async def unit(j: consumers.Job) -> None:
        await asyncio.sleep(0.005)

    window, concurrency = 30, 5
    enqueue_many(engine, [NewJob("unit", {}, priority=0) for _ in range(2000)])
    waiting_sql = "SELECT count(*) FROM jobs WHERE state = 'QUEUED'"
    try:
        async with (
            relay_running(db_url, amqp_url, topology, window=window),
            consumer_running(db_url, amqp_url, topology, registry, concurrency=concurrency),
        ):
            await wait_until_all(pg, "SUCCEEDED", 100, timeout=60)
            urgent = enqueue(engine, "unit", priority=10)
            row = await wait_for_state(pg, urgent, "SUCCEEDED", timeout=30)
            ahead = pg.execute(
                "SELECT count(*) FROM jobs WHERE started_at > %s AND started_at < %s",
                [job(pg, urgent)["created_at"], row["started_at"]],
            ).fetchone()[0]
            waiting = pg.execute(waiting_sql).fetchone()[0]
    finally:
        await delete_topology(AMQP_URL, topology, ["default"])
    print(f"priority overtake ({queue_type}): {ahead} jobs started ahead, {waiting} waiting")
    assert waiting > 1000, "the backlog was still there"
    assert ahead <= window + concurrency, f"{ahead} jobs started before it: more than a window"


async def test_a_pass_publishes_its_urgent_wakeup_first(
    db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, engine: Engine
) -> None:
    # One pass sends all 41 wake-ups, packed 10 to a message. Packed in the order
    # the UPDATE happened to return them, the urgent one, enqueued last, rode in
    # the last message: behind 40 others however the relay had ordered them.
    backlog = enqueue_many(engine, [NewJob("unit", {}) for _ in range(40)])
    urgent = enqueue(engine, "unit", priority=10)
    async with relay_running(db_url, amqp_url, topology, window=100, pack=10):
        bodies = await collect(amqp_url.url, topology, "default", 5)
    messages = [b.split() for b in bodies]
    assert messages[0][0] == str(urgent), messages
    assert sorted(i for m in messages for i in m) == sorted(map(str, [*backlog, urgent]))


def test_backpressure_refuses_before_writing_anything(engine: Engine, pg) -> None:
    set_limit(engine, "bulk", max_queued=5)
    with Session(engine) as session, session.begin():
        outbox.enqueue_many(session, [NewJob("t", {}, tenant="bulk") for _ in range(5)])
    before = pg.execute("SELECT count(*) FROM jobs").fetchone()[0]
    with Session(engine) as session, session.begin():
        with pytest.raises(outbox.Backpressure) as refused:
            outbox.enqueue(session, "t", {}, tenant="bulk")
        # The caller's transaction is intact: other work still goes through.
        outbox.enqueue(session, "t", {}, tenant="someone-else")
    error = refused.value
    assert (error.tenant, error.limit, error.waiting) == ("bulk", 5, 5)
    assert error.retry_after > 0
    assert "bulk" in str(error) and "max_queued is 5" in str(error)
    assert pg.execute("SELECT count(*) FROM jobs").fetchone()[0] == before + 1
    with Session(engine) as session, session.begin(), pytest.raises(outbox.Backpressure):
        outbox.enqueue_many(
            session, [NewJob("t", {}), NewJob("t", {}, tenant="bulk")]
        )  # a batch is all or nothing
    assert pg.execute("SELECT count(*) FROM jobs").fetchone()[0] == before + 1


async def test_backpressure_lifts_as_the_tenants_jobs_drain(services, engine: Engine, pg) -> None:
    registry = Registry()

    @registry.handler("t")
    async def t(j: consumers.Job) -> None:
        return None

    set_limit(engine, "bulk", max_queued=3)
    enqueue_many(engine, [NewJob("t", {}, tenant="bulk") for _ in range(3)])
    with Session(engine) as session, session.begin(), pytest.raises(outbox.Backpressure):
        outbox.enqueue(session, "t", {}, tenant="bulk")
    async with (
        relay_running(*services, usage_interval=0.1) as relay,
        consumer_running(*services, registry),
    ):
        await wait_until_all(pg, "SUCCEEDED", 3)
        await chore_rounds(relay, "usage", 2)
        with Session(engine) as session, session.begin():
            outbox.enqueue(session, "t", {}, tenant="bulk")
    usage = pg.execute("SELECT queued, claimed FROM tenant_usage WHERE tenant = 'bulk'").fetchone()
    assert usage[1] >= 3, "claims are counted, for the retry-after hint"


def test_tenant_limits_are_validated_and_read_back(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        for bad, error in [
            ({"tenant": "has space"}, ValueError),
            ({"tenant": "ok", "max_running": -1}, ValueError),
            ({"tenant": "ok", "weight": 0}, ValueError),
            ({"tenant": "ok", "weight": float("nan")}, ValueError),
            ({"tenant": "ok", "max_queued": 1.5}, TypeError),
        ]:
            tenant = bad.pop("tenant")
            with pytest.raises(error):
                outbox.set_tenant_limit(session, tenant, **bad)
        outbox.set_tenant_limit(session, "acme", max_running=4, weight=2.5, max_queued=100)
        outbox.set_tenant_limit(session, "acme", max_running=5, weight=2.5)  # changed
    with Session(engine) as session, session.begin():
        (acme,) = outbox.tenant_limits(session)
    assert (acme.tenant, acme.max_running, acme.weight, acme.max_queued) == ("acme", 5, 2.5, None)
    assert acme.running == 0
    with Session(engine) as session, session.begin(), pytest.raises(ValueError, match="tenant"):
        outbox.enqueue(session, "t", {}, tenant="bad tenant")


def test_a_freed_tenant_slot_tells_the_relay_with_its_own_payload(db_url, pg) -> None:
    """Lowering a tenant's running count notifies the relay's channel with
    TENANT_SLOTS_FREED (not the empty payload that sends it to scan every queue);
    raising one notifies nothing."""
    pg.execute("INSERT INTO tenant_limits (tenant, max_running) VALUES ('acme', 5)")
    pg.execute("INSERT INTO tenant_usage (tenant, running) VALUES ('acme', 2)")
    with psycopg.connect(db_url.conninfo, autocommit=True) as listener:
        listener.execute('LISTEN "public.outbox"')
        pg.execute("UPDATE tenant_usage SET running = 3 WHERE tenant = 'acme'")
        assert list(listener.notifies(timeout=0.3)) == []
        pg.execute("UPDATE tenant_usage SET running = 1 WHERE tenant = 'acme'")
        (note,) = listener.notifies(timeout=2, stop_after=1)
        assert (note.channel, note.payload) == ("public.outbox", TENANT_SLOTS_FREED)
        # slots of several tenants freed in one statement: one notification
        pg.execute("INSERT INTO tenant_limits (tenant, max_running) VALUES ('beta', 5)")
        pg.execute("INSERT INTO tenant_usage (tenant, running) VALUES ('beta', 2)")
        pg.execute("UPDATE tenant_usage SET running = running - 1")
        assert len(list(listener.notifies(timeout=0.5))) == 1


def test_a_write_that_frees_no_slot_runs_no_trigger_of_tenant_usage(pg) -> None:
    """A claim updates its batch's tenants' rows, none for jobs of no tenant, and
    raises their counts: neither runs the freed-slot trigger (a row trigger on a
    fall of running), so a plain job's statements pay nothing for it."""
    pg.execute("INSERT INTO tenant_limits (tenant, max_running) VALUES ('acme', 5)")
    pg.execute("INSERT INTO tenant_usage (tenant, running) VALUES ('acme', 2)")

    def fired(sql: str) -> list[str]:
        with pg.transaction(force_rollback=True):
            plan = [r[0] for r in pg.execute("EXPLAIN (ANALYZE) " + sql).fetchall()]
        return [line for line in plan if line.startswith("Trigger tenant_usage_notify")]

    assert fired("UPDATE tenant_usage SET running = running + 1 WHERE false") == []
    assert fired("UPDATE tenant_usage SET running = running + 1") == []
    assert fired("UPDATE tenant_usage SET claimed = claimed + 1") == []
    assert fired("UPDATE tenant_usage SET running = running - 1") != []
