"""The metrics collector against real jobs: the relay and a consumer run them
(successes, retries, a Permanent failure, an expired lease swept by the relay with
the stale outcome the fence turns away, a cancellation, a recurring schedule), the
collector reads the tables, and the Prometheus text it serves is parsed back."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Backoff, Registry
from hybrid_jobs.consumers.store import JobStore
from hybrid_jobs.jobctl.metrics import Collector, CollectorSettings
from hybrid_jobs.jobctl.metrics.queries import LOCK_NAME
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.locks import INSTANCE_SEED
from hybrid_jobs.schema.queries import JOB_EXPIRE_WAITING, JOB_SWEEP_EXPIRED, WORKER_SEEN
from hybrid_jobs.schema.topology import Topology
from tests.support.inproc import consumer_running, relay_running
from tests.support.jobs import enqueue, wait_for_state
from tests.support.metrics import Scrape

pytestmark = pytest.mark.timeout(120)

# Every metric of the issue, with its type as the parser reports it (counters
# without their _total).
EXPECTED_TYPES = {
    "hybrid_jobs_jobs": "gauge",
    "hybrid_jobs_jobs_awaiting_approval": "gauge",
    "hybrid_jobs_jobs_waiting_for_key": "gauge",
    "hybrid_jobs_jobs_waiting_for_parents": "gauge",
    "hybrid_jobs_jobs_waiting_for_resource": "gauge",
    "hybrid_jobs_resources_uncertain": "gauge",
    "hybrid_jobs_queue_oldest_runnable_age_seconds": "gauge",
    "hybrid_jobs_outbox_unsent_rows": "gauge",
    "hybrid_jobs_outbox_oldest_unsent_age_seconds": "gauge",
    "hybrid_jobs_relays_live": "gauge",
    "hybrid_jobs_relays_publishing": "gauge",
    "hybrid_jobs_running_lease_expired_jobs": "gauge",
    "hybrid_jobs_jobs_rate_limited": "gauge",
    "hybrid_jobs_jobs_expired": "gauge",
    "hybrid_jobs_jobs_no_authorized_runner": "gauge",
    "hybrid_jobs_queue_publish_failing": "gauge",
    "hybrid_jobs_queue_wait_seconds": "histogram",
    "hybrid_jobs_execution_seconds": "histogram",
    "hybrid_jobs_attempts_finished": "counter",
    "hybrid_jobs_attempts_per_success": "histogram",
    "hybrid_jobs_leases_expired": "counter",
    "hybrid_jobs_fence_rejections": "counter",
    "hybrid_jobs_scheduler_delay_seconds": "histogram",
    "hybrid_jobs_cancellation_latency_seconds": "histogram",
    "hybrid_jobs_collector_last_success_timestamp_seconds": "gauge",
    "hybrid_jobs_collector_duration_seconds": "gauge",
    "hybrid_jobs_collector_rounds": "counter",
}
LABEL_NAMES = {"queue", "state", "job_type", "outcome", "operation", "result", "reason", "le"}


@pytest.fixture
def services(db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology):
    return db_url, amqp_url, topology


async def _poll(conn: AsyncConnection, sql: str, params: list[Any], until: Any) -> None:
    async with asyncio.timeout(30):
        while True:
            row = await (await conn.execute(sql, params)).fetchone()
            if until(row):
                return
            await asyncio.sleep(0.05)


def _registry(db_url: DatabaseUrl) -> Registry:
    registry = Registry()

    @registry.handler("ok")
    async def ok(job: consumers.Job) -> None:
        return None

    @registry.handler("tick")
    async def tick(job: consumers.Job) -> None:
        return None

    @registry.handler("flaky", max_attempts=5)
    async def flaky(job: consumers.Job) -> None:
        if job.attempt < 3:
            raise consumers.Retry(delay=0, reason="flaky says not yet")

    @registry.handler("doomed")
    async def doomed(job: consumers.Job) -> None:
        raise consumers.Permanent("doomed input, never retry")

    # The first attempt loses its lease under it: the relay's sweeper moves the job
    # to RETRY_WAIT (2 s of backoff, fixed at claim) and the attempt then reports an
    # outcome the fence must turn away. The second attempt succeeds.
    @registry.handler("stall", backoff=Backoff(base=2, cap=2, jitter=0))
    async def stall(job: consumers.Job) -> None:
        if job.attempt > 1:
            return
        async with await AsyncConnection.connect(db_url.conninfo, autocommit=True) as conn:
            await conn.execute(
                "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = %s",
                [job.id],
            )
            await _poll(
                conn,
                "SELECT state FROM jobs WHERE job_id = %s",
                [job.id],
                lambda row: row[0] == "RETRY_WAIT",
            )

    # Runs until someone asks to cancel it, then acknowledges.
    @registry.handler("cancelme")
    async def cancelme(job: consumers.Job) -> None:
        async with await AsyncConnection.connect(db_url.conninfo, autocommit=True) as conn:
            await _poll(
                conn,
                "SELECT state FROM jobs WHERE job_id = %s",
                [job.id],
                lambda row: row[0] == "CANCEL_REQUESTED",
            )
        raise consumers.Cancel()

    @registry.handler("ghostly", queue="idle")
    async def ghostly(job: consumers.Job) -> None:
        return None

    return registry


def _count(pg: psycopg.Connection, sql: str, *params: Any) -> int:
    row = pg.execute(sql, list(params)).fetchone()
    assert row is not None
    return int(row[0])


async def _wait_done(pg: psycopg.Connection, job_type: str, count: int) -> None:
    async with asyncio.timeout(30):
        while (
            _count(
                pg,
                "SELECT count(*) FROM jobs WHERE job_type = %s AND state = 'SUCCEEDED'",
                job_type,
            )
            < count
        ):
            await asyncio.sleep(0.05)


def _pause(engine: Engine, name: str) -> None:
    with Session(engine) as session, session.begin():
        outbox.pause_schedule(session, name)


async def test_metrics_of_real_jobs(
    services, engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, pool
) -> None:
    registry = _registry(db_url)
    collector = Collector(pool)
    async with (
        relay_running(*services),
        consumer_running(*services, registry, queues=["default"], worker_ttl=3.0),
    ):
        # The first round notes where the history stands and counts none of it.
        assert await collector.collect_once()
        ok = [enqueue(engine, "ok") for _ in range(3)]
        flaky = enqueue(engine, "flaky")
        doomed = enqueue(engine, "doomed")
        stall = enqueue(engine, "stall")
        cancelme = enqueue(engine, "cancelme")
        enqueue(engine, "ok", run_after=timedelta(hours=1))  # waits: QUEUED, not due
        cancelled_waiting = enqueue(engine, "ok", run_after=timedelta(hours=1))
        with Session(engine) as session, session.begin():
            outbox.schedule(session, "ticker", "tick", {}, every=timedelta(seconds=1))
            assert outbox.request_cancel(session, cancelled_waiting) == "CANCELLED"

        for job_id in ok:
            await wait_for_state(pg, job_id, "SUCCEEDED")
        await wait_for_state(pg, flaky, "SUCCEEDED")
        await wait_for_state(pg, doomed, "FAILED")
        await wait_for_state(pg, stall, "SUCCEEDED")
        await wait_for_state(pg, cancelme, "RUNNING")
        with Session(engine) as session, session.begin():
            assert outbox.request_cancel(session, cancelme) == "CANCEL_REQUESTED"
        await wait_for_state(pg, cancelme, "CANCELLED")
        # at least one occurrence fired; then no more, and every tick has run
        async with asyncio.timeout(30):
            while not _count(pg, "SELECT count(*) FROM schedule_fires"):
                await asyncio.sleep(0.05)
        # On a thread: the in-process relay may hold the schedule's row in its fire
        # transaction, which it can finish only while this event loop runs.
        await asyncio.to_thread(_pause, engine, "ticker")
        fires = _count(pg, "SELECT count(*) FROM schedule_fires WHERE outcome = 'enqueued'")
        await _wait_done(pg, "tick", fires)
        # the consumer publishes its counters with its worker row, every second here
        async with asyncio.timeout(30):
            while not _count(
                pg, "SELECT COALESCE(sum((counts->>'stale_outcome')::int), 0) FROM workers"
            ):
                await asyncio.sleep(0.05)

        assert await collector.collect_once()
        first = Scrape(collector)

        # A second round adds only what finished since.
        more = [enqueue(engine, "ok") for _ in range(2)]
        for job_id in more:
            await wait_for_state(pg, job_id, "SUCCEEDED")
        assert await collector.collect_once()
        second = Scrape(collector)
        worker_ids = {r[0] for r in pg.execute("SELECT worker_id FROM workers").fetchall()}

    assert set(EXPECTED_TYPES) <= set(first.families)
    assert {n: first.families[n].type for n in EXPECTED_TYPES} == EXPECTED_TYPES

    def finished(scrape: Scrape, job_type: str, outcome: str) -> float:
        return scrape.value(
            "hybrid_jobs_attempts_finished_total",
            queue="default",
            job_type=job_type,
            outcome=outcome,
        )

    assert finished(first, "ok", "succeeded") == 3
    assert finished(first, "ok", "failed") == 0, "every outcome of a seen job type exists"
    assert (finished(first, "flaky", "retry_scheduled"), finished(first, "flaky", "succeeded")) == (
        2,
        1,
    )
    assert finished(first, "doomed", "failed") == 1
    assert (finished(first, "stall", "retry_scheduled"), finished(first, "stall", "succeeded")) == (
        1,
        1,
    )
    assert finished(first, "cancelme", "cancelled") == 1
    assert finished(first, "tick", "succeeded") == fires
    assert first.value("hybrid_jobs_leases_expired_total", queue="default") == 1
    assert (
        first.value("hybrid_jobs_fence_rejections_total", queue="default", operation="outcome") == 1
    )
    assert (
        first.value("hybrid_jobs_fence_rejections_total", queue="default", operation="heartbeat")
        == 0
    )

    attempts = 3 + 3 + 1 + 2 + 1 + fires
    assert first.value("hybrid_jobs_queue_wait_seconds_count", queue="default") == attempts
    assert (
        first.value(
            "hybrid_jobs_execution_seconds_count",
            queue="default",
            job_type="flaky",
            outcome="retry_scheduled",
        )
        == 2
    )
    # attempt numbers of the successes: 1 (ok x3, each tick), 2 (stall), 3 (flaky)
    per_success = "hybrid_jobs_attempts_per_success"
    assert first.value(f"{per_success}_count", queue="default") == 5 + fires
    assert first.value(f"{per_success}_bucket", queue="default", le="1.0") == 3 + fires
    assert first.value(f"{per_success}_bucket", queue="default", le="2.0") == 4 + fires
    assert first.value(f"{per_success}_sum", queue="default") == 3 + 2 + 3 + fires
    # the queued job cancelled at once, and the running one that acknowledged
    assert first.value("hybrid_jobs_cancellation_latency_seconds_count") == 2
    assert 0 < first.value("hybrid_jobs_cancellation_latency_seconds_sum") < 30
    assert first.value("hybrid_jobs_scheduler_delay_seconds_count") == fires
    assert first.value("hybrid_jobs_jobs", queue="default", state="QUEUED") == 1  # not due
    assert first.value("hybrid_jobs_jobs", queue="default", state="RUNNING") == 0
    assert first.value("hybrid_jobs_queue_oldest_runnable_age_seconds", queue="default") == 0

    assert finished(second, "ok", "succeeded") == 5
    for job_type, outcome in [("flaky", "retry_scheduled"), ("doomed", "failed")]:
        assert finished(second, job_type, outcome) == finished(first, job_type, outcome)
    assert second.value("hybrid_jobs_leases_expired_total", queue="default") == 1
    assert second.value("hybrid_jobs_cancellation_latency_seconds_count") == 2
    assert second.value("hybrid_jobs_collector_rounds_total", result="collected") == 3

    # Never a job id, a worker id or error text in a label.
    forbidden = {str(r[0]) for r in pg.execute("SELECT job_id FROM jobs").fetchall()}
    forbidden |= worker_ids | {
        r[0] for r in pg.execute("SELECT DISTINCT worker FROM job_attempts").fetchall()
    }
    forbidden |= {
        r[0]
        for r in pg.execute(
            "SELECT DISTINCT error_message FROM job_attempts WHERE error_message IS NOT NULL"
        ).fetchall()
    }
    assert len(forbidden) > 15 and not forbidden & second.label_values()
    assert second.label_names() <= LABEL_NAMES


async def test_gauges_read_the_backlog(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, pool
) -> None:
    """No relay and no sweeper running: a due job waits, its wake-up is unsent, and a
    claim whose worker died stays RUNNING with its lease expired."""
    registry = _registry(db_url)
    idle = enqueue(engine, "ghostly", queue="idle")
    stuck = enqueue(engine, "ghostly", queue="idle")
    enqueue(engine, "ok", run_after=timedelta(hours=1))  # not due: no lag anywhere
    store = JobStore(pool, "ghost-worker", lease_seconds=0.1)
    claimed = await store.claim(
        [stuck], registry.claim_terms(), queues=registry.queues(), free_threads=0, worker_ttl=60
    )
    assert [c.job_id for c in claimed.claimed] == [stuck]
    await _lease_runs_out(pg, stuck)  # and nobody sweeps it

    collector = Collector(pool)
    assert await collector.collect_once()
    scrape = Scrape(collector)
    assert scrape.value("hybrid_jobs_jobs", queue="idle", state="QUEUED") == 1
    assert scrape.value("hybrid_jobs_jobs", queue="idle", state="RUNNING") == 1
    assert scrape.value("hybrid_jobs_jobs", queue="idle", state="RETRY_WAIT") == 0
    assert scrape.value("hybrid_jobs_jobs", queue="default", state="QUEUED") == 1
    assert scrape.value("hybrid_jobs_running_lease_expired_jobs", queue="idle") == 1
    assert scrape.value("hybrid_jobs_running_lease_expired_jobs", queue="default") == 0
    (created,) = pg.execute("SELECT created_at FROM jobs WHERE job_id = %s", [idle]).fetchone()
    age = scrape.value("hybrid_jobs_queue_oldest_runnable_age_seconds", queue="idle")
    assert 0 < age <= (datetime.now(UTC) - created).total_seconds() + 1
    assert scrape.value("hybrid_jobs_queue_oldest_runnable_age_seconds", queue="default") == 0
    # the two due wake-ups; the later job's is not due, so not lag
    assert scrape.value("hybrid_jobs_outbox_unsent_rows") == 2
    assert 0 < scrape.value("hybrid_jobs_outbox_oldest_unsent_age_seconds") < 60

    # The sweeper's statement moves the job on; the next round sees it gone from
    # RUNNING, and counts the expired lease.
    swept = pg.execute(JOB_SWEEP_EXPIRED, {"limit": 10, "default_backoff": 5}).fetchall()
    assert [(r[0], r[1]) for r in swept] == [(stuck, "RETRY_WAIT")]
    assert await collector.collect_once()
    again = Scrape(collector)
    assert again.value("hybrid_jobs_running_lease_expired_jobs", queue="idle") == 0
    assert again.value("hybrid_jobs_jobs", queue="idle", state="RUNNING") == 0
    assert again.value("hybrid_jobs_jobs", queue="idle", state="RETRY_WAIT") == 1
    assert again.value("hybrid_jobs_leases_expired_total", queue="idle") == 1
    assert (
        again.value(
            "hybrid_jobs_attempts_finished_total",
            queue="idle",
            job_type="ghostly",
            outcome="retry_scheduled",
        )
        == 1
    )


async def test_gauges_of_rate_limited_and_expired_jobs(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, pool
) -> None:
    """A claim that finds no token leaves the job RATE_LIMITED; the relay's sweep
    ends a job past its deadline: each counted in its queue."""
    registry = _registry(db_url)
    with Session(engine) as session, session.begin():
        outbox.set_rate_limit(session, "slow", rate=1, per=timedelta(hours=1), burst=1)
    first, second = (enqueue(engine, "ok", queue="idle", rate_limit="slow") for _ in range(2))
    # Delayed past its deadline, as a retry's backoff can leave a job.
    late = enqueue(engine, "ok", run_after=timedelta(hours=1), expires=timedelta(hours=2))
    pg.execute("UPDATE jobs SET expires_at = now() WHERE job_id = %s", [late])
    store = JobStore(pool, "a-worker", lease_seconds=30)
    claimed = await store.claim(
        [first, second],
        registry.claim_terms(),
        queues=registry.queues(),
        free_threads=0,
        worker_ttl=60,
    )
    assert len(claimed.claimed) == 1 and list(claimed.missed.values()) == ["RATE_LIMITED"]
    assert len(pg.execute(JOB_EXPIRE_WAITING, {"limit": 10}).fetchall()) == 1
    collector = Collector(pool)
    assert await collector.collect_once()
    scrape = Scrape(collector)
    assert scrape.value("hybrid_jobs_jobs_rate_limited", queue="idle") == 1
    assert scrape.value("hybrid_jobs_jobs_rate_limited", queue="default") == 0
    assert scrape.value("hybrid_jobs_jobs_expired", queue="default") == 1
    assert scrape.value("hybrid_jobs_jobs_expired", queue="idle") == 0


async def test_gauges_of_jobs_waiting_for_parents_and_for_a_resource(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, pool
) -> None:
    """Children enqueued after= a parent are counted waiting for it until its end
    settles them; of two jobs of one resource, the one a claim turned down is counted
    RESOURCE_BUSY in its queue."""
    registry = _registry(db_url)
    with Session(engine) as session, session.begin():
        parent = outbox.enqueue(session, "ok", {}, queue="idle")
        for _ in range(2):
            outbox.enqueue(session, "ok", {}, queue="idle", after=[parent])
        outbox.enqueue(session, "ok", {}, after=[parent], on_parent_failure="run")
    first, second = (enqueue(engine, "ok", resource="deploy:prod") for _ in range(2))
    store = JobStore(pool, "a-worker", lease_seconds=30)
    claimed = await store.claim(
        [first, second],
        registry.claim_terms(),
        queues=registry.queues(),
        free_threads=0,
        worker_ttl=60,
    )
    assert len(claimed.claimed) == 1 and list(claimed.missed.values()) == ["RESOURCE_BUSY"]
    collector = Collector(pool)
    assert await collector.collect_once()
    scrape = Scrape(collector)
    waiting = "hybrid_jobs_jobs_waiting_for_parents"
    assert (scrape.value(waiting, queue="idle"), scrape.value(waiting, queue="default")) == (2, 1)
    busy = "hybrid_jobs_jobs_waiting_for_resource"
    assert scrape.value(busy, queue="default", reason="RESOURCE_BUSY") == 1
    assert scrape.value(busy, queue="default", reason="RESOURCE_UNCERTAIN") == 0
    assert scrape.value(busy, queue="idle", reason="RESOURCE_BUSY") == 0
    # The parent's end settles its children: cancelled under "cancel", due under "run".
    with Session(engine) as session, session.begin():
        outbox.request_cancel(session, parent)
    assert await collector.collect_once()
    again = Scrape(collector)
    assert (again.value(waiting, queue="idle"), again.value(waiting, queue="default")) == (0, 0)


async def test_relays_and_a_paused_queues_backlog(
    engine: Engine, pg: psycopg.Connection, pool
) -> None:
    """The relays' gauges count live rows of `relays` (not stale ones), and a paused
    queue's wake-ups are not counted as waiting for the relay."""
    pg.execute(
        "INSERT INTO relays (relay_id, host, pid, last_seen_at, broker_connected) VALUES"
        " ('a:1:x', 'a', 1, now(), true), ('b:2:y', 'b', 2, now(), false),"
        " ('c:3:z', 'c', 3, now() - interval '5 minutes', true)"
    )
    enqueue(engine, "ok", queue="held")
    enqueue(engine, "ok", queue="held")
    enqueue(engine, "ok", queue="open")
    with Session(engine) as session, session.begin():
        outbox.pause_queue(session, "held", by="test")

    collector = Collector(pool)
    assert await collector.collect_once()
    scrape = Scrape(collector)
    assert scrape.value("hybrid_jobs_relays_live") == 2
    assert scrape.value("hybrid_jobs_relays_publishing") == 1
    assert scrape.value("hybrid_jobs_outbox_unsent_rows") == 1, "only the open queue's"

    pg.execute("UPDATE relays SET broker_connected = false")
    with Session(engine) as session, session.begin():
        outbox.resume_queue(session, "held")
    assert await collector.collect_once()
    again = Scrape(collector)
    assert again.value("hybrid_jobs_relays_publishing") == 0
    assert again.value("hybrid_jobs_outbox_unsent_rows") == 3


async def test_queues_a_relay_cannot_publish_to(pg: psycopg.Connection, pool) -> None:
    """Live relays' failing queues, counted per queue and reason; a stale relay's
    are not, and a queue that recovers has no series."""
    failing = (
        '{"mail": {"reason": "refused", "detail": "nacked", "since": "2026-01-01T00:00:00+00:00",'
        ' "failures": 3}}'
    )
    pg.execute(
        "INSERT INTO relays (relay_id, host, pid, last_seen_at, failing_queues) VALUES"
        " ('a:1:x', 'a', 1, now(), %(f)s), ('b:2:y', 'b', 2, now(), %(f)s),"
        " ('c:3:z', 'c', 3, now() - interval '5 minutes', %(f)s)",
        {"f": failing},
    )
    collector = Collector(pool)
    assert await collector.collect_once()
    scrape = Scrape(collector)
    assert scrape.value("hybrid_jobs_queue_publish_failing", queue="mail", reason="refused") == 2
    pg.execute("UPDATE relays SET failing_queues = '{}'")
    assert await collector.collect_once()
    samples = Scrape(collector).families["hybrid_jobs_queue_publish_failing"].samples
    assert samples == []


async def _lease_runs_out(pg: psycopg.Connection, job_id: uuid.UUID) -> None:
    async with asyncio.timeout(10):
        while not _count(
            pg, "SELECT count(*) FROM jobs WHERE job_id = %s AND lease_expires_at <= now()", job_id
        ):
            await asyncio.sleep(0.02)


async def _expire_one(
    engine: Engine, pg: psycopg.Connection, store: JobStore, registry: Registry
) -> None:
    """A claim whose lease ran out, swept: one finished attempt, LEASE_EXPIRED."""
    job_id = enqueue(engine, "ghostly", queue="idle")
    await store.claim(
        [job_id], registry.claim_terms(), queues=registry.queues(), free_threads=0, worker_ttl=60
    )
    await _lease_runs_out(pg, job_id)
    swept = pg.execute(JOB_SWEEP_EXPIRED, {"limit": 10, "default_backoff": 5}).fetchall()
    assert [r[0] for r in swept] == [job_id]


async def test_history_before_the_first_round_is_not_counted(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, pool
) -> None:
    """Counters start at zero with the collector: what finished before its first
    round, even just before (inside the overlap it re-reads), is never counted."""
    registry = _registry(db_url)
    store = JobStore(pool, "ghost-worker", lease_seconds=0.05)
    await _expire_one(engine, pg, store, registry)
    collector = Collector(pool)
    for _ in range(2):
        assert await collector.collect_once()
        assert Scrape(collector).value("hybrid_jobs_leases_expired_total", queue="idle") == 0
    await _expire_one(engine, pg, store, registry)
    assert await collector.collect_once()
    assert Scrape(collector).value("hybrid_jobs_leases_expired_total", queue="idle") == 1


async def test_a_row_committed_late_is_counted_once(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, pool
) -> None:
    """The sweeper's transaction writes its attempt row, and commits only after a
    round has moved the mark past that row's timestamp: the next round still
    counts it, and no round counts it twice."""
    registry = _registry(db_url)
    store = JobStore(pool, "ghost-worker", lease_seconds=0.05)
    collector = Collector(pool)
    assert await collector.collect_once()
    job_id = enqueue(engine, "ghostly", queue="idle")
    await store.claim(
        [job_id], registry.claim_terms(), queues=registry.queues(), free_threads=0, worker_ttl=60
    )
    await _lease_runs_out(pg, job_id)

    def expired() -> float:
        return Scrape(collector).value("hybrid_jobs_leases_expired_total", queue="idle")

    with psycopg.connect(db_url.conninfo) as sweeper:
        swept = sweeper.execute(JOB_SWEEP_EXPIRED, {"limit": 10, "default_backoff": 5})
        assert [r[0] for r in swept.fetchall()] == [job_id]
        assert await collector.collect_once()  # the row is not visible yet
        assert expired() == 0
        sweeper.commit()
    assert await collector.collect_once()
    assert expired() == 1
    assert await collector.collect_once()
    assert expired() == 1


def _worker_seen(pg: psycopg.Connection, worker: str, queues: list[str], **counts: int) -> None:
    """A consumer's heartbeat of its row, through the consumer's own statement."""
    pg.execute(
        WORKER_SEEN,
        {
            "worker": worker,
            "host": "h",
            "pid": 1,
            "queues": queues,
            "job_types": ["ok"],
            "concurrency": 1,
            "prefetch": 2,
            "stopping": False,
            "counts": json.dumps({"claimed": 9, **counts}),
            "tenants": [],
            "worker_ttl": 60,
        },
    )


async def test_fence_rejections_count_each_workers_increase(pg: psycopg.Connection, pool) -> None:
    def rejected(scrape: Scrape, queue: str, operation: str) -> float:
        return scrape.value("hybrid_jobs_fence_rejections_total", queue=queue, operation=operation)

    _worker_seen(pg, "w-1", ["mail"], stale_outcome=5, lease_lost=1)
    collector = Collector(pool)
    assert await collector.collect_once()
    first = Scrape(collector)
    assert (rejected(first, "mail", "outcome"), rejected(first, "mail", "heartbeat")) == (0, 0), (
        "what a worker counted before the collector started is not counted"
    )

    _worker_seen(pg, "w-1", ["mail"], stale_outcome=7, lease_lost=1)
    _worker_seen(pg, "w-2", ["mail"], stale_outcome=3)  # new since: counted from zero
    _worker_seen(pg, "w-3", ["mail", "reports"], lease_lost=4)  # several queues: ""
    assert await collector.collect_once()
    second = Scrape(collector)
    assert (rejected(second, "mail", "outcome"), rejected(second, "mail", "heartbeat")) == (5, 0)
    assert rejected(second, "", "heartbeat") == 4

    # w-1 restarted under the same id (its counts went down): counted from zero
    _worker_seen(pg, "w-1", ["mail"], stale_outcome=1)
    assert await collector.collect_once()
    assert rejected(Scrape(collector), "mail", "outcome") == 6

    # w-2 froze past the worker TTL (the relay deleted its row) and came back with
    # its counters: only what it counted since is new
    pg.execute("DELETE FROM workers WHERE worker_id = 'w-2'")
    assert await collector.collect_once()
    _worker_seen(pg, "w-2", ["mail"], stale_outcome=4)
    assert await collector.collect_once()
    assert rejected(Scrape(collector), "mail", "outcome") == 7


async def test_one_collection_at_a_time(db_url: DatabaseUrl, pool) -> None:
    """While another process collects (holds the lock), a round is skipped and the
    cache is served as it was; once the lock is free, the round runs."""
    a, b = Collector(pool), Collector(pool)
    assert await a.collect_once()
    with psycopg.connect(db_url.conninfo) as other, other.transaction():
        other.execute(
            f"SELECT pg_advisory_xact_lock(hashtextextended(%s, {INSTANCE_SEED}))", [LOCK_NAME]
        )
        assert not await a.collect_once()
        assert not await b.collect_once()
        assert Scrape(a).value("hybrid_jobs_collector_rounds_total", result="skipped") == 1
        assert Scrape(a).value("hybrid_jobs_collector_last_success_timestamp_seconds") > 0
        skipped = Scrape(b)
        assert skipped.value("hybrid_jobs_collector_last_success_timestamp_seconds") == 0
        assert "hybrid_jobs_jobs" not in skipped.families, "nothing collected, nothing shown"
    # both at once: the lock lets one through at a time, and neither fails
    results = await asyncio.gather(a.collect_once(), b.collect_once())
    assert any(results)
    assert await b.collect_once()


async def test_a_failed_round_keeps_the_cache(db_url: DatabaseUrl, pool) -> None:
    """A round that times out (a migration holds the table, say) fails, counts as
    failed, and leaves the snapshot served and the counters as they were."""
    # a timeout a busy runner cannot overrun unlocked, yet short for the lock below
    collector = Collector(pool, CollectorSettings(statement_timeout=1.5))
    assert await collector.collect_once()
    before = Scrape(collector)
    with psycopg.connect(db_url.conninfo) as other, other.transaction():
        other.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(psycopg.errors.QueryCanceled):
            await collector.collect_once()
    after = Scrape(collector)
    assert after.value("hybrid_jobs_collector_rounds_total", result="failed") == 1
    last_success = "hybrid_jobs_collector_last_success_timestamp_seconds"
    assert after.value(last_success) == before.value(last_success) > 0
    assert "hybrid_jobs_jobs" in after.families
    assert await collector.collect_once()


async def test_background_rounds_start_and_stop(db_url: DatabaseUrl) -> None:
    collector = Collector.for_database(db_url, CollectorSettings(interval=0.05))
    await collector.start()
    try:
        async with asyncio.timeout(10):
            while collector.status.rounds["collected"] < 3:
                await asyncio.sleep(0.02)
        assert collector.running
    finally:
        await collector.stop()
    assert not collector.running
    assert collector.status.rounds["failed"] == 0


async def test_queue_labels_are_bounded_and_a_queue_that_goes_away_is_forgotten(
    engine: Engine, pg: psycopg.Connection, pool
) -> None:
    """A producer that invents queue names cannot grow the series without bound:
    past max_queues they add up under queue="_other"; a queue with nothing left in
    it (a paused typo, resumed, too) is forgotten with its series."""
    for n, queue in enumerate(("q1", "q2", "q3", "q4", "q5"), start=1):
        for _ in range(n):
            enqueue(engine, "ok", queue=queue)
    with Session(engine) as session, session.begin():
        outbox.pause_queue(session, "typo", by="test")
    settings = CollectorSettings(max_queues=3, forget_after=1.0)
    collector = Collector(pool, settings)
    assert await collector.collect_once()
    scrape = Scrape(collector)
    queues = {s.labels["queue"] for s in scrape.families["hybrid_jobs_jobs"].samples}
    # Names in order: q1, q2, q3 get series; q4, q5 and typo share one.
    assert queues == {"q1", "q2", "q3", "_other"}
    assert scrape.value("hybrid_jobs_jobs", queue="q3", state="QUEUED") == 3
    assert scrape.value("hybrid_jobs_jobs", queue="_other", state="QUEUED") == 4 + 5

    # q1's jobs are cancelled and the typo resumed: nothing uses them any more.
    with Session(engine) as session, session.begin():
        for (job_id,) in pg.execute("SELECT job_id FROM jobs WHERE queue = 'q1'").fetchall():
            outbox.request_cancel(session, job_id)
        outbox.resume_queue(session, "typo", by="test")
    assert await collector.collect_once()
    assert Scrape(collector).value("hybrid_jobs_jobs", queue="q1", state="QUEUED") == 0
    await asyncio.sleep(settings.forget_after + 0.2)
    enqueue(engine, "ok", queue="q6")
    assert await collector.collect_once()
    later = Scrape(collector)
    queues = {s.labels["queue"] for s in later.families["hybrid_jobs_jobs"].samples}
    assert "q1" not in queues and "typo" not in later.label_values()
    # The slot q1 left goes to the next queue by name: q4 has a series of its own now.
    assert queues == {"q2", "q3", "q4", "_other"}
    assert later.value("hybrid_jobs_jobs", queue="q4", state="QUEUED") == 4
    assert later.value("hybrid_jobs_jobs", queue="_other", state="QUEUED") == 5 + 1
