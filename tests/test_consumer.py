"""The consumer against real PostgreSQL and RabbitMQ: claims, leases, outcomes,
retries, the sweeper and the re-waker, a graceful stop, bad deliveries."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Backoff, Registry
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.broker import collect, publish_raw, purge, queue_depth
from tests.support.inproc import chore_rounds, consumer_running, relay_running
from tests.support.jobs import attempts, enqueue, enqueue_many, job, until, versions, wait_for_state
from tests.support.proxy import TcpProxy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def services(db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology):
    return db_url, amqp_url, topology


async def test_runs_jobs_and_records_success(services, engine: Engine, pg) -> None:
    registry = Registry()
    seen: list[tuple[uuid.UUID, int, int, object]] = []

    @registry.handler("greet")
    async def greet(j: consumers.Job) -> None:
        seen.append((j.id, j.attempt, j.generation, j.payload))

    ids = enqueue_many(engine, [NewJob("greet", {"n": i}) for i in range(50)])
    async with relay_running(*services), consumer_running(*services, registry):
        for job_id in ids:
            await wait_for_state(pg, job_id, "SUCCEEDED")
    assert sorted(s[0] for s in seen) == sorted(ids)
    assert {(s[1], s[2]) for s in seen} == {(1, 1)}
    row = job(pg, ids[0])
    assert row["lease_owner"] is None and row["finished_at"] is not None
    assert row["max_attempts"] == 5, "a handler without max_attempts gives the default budget"
    (history,) = attempts(pg, ids[0])
    assert history["outcome"] == "SUCCEEDED" and history["attempt"] == 1


async def test_duplicated_wakeups_run_the_handler_once(services, engine: Engine, pg) -> None:
    _db, amqp, topology = services
    registry = Registry()
    calls: list[uuid.UUID] = []

    @registry.handler("once")
    async def once(j: consumers.Job) -> None:
        calls.append(j.id)
        await asyncio.sleep(0.2)

    job_id = enqueue(engine, "once")
    async with relay_running(*services):
        for _ in range(5):  # the same wake-up, five more times
            await publish_raw(amqp.url, topology, "default", str(job_id).encode())
        async with consumer_running(*services, registry) as consumer:
            await wait_for_state(pg, job_id, "SUCCEEDED")
            # (one that arrives while the job runs here names a lease held here)
            duplicates = (
                "wakeup_duplicate",
                "wakeup_held_here",
                "wakeup_running",
                "wakeup_finished",
            )
            for _ in range(200):  # every duplicate is explained, then acked
                if sum(consumer.counts[k] for k in duplicates) == 5:
                    break
                await asyncio.sleep(0.02)
            assert sum(consumer.counts[k] for k in duplicates) == 5
            assert consumer.claimer.buffered == 0
            assert await queue_depth(amqp.url, topology, "default") == 0
    assert calls == [job_id]
    assert job(pg, job_id)["attempt_count"] == 1
    assert len(attempts(pg, job_id)) == 1


async def test_heartbeats_keep_a_long_job_alive(services, engine: Engine, pg) -> None:
    registry = Registry()

    @registry.handler("long")
    async def long(j: consumers.Job) -> None:
        await asyncio.sleep(4)

    job_id = enqueue(engine, "long")
    async with (
        relay_running(*services, sweep_interval=0.1),
        consumer_running(*services, registry, lease_seconds=1.0, heartbeat_seconds=0.25),
    ):
        row = await wait_for_state(pg, job_id, "SUCCEEDED", timeout=20)
    assert row["lease_generation"] == 1, "never swept, never claimed twice"
    assert row["attempt_count"] == 1
    assert [a["outcome"] for a in attempts(pg, job_id)] == ["SUCCEEDED"]


async def test_a_lost_lease_cancels_the_handler_and_reports_nothing(
    services, engine: Engine, pg
) -> None:
    registry = Registry()
    started, cancelled = asyncio.Event(), asyncio.Event()

    @registry.handler("victim")
    async def victim(j: consumers.Job) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job_id = enqueue(engine, "victim")
    async with (
        relay_running(*services),
        consumer_running(*services, registry, lease_seconds=2, heartbeat_seconds=0.3) as consumer,
    ):
        await asyncio.wait_for(started.wait(), 20)
        # Someone else takes the job over: a newer generation under another owner.
        pg.execute(
            "UPDATE jobs SET lease_generation = lease_generation + 1, lease_owner = 'thief'"
            " WHERE job_id = %s",
            [job_id],
        )
        await asyncio.wait_for(cancelled.wait(), 10)
        assert job_id not in consumer.ledger, "given up: no outcome will be reported"
        assert consumer.ledger.pending_outcomes() == 0
    row = job(pg, job_id)
    assert (row["state"], row["lease_owner"]) == ("RUNNING", "thief"), "nothing was reported"
    assert attempts(pg, job_id) == []


async def test_retries_follow_the_backoff_then_fail(services, engine: Engine, pg) -> None:
    registry = Registry()

    @registry.handler("flaky", max_attempts=4, backoff=Backoff(base=0.3, cap=10, jitter=0.0))
    async def flaky(j: consumers.Job) -> None:
        raise ConnectionResetError(f"upstream hung up on attempt {j.attempt}")

    job_id = enqueue(engine, "flaky")
    async with relay_running(*services, poll_interval=0.05), consumer_running(*services, registry):
        row = await wait_for_state(pg, job_id, "FAILED", timeout=30)
    history = attempts(pg, job_id)
    assert [a["attempt"] for a in history] == [1, 2, 3, 4]
    assert [a["outcome"] for a in history] == ["RETRY_WAIT"] * 3 + ["FAILED"]
    assert {a["error_code"] for a in history} == {"ConnectionResetError"}
    gaps = [
        (b["started_at"] - a["finished_at"]).total_seconds() for a, b in itertools.pairwise(history)
    ]
    # The back-off runs from the outcome's transaction start (now()), the attempt's
    # end is stamped statement_timestamp(), which PostgreSQL resets per protocol
    # message: a loaded CI run measured 0.283 s for a 0.3 s back-off.
    for gap, expected in zip(gaps, [0.3, 0.6, 1.2], strict=True):
        assert expected - 0.1 <= gap < expected + 1.5, f"gaps {gaps}"
    assert row["attempt_count"] == 4 and row["max_attempts"] == 4
    assert row["last_error_code"] == "ConnectionResetError"
    assert "attempt 4" in row["last_error_message"]


async def test_permanent_fails_at_once_and_retry_takes_its_delay(
    services, engine: Engine, pg
) -> None:
    registry = Registry()

    @registry.handler("declined", max_attempts=10)
    async def declined(j: consumers.Job) -> None:
        raise consumers.Permanent("card declined", code="CARD_DECLINED")

    @registry.handler("later")
    async def later(j: consumers.Job) -> None:
        if j.attempt == 1:
            raise consumers.Retry(delay=timedelta(hours=1), reason="come back later")

    a = enqueue(engine, "declined")
    b = enqueue(engine, "later")
    async with relay_running(*services), consumer_running(*services, registry):
        row = await wait_for_state(pg, a, "FAILED")
        waiting = await wait_for_state(pg, b, "RETRY_WAIT")
    assert (row["attempt_count"], row["last_error_code"]) == (1, "CARD_DECLINED")
    assert len(attempts(pg, a)) == 1
    delay = pg.execute("SELECT run_after - now() FROM jobs WHERE job_id = %s", [b]).fetchone()[0]
    assert timedelta(minutes=59) < delay <= timedelta(hours=1)
    assert waiting["last_error_code"] == "RETRY"


async def test_handler_timeout_is_a_failed_attempt(services, engine: Engine, pg) -> None:
    registry = Registry()

    @registry.handler("slow", timeout=0.2, max_attempts=1)
    async def slow(j: consumers.Job) -> None:
        await asyncio.sleep(10)

    job_id = enqueue(engine, "slow")
    async with relay_running(*services), consumer_running(*services, registry):
        row = await wait_for_state(pg, job_id, "FAILED")
    assert row["last_error_code"] == "TIMEOUT"


async def test_handler_budget_applies_to_jobs_enqueued_without_one(
    services, engine: Engine, pg
) -> None:
    registry = Registry()

    @registry.handler("budgeted", max_attempts=2, backoff=Backoff(base=0.05))
    async def budgeted(j: consumers.Job) -> None:
        raise ValueError("no")

    default = enqueue(engine, "budgeted")
    explicit = enqueue(engine, "budgeted", max_attempts=3)
    async with relay_running(*services, poll_interval=0.05), consumer_running(*services, registry):
        a = await wait_for_state(pg, default, "FAILED")
        b = await wait_for_state(pg, explicit, "FAILED")
    assert (a["attempt_count"], a["max_attempts"]) == (2, 2)
    assert (b["attempt_count"], b["max_attempts"]) == (3, 3), "the producer's budget wins"


async def test_a_job_no_consumer_knows_waits_and_runs_when_its_handler_arrives(
    services, engine: Engine, pg
) -> None:
    old, new = Registry(), Registry()

    @old.handler("known")
    async def known(j: consumers.Job) -> None:
        return None

    @new.handler("brand_new")
    async def brand_new(j: consumers.Job) -> None:
        return None

    job_id = enqueue(engine, "brand_new")
    # The periodic re-wake is far away: only the new consumer's announcement can
    # bring the job back in time.
    async with relay_running(*services, rewake_interval=300):
        async with consumer_running(*services, old) as consumer:
            # The claim's commit is visible before the consumer has read its answer
            # and counted it: wait for both.
            for _ in range(200):
                if (
                    job(pg, job_id)["delay_reason"] == "NO_HANDLER"
                    and consumer.counts["wakeup_no_handler"]
                ):
                    break
                await asyncio.sleep(0.05)
            assert consumer.counts["wakeup_no_handler"] == 1
        row = job(pg, job_id)
        assert (row["state"], row["delay_reason"], row["attempt_count"]) == (
            "QUEUED",
            "NO_HANDLER",
            0,
        ), "it waits, spending no attempt"
        assert row["max_attempts"] is None, "the budget waits for a handler that knows the type"
        assert pg.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0, "parked, not churned"
        async with consumer_running(*services, new):
            row = await wait_for_state(pg, job_id, "SUCCEEDED", timeout=10)
    assert row["delay_reason"] is None
    assert [a["outcome"] for a in attempts(pg, job_id)] == ["SUCCEEDED"]


async def test_sync_handlers_run_in_threads_and_can_use_a_transaction(
    services, engine: Engine, pg
) -> None:
    pg.execute("CREATE TABLE receipts (order_id int PRIMARY KEY)")
    registry = Registry()
    threads: list[str] = []
    together = threading.Barrier(6, timeout=10)

    @registry.handler("blocking", queue="sync")
    def blocking(j: consumers.Job) -> None:
        threads.append(threading.current_thread().name)
        # All six must be inside at once to pass: they run side by side, in threads,
        # not one after another (nor in the event loop, which this would stall).
        together.wait()
        with j.transaction() as tx:
            if tx.once(f"receipt:{j.payload['order']}"):
                tx.execute("INSERT INTO receipts VALUES (%s)", [j.payload["order"]])

    ids = enqueue_many(
        engine, [NewJob("blocking", {"order": i % 3}, queue="sync") for i in range(6)]
    )
    async with relay_running(*services), consumer_running(*services, registry, concurrency=6):
        for job_id in ids:
            await wait_for_state(pg, job_id, "SUCCEEDED")
    assert all(name.startswith("handler") for name in threads)
    assert pg.execute("SELECT count(*) FROM receipts").fetchone()[0] == 3


async def test_effects_commit_with_success_and_only_once_per_key(
    services, engine: Engine, pg
) -> None:
    pg.execute("CREATE TABLE sent_emails (order_id int, job_id uuid)")
    registry = Registry()

    @registry.handler("receipt")
    async def receipt(j: consumers.Job) -> None:
        async with j.transaction() as tx:
            if await tx.once(f"receipt:{j.payload['order']}"):
                await tx.execute(
                    "INSERT INTO sent_emails VALUES (%s, %s)", [j.payload["order"], j.id]
                )
            if j.payload.get("explode"):
                raise RuntimeError("fails after writing: the write must roll back")

    ids = enqueue_many(
        engine,
        [
            NewJob("receipt", {"order": 1}),
            NewJob("receipt", {"order": 1}),
            NewJob("receipt", {"order": 2, "explode": True}, max_attempts=1),
        ],
    )
    async with relay_running(*services), consumer_running(*services, registry):
        await wait_for_state(pg, ids[0], "SUCCEEDED")
        await wait_for_state(pg, ids[1], "SUCCEEDED")
        await wait_for_state(pg, ids[2], "FAILED")
    assert pg.execute("SELECT order_id FROM sent_emails").fetchall() == [(1,)]
    assert pg.execute("SELECT effect_key FROM job_effects").fetchall() == [("receipt:1",)]


async def test_cancel_request_reaches_the_running_handler(services, engine: Engine, pg) -> None:
    registry = Registry()
    running = asyncio.Event()

    @registry.handler("cancellable")
    async def cancellable(j: consumers.Job) -> None:
        running.set()
        while not j.cancel_requested:
            await asyncio.sleep(0.05)
        raise consumers.Cancel("stopped at a safe point")

    queued_id = enqueue(engine, "cancellable", run_after=timedelta(hours=1))
    job_id = enqueue(engine, "cancellable")
    async with (
        relay_running(*services),
        consumer_running(*services, registry, lease_seconds=1.5, heartbeat_seconds=0.2),
    ):
        await asyncio.wait_for(running.wait(), 20)
        with Session(engine) as session, session.begin():
            assert outbox.request_cancel(session, job_id) == "CANCEL_REQUESTED"
            assert outbox.request_cancel(session, queued_id) == "CANCELLED"
        row = await wait_for_state(pg, job_id, "CANCELLED")
    assert row["lease_owner"] is None
    assert [a["outcome"] for a in attempts(pg, job_id)] == ["CANCELLED"]
    with Session(engine) as session, session.begin():
        assert outbox.request_cancel(session, job_id) == "CANCELLED", "finished: unchanged"
        assert outbox.request_cancel(session, uuid.uuid4()) is None


async def test_sweeper_retries_expired_leases_and_records_the_lost_attempt(
    services, engine: Engine, pg
) -> None:
    registry = Registry()

    @registry.handler("swept")
    async def swept(j: consumers.Job) -> None:
        return None

    retried, exhausted, cancelling = (
        enqueue(engine, "swept", run_after=timedelta(hours=1)),
        enqueue(engine, "swept", run_after=timedelta(hours=1), max_attempts=1),
        enqueue(engine, "swept", run_after=timedelta(hours=1)),
    )
    # A worker that claimed them and died: leases already expired, no heartbeat.
    pg.execute(
        "UPDATE jobs SET state = CASE WHEN job_id = %s THEN 'CANCEL_REQUESTED' ELSE 'RUNNING' END,"
        " lease_owner = 'dead-worker', lease_expires_at = now() - interval '1 second',"
        " lease_generation = 1, attempt_count = 1, started_at = now(), run_after = now()",
        [cancelling],
    )
    async with relay_running(*services), consumer_running(*services, registry):
        await wait_for_state(pg, retried, "SUCCEEDED")
        await wait_for_state(pg, exhausted, "FAILED")
        await wait_for_state(pg, cancelling, "CANCELLED")
    lost, done = attempts(pg, retried)
    assert (lost["outcome"], lost["error_code"], lost["worker"]) == (
        "RETRY_WAIT",
        "LEASE_EXPIRED",
        "dead-worker",
    )
    assert (done["attempt"], done["outcome"], done["lease_generation"]) == (2, "SUCCEEDED", 2)
    assert job(pg, exhausted)["last_error_code"] == "LEASE_EXPIRED"
    assert [a["outcome"] for a in attempts(pg, cancelling)] == ["CANCELLED"]


async def test_rewaker_recovers_jobs_whose_wakeups_were_purged(
    services, engine: Engine, pg
) -> None:
    _db, amqp, topology = services
    registry = Registry()

    @registry.handler("lost")
    async def lost(j: consumers.Job) -> None:
        return None

    async with relay_running(*services, rewake_interval=1.0) as relay:
        ids = enqueue_many(engine, [NewJob("lost", {"i": i}) for i in range(20)])
        for _ in range(100):
            if relay.published == 20:
                break
            await asyncio.sleep(0.05)
        assert await queue_depth(amqp.url, topology, "default") >= 1
        await purge(amqp.url, topology, "default")
        async with consumer_running(*services, registry):
            for job_id in ids:
                await wait_for_state(pg, job_id, "SUCCEEDED", timeout=20)
        assert relay.published == 40, "one re-wake each, no flood"


async def test_rewaker_leaves_a_backlog_alone(services, engine: Engine, pg) -> None:
    """Wake-ups still waiting in RabbitMQ are not lost: no duplicates for them."""
    _db, amqp, topology = services
    async with relay_running(*services, rewake_interval=0.5) as relay:
        enqueue_many(engine, [NewJob("nobody_home", {}) for _ in range(10)])
        # Several re-waker rounds pass while the wake-ups wait in the queue.
        await chore_rounds(relay, "rewake", 4)
        assert relay.published == 10
    assert await queue_depth(amqp.url, topology, "default") >= 1
    in_flight = pg.execute("SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL").fetchone()[0]
    assert in_flight == 10


async def test_garbage_deliveries_go_to_the_dead_letter_queue(services, engine: Engine, pg) -> None:
    _db, amqp, topology = services
    registry = Registry()

    @registry.handler("fine")
    async def fine(j: consumers.Job) -> None:
        return None

    garbage = [b"", b"not-a-uuid", b"\xff\xfe\x00", b"x" * 1_000_000, b'{"job_id": 1}']
    job_id = enqueue(engine, "fine")
    async with relay_running(*services), consumer_running(*services, registry) as consumer:
        for body in garbage:
            await publish_raw(amqp.url, topology, "default", body)
        nonexistent = uuid.uuid4()
        await publish_raw(amqp.url, topology, "default", str(nonexistent).encode())
        await wait_for_state(pg, job_id, "SUCCEEDED")
        dead = await collect(amqp.url, topology, "", len(garbage), timeout=10, dead_letters=True)
        late = enqueue(engine, "fine")
        await wait_for_state(pg, late, "SUCCEEDED")
        assert consumer.inbox.garbage == len(garbage)
        assert consumer.counts["wakeup_missing"] == 1
    assert len(dead) == len(garbage)
    assert "not-a-uuid" in dead


async def test_database_outage_pauses_consuming_and_loses_nothing(
    services, engine: Engine, pg
) -> None:
    db, amqp, topology = services
    registry = Registry()

    @registry.handler("steady")
    async def steady(j: consumers.Job) -> None:
        return None

    proxy = TcpProxy("127.0.0.1", 5432)
    via_proxy = DatabaseUrl.parse(db.conninfo.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}"))
    try:
        async with (
            relay_running(*services),
            consumer_running(via_proxy, amqp, topology, registry) as consumer,
        ):
            first = enqueue(engine, "steady")
            await wait_for_state(pg, first, "SUCCEEDED")
            proxy.down()
            ids = enqueue_many(engine, [NewJob("steady", {}) for _ in range(30)])
            for _ in range(100):
                if consumer.claimer.paused:
                    break
                await asyncio.sleep(0.1)
            assert consumer.claimer.paused, "consuming pauses while the database is away"
            for _ in range(100):
                if await queue_depth(amqp.url, topology, "default") > 0:
                    break
                await asyncio.sleep(0.1)
            assert await queue_depth(amqp.url, topology, "default") > 0, "deliveries went back"
            assert not consumer.claimer.buffered
            proxy.up()
            for job_id in ids:
                await wait_for_state(pg, job_id, "SUCCEEDED", timeout=30)
    finally:
        proxy.close()
    assert pg.execute("SELECT max(attempt_count) FROM jobs").fetchone()[0] == 1


async def test_stale_completion_is_rejected_by_the_fence(
    services, engine: Engine, pg, db_url: DatabaseUrl
) -> None:
    """Worker A claims, stalls past its lease, the sweeper re-queues, worker B claims
    and finishes; A's late heartbeat, outcome and transaction all bounce."""
    from hybrid_jobs.consumers.job import Job, Resources
    from hybrid_jobs.consumers.outcome import Outcome
    from hybrid_jobs.consumers.store import JobStore
    from hybrid_jobs.plumbing.db import make_pool
    from hybrid_jobs.schema.queries import JOB_SWEEP_EXPIRED

    pg.execute("CREATE TABLE effects_log (writer text)")
    job_id = enqueue(engine, "contested")
    pool = make_pool(db_url, "test", 4)
    await pool.open()
    try:
        a = JobStore(pool, "worker-a", lease_seconds=0.5)
        b = JobStore(pool, "worker-b", lease_seconds=30)
        terms = Registry()

        @terms.handler("contested")
        async def contested(j: consumers.Job) -> None: ...

        claim = {"queues": ["default"], "free_threads": 0, "worker_ttl": 60}
        (claim_a,) = (await a.claim([job_id], terms.claim_terms(), **claim)).claimed
        await asyncio.sleep(0.7)
        swept = pg.execute(JOB_SWEEP_EXPIRED, {"limit": 10, "default_backoff": 5}).fetchall()
        assert [(r[0], r[1]) for r in swept] == [(job_id, "RETRY_WAIT")]
        pg.execute("UPDATE jobs SET run_after = now() WHERE job_id = %s", [job_id])  # backoff over
        (claim_b,) = (await b.claim([job_id], terms.claim_terms(), **claim)).claimed
        assert (claim_a.generation, claim_b.generation) == (1, 2)

        assert await a.heartbeat([(job_id, 1)]) == {job_id: (None, False)}
        late = await a.finish([(job_id, 1, Outcome.succeeded())])
        assert (late.applied, late.locked, late.stale) == ({}, set(), {job_id})
        resources = Resources(
            "worker-a",
            pool,
            lambda: None,  # type: ignore[arg-type,return-value]
            asyncio.get_running_loop(),
        )
        stale_job = Job.from_claim(claim_a, resources, time.monotonic(), 0.5)
        with pytest.raises(consumers.LeaseLost):
            async with stale_job.transaction() as tx:
                await tx.execute("INSERT INTO effects_log VALUES ('a')")
        assert pg.execute("SELECT count(*) FROM effects_log").fetchone()[0] == 0

        done = await b.finish([(job_id, 2, Outcome.succeeded())])
        assert done.applied == {job_id: "SUCCEEDED"} and not done.stale
    finally:
        await pool.close()
    row = job(pg, job_id)
    assert (row["state"], row["lease_generation"], row["attempt_count"]) == ("SUCCEEDED", 2, 2)
    assert [(h["worker"], h["outcome"]) for h in attempts(pg, job_id)] == [
        ("worker-a", "RETRY_WAIT"),
        ("worker-b", "SUCCEEDED"),
    ]


async def test_wakeup_for_a_missing_or_early_job_is_acked(services, engine: Engine, pg) -> None:
    _db, amqp, topology = services
    registry = Registry()

    @registry.handler("later")
    async def later(j: consumers.Job) -> None:
        return None

    early = enqueue(engine, "later", run_after=timedelta(hours=1))
    async with consumer_running(*services, registry) as consumer:
        await publish_raw(amqp.url, topology, "default", str(early).encode())
        await publish_raw(amqp.url, topology, "default", str(uuid.uuid4()).encode())
        for _ in range(100):
            if consumer.counts["wakeup_early"] and consumer.counts["wakeup_missing"]:
                break
            await asyncio.sleep(0.05)
        assert consumer.counts["wakeup_early"] == 1
        assert consumer.counts["wakeup_missing"] == 1
    assert job(pg, early)["state"] == "QUEUED"
    assert await queue_depth(amqp.url, topology, "default") == 0


async def test_a_wakeup_for_a_job_of_another_queue_does_not_run_it(
    services, engine: Engine, pg
) -> None:
    """A wake-up naming a job of a queue the consumer does not serve (anyone with
    access to the broker can publish one) is acked and dropped: the job is not run,
    its row and its own wake-up are left exactly as they were, and a consumer of its
    queue runs it."""
    _db, amqp, topology = services
    registry = Registry()
    ran: list[uuid.UUID] = []

    @registry.handler("portable")  # a handler here, for a job of another queue
    async def portable(j: consumers.Job) -> None:
        ran.append(j.id)

    job_id = enqueue(engine, "portable", queue="other")
    before = versions(pg, [job_id])
    async with consumer_running(*services, registry, queues=("default",)) as consumer:
        await publish_raw(amqp.url, topology, "default", str(job_id).encode())
        await until(lambda: consumer.counts["wakeup_other_queue"] or ran, "the wake-up explained")
        assert ran == [], "a job of a queue the consumer does not serve ran"
        assert consumer.counts["wakeup_other_queue"] == 1
        assert consumer.claimer.buffered == 0
    assert await queue_depth(amqp.url, topology, "default") == 0, "the stray wake-up was acked"
    assert versions(pg, [job_id]) == before, "the job's row was not written"
    assert job(pg, job_id)["state"] == "QUEUED"
    own = pg.execute("SELECT queue, sent_at FROM outbox WHERE job_id = %s", [job_id]).fetchall()
    assert own == [("other", None)], "its own wake-up waits to be sent"
    async with relay_running(*services), consumer_running(*services, registry, queues=("other",)):
        await wait_for_state(pg, job_id, "SUCCEEDED")
    assert ran == [job_id]


async def test_broker_connection_loss_is_survived(services, engine: Engine, pg) -> None:
    db, _amqp, topology = services
    registry = Registry()

    @registry.handler("through")
    async def through(j: consumers.Job) -> None:
        await asyncio.sleep(0.01)

    proxy = TcpProxy("127.0.0.1", 5672)
    via = AmqpUrl.parse(f"amqp://127.0.0.1:{proxy.port}/")
    try:
        async with relay_running(*services), consumer_running(db, via, topology, registry):
            ids = []
            for _ in range(4):
                ids += enqueue_many(engine, [NewJob("through", {}) for _ in range(25)])
                await asyncio.sleep(0.3)
                proxy.cut()
            for job_id in ids:
                await wait_for_state(pg, job_id, "SUCCEEDED", timeout=60)
    finally:
        proxy.close()


async def test_handlers_that_misbehave_fail_their_attempt_not_the_worker(
    services, engine: Engine, pg
) -> None:
    registry = Registry()

    @registry.handler("exits", max_attempts=1)
    async def exits(j: consumers.Job) -> None:
        raise SystemExit(3)

    @registry.handler("self_cancels", max_attempts=1)
    async def self_cancels(j: consumers.Job) -> None:
        inner = asyncio.ensure_future(asyncio.sleep(10))
        inner.cancel()
        await inner  # CancelledError from inside the handler, not from the consumer

    @registry.handler("dirty_error", max_attempts=1)
    async def dirty_error(j: consumers.Job) -> None:
        raise ValueError("nul \x00 and a lone surrogate \ud800 and " + "x" * 5000)

    @registry.handler("bad_retry", max_attempts=1)
    async def bad_retry(j: consumers.Job) -> None:
        raise consumers.Retry(delay=float("inf"))

    ids = {t: enqueue(engine, t) for t in ("exits", "self_cancels", "dirty_error", "bad_retry")}
    after = enqueue(engine, "exits", max_attempts=2)
    async with relay_running(*services), consumer_running(*services, registry):
        rows = {t: await wait_for_state(pg, i, "FAILED") for t, i in ids.items()}
        assert (await wait_for_state(pg, after, "FAILED"))["attempt_count"] == 2
    assert rows["exits"]["last_error_code"] == "SystemExit"
    assert rows["self_cancels"]["last_error_code"] == "asyncio.exceptions.CancelledError"
    message = rows["dirty_error"]["last_error_message"]
    assert "\x00" not in message and len(message) <= 2000 and message.startswith("ValueError: nul")
    assert rows["bad_retry"]["last_error_code"] == "ValueError", "an infinite delay is refused"


async def test_a_sync_timeout_starts_when_a_thread_takes_the_job(
    services, engine: Engine, pg
) -> None:
    registry = Registry()

    @registry.handler("hog", timeout=0.3, max_attempts=1)
    def hog(j: consumers.Job) -> None:
        time.sleep(1.5)  # outlives its timeout; its thread stays busy

    @registry.handler("quick", timeout=0.3, max_attempts=1)
    def quick(j: consumers.Job) -> None:
        time.sleep(0.05)

    hog_id = enqueue(engine, "hog")
    async with relay_running(*services), consumer_running(*services, registry, concurrency=1):
        await wait_for_state(pg, hog_id, "FAILED")
        quick_id = enqueue(engine, "quick")  # waits for the hog's thread, then runs
        row = await wait_for_state(pg, quick_id, "SUCCEEDED", "FAILED")
    assert job(pg, hog_id)["last_error_code"] == "TIMEOUT"
    assert row["state"] == "SUCCEEDED", row["last_error_code"]


async def test_zero_drain_gives_claims_back_at_once(services, engine: Engine, pg) -> None:
    registry = Registry()
    started, interrupted = asyncio.Event(), asyncio.Event()

    @registry.handler("long")
    async def long(j: consumers.Job) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            interrupted.set()
            raise

    job_id = enqueue(engine, "long")
    async with relay_running(*services):
        async with consumer_running(*services, registry, drain_seconds=0):
            await asyncio.wait_for(started.wait(), 20)
        assert interrupted.is_set(), "no drain: the handler was stopped, not waited for"
    row = job(pg, job_id)
    assert (row["state"], row["attempt_count"]) == ("QUEUED", 0)


async def test_a_claim_whose_commit_was_lost_still_runs_its_jobs(
    services, engine: Engine, pg
) -> None:
    """The connection drops after the claim committed: the retry claims nothing,
    yet the jobs are this worker's and must run, not wait out their lease."""
    import psycopg as pg_driver

    registry = Registry()

    @registry.handler("lucky")
    async def lucky(j: consumers.Job) -> None:
        return None

    job_id = enqueue(engine, "lucky")
    async with consumer_running(*services, registry, lease_seconds=300) as consumer:
        real_claim = consumer.store.claim
        calls = 0

        async def claim_then_drop(job_ids, terms, **kw):
            nonlocal calls
            calls += 1
            rows = await real_claim(job_ids, terms, **kw)
            if calls == 1:
                raise pg_driver.OperationalError("server closed the connection unexpectedly")
            return rows

        consumer.store.claim = claim_then_drop  # type: ignore[method-assign]
        async with relay_running(*services):
            row = await wait_for_state(pg, job_id, "SUCCEEDED", timeout=20)
    assert calls == 2
    assert (row["attempt_count"], row["lease_generation"]) == (1, 1)


@pytest.mark.parametrize("kind", ["async", "plain"])
async def test_a_failed_completion_leaves_the_job_held_like_any_other(
    services, engine: Engine, pg, kind: str
) -> None:
    """The job's own transaction fails while completing (here a trigger of the
    test's refuses it) and the handler goes on: the job must not look "writing" for
    ever, so a lost lease still stops its handler."""
    pg.execute(
        "CREATE FUNCTION refuse_completion() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN IF NEW.state = 'SUCCEEDED' THEN RAISE EXCEPTION 'refused by the test';"
        " END IF; RETURN NEW; END $$"
    )
    pg.execute(
        "CREATE TRIGGER refuse_completion BEFORE UPDATE ON jobs"
        " FOR EACH ROW EXECUTE FUNCTION refuse_completion()"
    )
    registry = Registry()
    refused, stopped = threading.Event(), threading.Event()

    @registry.handler("completes_async")
    async def completes_async(j: consumers.Job) -> None:
        try:
            async with j.transaction():
                pass
        except Exception:
            refused.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.set()
            raise

    @registry.handler("completes_plain", queue="sync")
    def completes_plain(j: consumers.Job) -> None:
        try:
            with j.transaction():
                pass
        except Exception:
            refused.set()
        for _ in range(300):  # a plain function stops at its own safe points
            if j.lease_surely_expired() or stopped.is_set():
                break
            time.sleep(0.1)

    job_id = enqueue(engine, f"completes_{kind}", queue="default" if kind == "async" else "sync")
    async with (
        relay_running(*services),
        consumer_running(
            *services, registry, queues=("default", "sync"), lease_seconds=2, heartbeat_seconds=0.3
        ) as consumer,
    ):
        await asyncio.to_thread(refused.wait, 20)
        assert refused.is_set()
        held = consumer.ledger.held[job_id]
        assert not held.writing, "nothing is being written for this job any more"
        pg.execute(
            "UPDATE jobs SET lease_generation = lease_generation + 1, lease_owner = 'thief'"
            " WHERE job_id = %s",
            [job_id],
        )
        for _ in range(200):
            if job_id not in consumer.ledger:
                break
            await asyncio.sleep(0.05)
        assert job_id not in consumer.ledger, "the lost lease was given up"
        if kind == "async":
            await asyncio.to_thread(stopped.wait, 10)
            assert stopped.is_set(), "and its handler stopped"
        stopped.set()
