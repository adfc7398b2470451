"""The worker's liveness under things that used to stall it, on the real services:
threads held by handlers that ignore their time limit, a row another transaction
keeps locked, a hung handler with no limit of its own, a job that kills its worker,
an unlucky mix of deliveries on one channel; and what a failure leaves behind."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid

import psycopg
import pytest
from sqlalchemy import Engine

from hybrid_jobs import consumers
from hybrid_jobs.consumers import Backoff, Registry
from hybrid_jobs.consumers.inbox import Delivery
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.broker import collect, publish_raw
from tests.support.inproc import chore_rounds, consumer_running, relay_running
from tests.support.jobs import attempts, enqueue, enqueue_many, job, wait_for_state
from tests.support.proxy import TcpProxy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def services(db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology):
    return db_url, amqp_url, topology


async def test_threads_held_by_overdue_handlers_are_never_handed_new_jobs(
    services, engine: Engine, pg, caplog: pytest.LogCaptureFixture
) -> None:
    """Two plain handlers ignore their 0.2 s limit and hold both threads for 3 s.
    Meanwhile plain-function jobs are not claimed (no attempt spent, nothing
    heartbeated for nothing) and the worker says why; async jobs keep running; once
    a thread returns, the waiting jobs run."""
    registry = Registry()
    release = threading.Event()

    @registry.handler("hog", timeout=0.2, max_attempts=1)
    def hog(j: consumers.Job) -> None:
        release.wait(30)  # ignores its time limit

    @registry.handler("plain", timeout=5)
    def plain(j: consumers.Job) -> None:
        return None

    @registry.handler("quick")
    async def quick(j: consumers.Job) -> None:
        return None

    caplog.set_level(logging.INFO, logger="consumer")
    hogs = enqueue_many(engine, [NewJob("hog", {}) for _ in range(2)])
    async with (
        relay_running(*services),
        consumer_running(*services, registry, concurrency=2) as consumer,
    ):
        try:
            await _threads_story(pg, engine, consumer, caplog, hogs, release)
        finally:
            release.set()
    assert [a["error_code"] for h in hogs for a in attempts(pg, h)] == ["TIMEOUT", "TIMEOUT"]


async def _threads_story(pg, engine, consumer, caplog, hogs, release) -> None:  # type: ignore[no-untyped-def]
    if True:
        for hog_id in hogs:
            await wait_for_state(pg, hog_id, "FAILED")
        assert consumer.threads.free == 0 and consumer.threads.overdue == 2
        waiting = enqueue_many(engine, [NewJob("plain", {}) for _ in range(3)])
        # Async work is not held up by the stuck threads.
        async_ids = enqueue_many(engine, [NewJob("quick", {}) for _ in range(5)])
        for job_id in async_ids:
            await wait_for_state(pg, job_id, "SUCCEEDED")
        for _ in range(100):
            if any(r.getMessage() == "consumer.threads_exhausted" for r in caplog.records):
                break
            await asyncio.sleep(0.05)
        assert any(r.getMessage() == "consumer.threads_exhausted" for r in caplog.records)
        for job_id in waiting:
            row = job(pg, job_id)
            assert (row["state"], row["attempt_count"]) == ("QUEUED", 0), "never claimed"
        assert consumer.counts["wakeup_no_thread"] >= 1
        release.set()  # the hogs return; their threads with them
        for job_id in waiting:
            row = await wait_for_state(pg, job_id, "SUCCEEDED", timeout=30)
            assert row["attempt_count"] == 1


async def test_a_row_locked_elsewhere_delays_that_job_only(
    services, engine: Engine, pg, db_url: DatabaseUrl, caplog: pytest.LogCaptureFixture
) -> None:
    """A producer keeps one job's row locked (an open cancel request) for longer than
    the lease, while the consumer runs 20 jobs: the other 19 finish normally, and
    nothing says the database is down."""
    registry = Registry()

    @registry.handler("work")
    async def work(j: consumers.Job) -> None:
        await asyncio.sleep(0.3)

    caplog.set_level(logging.INFO)
    ids = enqueue_many(engine, [NewJob("work", {"i": i}) for i in range(20)])
    victim, others = ids[0], ids[1:]
    with psycopg.connect(db_url.conninfo) as holder:
        holder.execute("SELECT 1 FROM jobs WHERE job_id = %s FOR UPDATE", [victim])
        async with (
            relay_running(*services),
            consumer_running(*services, registry, lease_seconds=2, heartbeat_seconds=0.3),
        ):
            for job_id in others:
                await wait_for_state(pg, job_id, "SUCCEEDED", timeout=30)
            # The victim waits the whole time, longer than a lease.
            await asyncio.sleep(2.5)
            assert job(pg, victim)["attempt_count"] == 0
            holder.rollback()  # the producer gives up its lock
            await wait_for_state(pg, victim, "SUCCEEDED", timeout=30)
    events = [r.getMessage() for r in caplog.records]
    assert "consumer.database_unavailable" not in events
    assert "consumer.lease_lost" not in events
    for job_id in ids:
        assert [a["outcome"] for a in attempts(pg, job_id)] == ["SUCCEEDED"]


async def test_a_running_jobs_row_locked_past_its_lease_is_given_up_not_stalled(
    services, engine: Engine, pg, db_url: DatabaseUrl, caplog: pytest.LogCaptureFixture
) -> None:
    """The lock arrives while the job runs: heartbeats skip it (the others renew),
    and once its lease surely ran out the handler is cancelled and reports nothing;
    the sweeper retries it after the lock goes."""
    registry = Registry()
    started: dict[uuid.UUID, asyncio.Event] = {}

    @registry.handler("long")
    async def long(j: consumers.Job) -> None:
        started.setdefault(j.id, asyncio.Event()).set()
        await asyncio.sleep(float(j.payload["seconds"]))

    caplog.set_level(logging.INFO)
    victim = enqueue(engine, "long", {"seconds": 6})
    bystander = enqueue(engine, "long", {"seconds": 4})
    async with (
        relay_running(*services),
        consumer_running(*services, registry, lease_seconds=1.5, heartbeat_seconds=0.25),
    ):
        await wait_for_state(pg, victim, "RUNNING")
        with psycopg.connect(db_url.conninfo) as holder:
            holder.execute("SELECT 1 FROM jobs WHERE job_id = %s FOR UPDATE", [victim])
            row = await wait_for_state(pg, bystander, "SUCCEEDED", timeout=30)
            assert row["attempt_count"] == 1, "the bystander's heartbeats went through"
            holder.rollback()
        row = await wait_for_state(pg, victim, "SUCCEEDED", timeout=60)
    events = [r.getMessage() for r in caplog.records]
    assert "consumer.heartbeat_deferred" in events
    assert "consumer.database_unavailable" not in events
    outcomes = [(a["attempt"], a["outcome"], a["error_code"]) for a in attempts(pg, victim)]
    assert outcomes == [(1, "RETRY_WAIT", "LEASE_EXPIRED"), (2, "SUCCEEDED", None)]


async def test_an_expired_lease_is_retried_after_the_handlers_backoff(
    services, engine: Engine, pg, db_url: DatabaseUrl
) -> None:
    """A job whose worker vanished waits its handler's backoff like any failed
    attempt, so a job that kills its worker does not take the next one down at once."""
    from hybrid_jobs.consumers.store import JobStore
    from hybrid_jobs.plumbing.db import make_pool

    registry = Registry()

    @registry.handler("fragile", backoff=Backoff(base=30, cap=60, jitter=0.1))
    async def fragile(j: consumers.Job) -> None: ...

    job_id = enqueue(engine, "fragile")
    pool = make_pool(db_url, "test", 2)
    await pool.open()
    try:
        dead = JobStore(pool, "dead-worker", lease_seconds=0.3)
        claimed = await dead.claim(
            [job_id],
            registry.claim_terms(),
            queues=registry.queues(),
            free_threads=0,
            worker_ttl=60,
        )
        assert len(claimed.claimed) == 1
    finally:
        await pool.close()
    async with relay_running(*services, sweep_interval=0.1) as relay:
        await wait_for_state(pg, job_id, "RETRY_WAIT")
        await chore_rounds(relay, "sweep", 2)
    row = job(pg, job_id)
    (lost,) = attempts(pg, job_id)
    wait = (row["run_after"] - lost["finished_at"]).total_seconds()
    assert 27 <= wait <= 33, f"retried after {wait:.1f} s, not the handler's 30 s backoff"
    assert row["last_error_code"] == "LEASE_EXPIRED"


async def test_a_hung_handler_is_stopped_by_the_default_time_limit_unless_it_opts_out(
    services, engine: Engine, pg
) -> None:
    registry = Registry()

    @registry.handler("hangs", max_attempts=1)
    async def hangs(j: consumers.Job) -> None:
        await asyncio.Event().wait()  # never set

    @registry.handler("long_on_purpose", timeout=consumers.NO_TIMEOUT)
    async def long_on_purpose(j: consumers.Job) -> None:
        await asyncio.sleep(1.5)

    hung, long_id = enqueue(engine, "hangs"), enqueue(engine, "long_on_purpose")
    async with relay_running(*services), consumer_running(*services, registry, default_timeout=0.5):
        row = await wait_for_state(pg, hung, "FAILED", timeout=20)
        assert row["last_error_code"] == "TIMEOUT"
        assert "0.5 s time limit" in row["last_error_message"]
        row = await wait_for_state(pg, long_id, "SUCCEEDED", timeout=20)
    assert row["attempt_count"] == 1, "NO_TIMEOUT ran past the default"


async def test_a_failure_keeps_its_traceback_and_a_final_one_logs_a_warning(
    services, engine: Engine, pg, caplog: pytest.LogCaptureFixture
) -> None:
    registry = Registry()

    @registry.handler("lookup", max_attempts=2, backoff=Backoff(base=0.05))
    async def lookup(j: consumers.Job) -> None:
        _ = j.payload["name"]  # a KeyError, from this line

    caplog.set_level(logging.INFO, logger="consumer")
    job_id = enqueue(engine, "lookup", {})
    async with relay_running(*services, poll_interval=0.05), consumer_running(*services, registry):
        await wait_for_state(pg, job_id, "FAILED")
    first, last = attempts(pg, job_id)
    for attempt in (first, last):
        assert attempt["error_code"] == "KeyError"
        assert "test_worker.py" in attempt["traceback"]
        assert 'j.payload["name"]' in attempt["traceback"]
    retried = [r for r in caplog.records if r.getMessage() == "consumer.attempt_failed"]
    failed = [r for r in caplog.records if r.getMessage() == "consumer.job_failed"]
    assert retried and retried[0].levelno == logging.INFO
    assert failed and failed[0].levelno == logging.WARNING
    assert "test_worker.py" in failed[0].traceback  # type: ignore[attr-defined]


async def test_one_channel_never_acks_what_was_not_claimed_or_explained(
    services, engine: Engine, pg, db_url: DatabaseUrl, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Garbage, packed and single-id deliveries, duplicates, unknown ids and a pause
    while the database is away, interleaved on one channel: every ack covers only a
    message whose every id a claim had taken or explained, garbage alone is
    rejected, a message given back during the pause was never acked, and RabbitMQ
    never closed the channel (an unknown or repeated delivery tag would)."""
    import hybrid_jobs.consumers.claimer as claimer_module

    _db, amqp, topology = services
    registry = Registry()

    @registry.handler("mixed")
    async def mixed(j: consumers.Job) -> None:
        await asyncio.sleep(0.01)

    resolved: set[uuid.UUID] = set()
    actions: list[tuple[str, Delivery, frozenset[uuid.UUID]]] = []
    real_settle, real_give_back = claimer_module.settle, claimer_module.give_back

    async def settle(delivery: Delivery, **kw: object) -> bool:
        actions.append(("ack", delivery, frozenset(resolved)))
        return await real_settle(delivery)

    async def give_back(delivery: Delivery) -> None:
        actions.append(("nack", delivery, frozenset(resolved)))
        await real_give_back(delivery)

    monkeypatch.setattr(claimer_module, "settle", settle)
    monkeypatch.setattr(claimer_module, "give_back", give_back)

    proxy = TcpProxy("127.0.0.1", 5432)
    via_proxy = DatabaseUrl.parse(
        db_url.conninfo.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    )
    ids = enqueue_many(engine, [NewJob("mixed", {"i": i}) for i in range(60)])
    garbage = [b"nope", b"", f"{ids[0]}\nnot-an-id".encode()]
    try:
        # Room for every id (no relay runs here to send back what a consumer hands
        # back: tests/test_intake.py covers that).
        async with consumer_running(
            via_proxy, amqp, topology, registry, concurrency=5, prefetch=60
        ) as consumer:
            real_claim = consumer.store.claim

            async def claim(job_ids, terms, **kw):  # type: ignore[no-untyped-def]
                # What the claim statement took or explained, as soon as it says so.
                result = await real_claim(job_ids, terms, **kw)
                resolved.update(row.job_id for row in result.claimed)
                resolved.update(
                    i for i, why in result.missed.items() if why not in ("locked", "no_thread")
                )
                return result

            consumer.store.claim = claim  # type: ignore[method-assign]
            closed: list[object] = []
            channel = consumer.inbox.queues[0].channel
            channel.close_callbacks.add(lambda *args: closed.append(args))
            bodies = [str(i).encode() for i in ids[:20]]
            bodies += ["\n".join(str(i) for i in ids[k : k + 8]).encode() for k in (20, 28, 36, 44)]
            bodies += [str(ids[5]).encode(), str(uuid.uuid4()).encode(), *garbage]
            bodies += ["\n".join(str(i) for i in ids[52:60]).encode()]
            for n, body in enumerate(bodies):
                await publish_raw(amqp.url, topology, "default", body)
                if n == 12:
                    proxy.down()  # the database goes away mid-stream
                if n == 18:
                    await asyncio.sleep(1)
                    proxy.up()
            for job_id in ids:
                await wait_for_state(pg, job_id, "SUCCEEDED", timeout=60)
            assert closed == [], "RabbitMQ closed the channel: a bad ack"
            dead = await collect(
                amqp.url, topology, "", len(garbage), timeout=10, dead_letters=True
            )
    finally:
        proxy.close()
    assert sorted(dead) == sorted(b.decode() for b in garbage)
    acked = [d for kind, d, _ in actions if kind == "ack" and not d.declined]
    for kind, delivery, seen in actions:
        if kind == "ack" and not delivery.declined:
            assert set(delivery.job_ids) <= seen, "acked before every id was claimed or explained"
    nacked = {id(d) for kind, d, _ in actions if kind == "nack"}
    assert not nacked & {id(d) for d in acked}, "a message given back had been acked"
    assert len({id(d) for d in acked}) == len(acked), "a message was acked twice"
    assert consumer.claimer.paused is False
    assert consumer.inbox.garbage == len(garbage)
    for job_id in ids:
        assert [a["outcome"] for a in attempts(pg, job_id)] == ["SUCCEEDED"]
