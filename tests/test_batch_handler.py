"""Batch handlers: many jobs of a type in one call, each job's outcome recorded on
its own through the fence. Through a real relay and consumer (in the test's loop
where the test reaches into the handler, real processes where a kill or
--processes matters), async and plain handlers alike."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine

from hybrid_jobs import consumers
from hybrid_jobs.consumers import Backoff, Registry
from hybrid_jobs.consumers.batches import BAD_BATCH_RESULT, BadBatchResult, _answers
from hybrid_jobs.consumers.job import Job
from hybrid_jobs.consumers.testing import JobRunner
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.apps.batches import BATCH_CALLS_TABLE
from tests.support.inproc import consumer_running, relay_running
from tests.support.jobs import attempts, enqueue_many, job, until, wait_for_state, wait_until_all
from tests.support.processes import Daemon, running, service_env

pytestmark = pytest.mark.timeout(240)

QUICK = Backoff(base=0.1, cap=0.2, jitter=0)
KINDS = ["async", "plain"]


@pytest.fixture
def services(db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology):
    return db_url, amqp_url, topology


def batch_handler(registry: Registry, kind: str, job_type: str, body: Any, **options: Any) -> None:
    """Register ``body(jobs)`` (a plain function) as an async or a plain batch
    handler of ``job_type``."""
    if kind == "async":

        async def run_async(jobs: list[Job]) -> Any:
            await asyncio.sleep(0)
            return body(jobs)

        registry.handler(job_type, **options)(run_async)
    else:

        def run_plain(jobs: list[Job]) -> Any:
            return body(jobs)

        registry.handler(job_type, **options)(run_plain)


def outcomes(pg: psycopg.Connection, job_id: uuid.UUID) -> list[tuple[str, str | None]]:
    return [(a["outcome"], a["error_code"]) for a in attempts(pg, job_id)]


def sleep_until(check: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# ---------------------------------------------------------------- a drain in batches


@pytest.mark.parametrize("kind", KINDS)
async def test_a_relay_and_consumer_drain_hundreds_of_jobs_in_batches_each_succeeding_once(
    services, engine: Engine, pg: psycopg.Connection, kind: str
) -> None:
    registry = Registry()
    calls: list[list[uuid.UUID]] = []

    def record(jobs: list[Job]) -> None:
        calls.append([j.id for j in jobs])

    batch_handler(registry, kind, "drained", record, batch=50, batch_wait=0.3)
    ids = enqueue_many(engine, [NewJob("drained", {"n": i}) for i in range(300)])
    async with (
        relay_running(*services),
        consumer_running(*services, registry, concurrency=100) as consumer,
    ):
        await wait_until_all(pg, "SUCCEEDED", 300, timeout=120)
        sizes = consumer.executor.batches.sizes
    ran = Counter(i for call in calls for i in call)
    assert set(ran) == set(ids) and set(ran.values()) == {1}, "every job ran once"
    assert max(len(call) for call in calls) > 1, calls
    assert max(len(call) for call in calls) <= 50
    assert sum(size * n for size, n in sizes.items()) == 300
    for job_id in ids[:20]:
        assert outcomes(pg, job_id) == [("SUCCEEDED", None)]


# ---------------------------------------------------------------- each job its outcome


@pytest.mark.parametrize("kind", KINDS)
async def test_each_job_of_a_batch_gets_its_own_outcome(
    services, engine: Engine, pg: psycopg.Connection, kind: str
) -> None:
    registry = Registry()
    calls: list[int] = []

    def mixed(jobs: list[Job]) -> dict[Any, Any]:
        calls.append(len(jobs))
        said: dict[Any, Any] = {}
        for j in jobs:
            role = j.payload["role"]
            if role == "fail":
                said[j] = consumers.Permanent("card declined", code="DECLINED")
            elif role == "retry" and j.attempt == 1:
                said[j.id] = consumers.Retry(0.1, "try again")
            elif role == "crash" and j.attempt == 1:
                said[str(j.id)] = ValueError("boom")
            elif role == "value":
                said[j.id] = {"total": 42}
        return said

    batch_handler(
        registry, kind, "mixed", mixed, batch=20, batch_wait=1.0, max_attempts=3, backoff=QUICK
    )
    roles = ["fail", "retry", "crash", "value", "ok", "ok", "ok", "ok"]
    ids = dict(
        zip(
            roles[:4],
            enqueue_many(engine, [NewJob("mixed", {"role": r}) for r in roles[:4]]),
            strict=True,
        )
    )
    plain = enqueue_many(engine, [NewJob("mixed", {"role": "ok"}) for _ in roles[4:]])
    async with (
        relay_running(*services),
        consumer_running(*services, registry, concurrency=20),
    ):
        failed = await wait_for_state(pg, ids["fail"], "FAILED", timeout=60)
        for name in ("retry", "crash", "value"):
            await wait_for_state(pg, ids[name], "SUCCEEDED", timeout=60)
        for job_id in plain:
            await wait_for_state(pg, job_id, "SUCCEEDED", timeout=60)
    assert max(calls) > 1, calls
    assert failed["last_error_code"] == "DECLINED"
    assert outcomes(pg, ids["fail"]) == [("FAILED", "DECLINED")]
    assert outcomes(pg, ids["retry"]) == [("RETRY_WAIT", "RETRY"), ("SUCCEEDED", None)]
    assert outcomes(pg, ids["crash"]) == [("RETRY_WAIT", "ValueError"), ("SUCCEEDED", None)]
    assert attempts(pg, ids["crash"])[0]["error_message"].startswith("ValueError: boom")
    assert job(pg, ids["value"])["result"] == {"total": 42}
    for job_id in [ids["value"], *plain]:
        assert outcomes(pg, job_id) == [("SUCCEEDED", None)], "the others are not affected"


@pytest.mark.parametrize("kind", KINDS)
async def test_an_exception_raised_by_the_call_is_every_jobs_outcome(
    services, engine: Engine, pg: psycopg.Connection, kind: str
) -> None:
    registry = Registry()

    def flaky(jobs: list[Job]) -> None:
        if any(j.attempt == 1 for j in jobs):
            raise ConnectionError("the mail server hung up")

    batch_handler(
        registry, kind, "flaky", flaky, batch=10, batch_wait=0.5, max_attempts=3, backoff=QUICK
    )
    ids = enqueue_many(engine, [NewJob("flaky", {}) for _ in range(5)])
    async with relay_running(*services), consumer_running(*services, registry, concurrency=10):
        for job_id in ids:
            await wait_for_state(pg, job_id, "SUCCEEDED", timeout=60)
    for job_id in ids:
        assert outcomes(pg, job_id) == [("RETRY_WAIT", "ConnectionError"), ("SUCCEEDED", None)]


@pytest.mark.parametrize(
    ("output", "says"),
    [
        (["not", "a", "dict"], "not list"),
        ({uuid.UUID(int=7): "x"}, "not in its batch"),
        ({"a key": None}, "not in its batch"),
        ("done", "not str"),
    ],
)
async def test_odd_output_fails_the_batch_saying_what_was_wrong(
    services, engine: Engine, pg: psycopg.Connection, output: Any, says: str
) -> None:
    registry = Registry()

    @registry.handler("odd", batch=10, batch_wait=0.5)
    async def odd(jobs: list[Job]) -> Any:
        return output

    ids = enqueue_many(engine, [NewJob("odd", {}) for _ in range(3)])
    async with relay_running(*services), consumer_running(*services, registry, concurrency=10):
        rows = [await wait_for_state(pg, job_id, "FAILED", timeout=60) for job_id in ids]
    for row in rows:
        assert row["last_error_code"] == BAD_BATCH_RESULT
        (attempt,) = attempts(pg, row["job_id"])
        assert says in attempt["error_message"], attempt["error_message"]


def test_the_output_is_read_strictly() -> None:
    a, b = (uuid.uuid4(), uuid.uuid4())
    jobs = [_job(a), _job(b)]
    assert _answers(None, jobs) == {}
    assert _answers({jobs[0]: 1, str(b): consumers.Retry()}, jobs).keys() == {a, b}
    with pytest.raises(BadBatchResult, match="twice"):
        _answers({a: 1, jobs[0]: 2}, jobs)
    with pytest.raises(BadBatchResult, match="the class Retry"):
        _answers({a: consumers.Retry}, jobs)
    with pytest.raises(BadBatchResult, match="not in its batch"):
        _answers({a: 1, 17: 2}, jobs)


def _job(job_id: uuid.UUID) -> Job:
    from datetime import UTC, datetime

    return Job(job_id, "t", "default", None, {}, 1, 5, 1, datetime.now(UTC), "w")


def test_a_batch_handler_is_declared_with_a_sane_size_and_one_argument() -> None:
    registry = Registry()
    for wrong in (0, -1, True, 1.5, 10_001):
        with pytest.raises(ValueError, match="batch must be"):
            registry.handler("t", batch=wrong)
    with pytest.raises(ValueError, match="give batch=N"):
        registry.handler("t", batch_wait=1)
    with pytest.raises(ValueError, match="0 to 60"):
        registry.handler("t", batch=5, batch_wait=-1)
    with pytest.raises(TypeError, match="the list of jobs"):
        registry.handler("t", batch=5)(lambda jobs, *, order_id: None)
    registry.handler("t", batch=5)(lambda jobs: None)
    assert registry.batched() == {"t": 5}
    handler = registry.get("t")
    assert handler is not None and handler.batch_wait == 0.2


# ---------------------------------------------------------------- the fence


@pytest.mark.parametrize("kind", KINDS)
async def test_a_job_whose_lease_was_taken_over_mid_batch_cannot_record_and_the_rest_do(
    services, engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, kind: str
) -> None:
    registry = Registry()
    taken: dict[uuid.UUID, int] = {}

    def steal(jobs: list[Job]) -> None:
        # Another worker takes one job's lease while the batch runs (its lease
        # expired and the sweeper and a claim gave it away, say).
        victim = next(j for j in jobs if j.payload["victim"])
        with psycopg.connect(db_url.conninfo, autocommit=True) as conn:
            row = conn.execute(
                "UPDATE jobs SET lease_owner = 'thief', lease_generation = lease_generation + 1,"
                " lease_expires_at = now() + interval '1 hour' WHERE job_id = %s"
                " RETURNING lease_generation",
                [victim.id],
            ).fetchone()
        assert row is not None
        taken[victim.id] = row[0]

    batch_handler(registry, kind, "stolen", steal, batch=10, batch_wait=0.5)
    victim, *others = enqueue_many(engine, [NewJob("stolen", {"victim": i == 0}) for i in range(6)])
    async with relay_running(*services), consumer_running(*services, registry, concurrency=10):
        for job_id in others:
            await wait_for_state(pg, job_id, "SUCCEEDED", timeout=60)
        await until(lambda: victim in taken, "the takeover")
        # the batch's outcome for the victim was turned away by the fence
        await asyncio.sleep(1.0)
    row = job(pg, victim)
    assert (row["state"], row["lease_owner"]) == ("RUNNING", "thief")
    assert row["lease_generation"] == taken[victim]
    assert attempts(pg, victim) == [], "the stale worker recorded nothing"
    for job_id in others:
        assert outcomes(pg, job_id) == [("SUCCEEDED", None)]


# ---------------------------------------------------------------- time limit, stop


@pytest.mark.parametrize("kind", KINDS)
async def test_a_batch_past_its_time_limit_retries_every_job_with_timeout(
    services, engine: Engine, pg: psycopg.Connection, kind: str
) -> None:
    registry = Registry()

    def slow(jobs: list[Job]) -> None:
        if any(j.attempt == 1 for j in jobs):
            time.sleep(2)

    if kind == "async":

        @registry.handler("slow", batch=10, batch_wait=0.5, timeout=0.5, backoff=QUICK)
        async def slow_async(jobs: list[Job]) -> None:
            if any(j.attempt == 1 for j in jobs):
                await asyncio.sleep(30)
    else:
        registry.handler("slow", batch=10, batch_wait=0.5, timeout=0.5, backoff=QUICK)(slow)
    ids = enqueue_many(engine, [NewJob("slow", {}) for _ in range(4)])
    async with relay_running(*services), consumer_running(*services, registry, concurrency=10):
        for job_id in ids:
            await wait_for_state(pg, job_id, "SUCCEEDED", timeout=60)
    for job_id in ids:
        assert outcomes(pg, job_id)[0] == ("RETRY_WAIT", "TIMEOUT")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stop_gives_back_jobs_gathered_for_a_batch_that_had_not_started(
    services, engine: Engine, pg: psycopg.Connection, kind: str
) -> None:
    registry = Registry()
    called = threading.Event()

    def never(jobs: list[Job]) -> None:
        called.set()

    # a batch that would wait a minute to fill: the stop comes first
    batch_handler(registry, kind, "gathered", never, batch=100, batch_wait=60)
    ids = enqueue_many(engine, [NewJob("gathered", {}) for _ in range(5)])
    async with relay_running(*services):
        async with consumer_running(*services, registry, concurrency=100, drain_seconds=30):
            for job_id in ids:
                await wait_for_state(pg, job_id, "RUNNING", timeout=60)
            began = time.monotonic()
        stopped_in = time.monotonic() - began
    assert not called.is_set(), "the batch never started"
    assert stopped_in < 25, "given back at once, not after the drain"
    for job_id in ids:
        row = job(pg, job_id)
        assert (row["state"], row["attempt_count"], row["lease_owner"]) == ("QUEUED", 0, None)


# ---------------------------------------------------------------- real processes


@pytest.fixture
def env(db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, pg: psycopg.Connection):
    pg.execute(BATCH_CALLS_TABLE)
    return service_env(db_url, amqp_url, topology)


def calls_of(pg: psycopg.Connection) -> list[tuple[int, list[uuid.UUID], list[int]]]:
    return [tuple(r) for r in pg.execute("SELECT pid, job_ids, attempts FROM batch_calls")]  # type: ignore[misc]


LEASE = ["--lease-seconds", "2", "--heartbeat-seconds", "0.5"]
RELAY = ["--sweep-interval", "0.3", "--rewake-interval", "2"]


def test_kill_9_mid_batch_loses_nothing_the_jobs_rerun_after_their_leases(
    env, engine: Engine, pg: psycopg.Connection
) -> None:
    args = ["--app", "tests.apps.batches", "--concurrency", "10", *LEASE]
    with running("relay", RELAY, env, "relay.started"):
        with running("consumer", args, env, "consumer.started") as doomed:
            ids = enqueue_many(engine, [NewJob("batch_hang", {}) for _ in range(6)])
            sleep_until(lambda: calls_of(pg), "the first batch to start")
            doomed.kill()
        with running("consumer", args, env, "consumer.started") as survivor:
            sleep_until(
                lambda: all(job(pg, i)["state"] == "SUCCEEDED" for i in ids), "the rerun", 90
            )
    first = [c for c in calls_of(pg) if c[0] == doomed.pid]
    assert first and all(set(c[2]) == {1} for c in first)
    for job_id in ids:
        history = attempts(pg, job_id)
        assert history[-1]["outcome"] == "SUCCEEDED"
        assert f":{survivor.pid}:" in history[-1]["worker"]
        ran_by_doomed = any(job_id in c[1] for c in first)
        if ran_by_doomed:
            assert (history[0]["outcome"], history[0]["error_code"]) == (
                "RETRY_WAIT",
                "LEASE_EXPIRED",
            )
        assert [a["outcome"] for a in history].count("SUCCEEDED") == 1


def test_processes_mode_runs_each_batch_in_one_worker_process(
    env, engine: Engine, pg: psycopg.Connection
) -> None:
    args = ["--app", "tests.apps.batches", "--processes", "2", "--concurrency", "50"]
    ids = enqueue_many(engine, [NewJob("batch_plain", {"n": i}) for i in range(200)])
    with running("relay", RELAY, env, "relay.started"):
        supervisor = Daemon("consumer", args, env)
        try:
            sleep_until(
                lambda: (
                    pg.execute("SELECT count(*) FROM jobs WHERE state = 'SUCCEEDED'").fetchone()
                    == (200,)
                ),
                "the drain",
                120,
            )
        finally:
            assert supervisor.stop(60) == 0, supervisor.text()[-3000:]
    calls = calls_of(pg)
    ran = Counter(i for _, batch, _ in calls for i in batch)
    assert set(ran) == set(ids) and set(ran.values()) == {1}, "every job ran once"
    assert max(len(batch) for _, batch, _ in calls) > 1
    for job_id in ids[:20]:
        assert outcomes(pg, job_id) == [("SUCCEEDED", None)]


async def test_the_test_runner_runs_a_batch_handlers_jobs_each_as_a_batch_of_one(
    engine: Engine, db_url: DatabaseUrl
) -> None:
    registry = Registry()
    calls: list[int] = []

    @registry.handler("in_tests", batch=50, batch_wait=30)
    async def in_tests(jobs: list[Job]) -> dict[Job, Any]:
        calls.append(len(jobs))
        return {j: consumers.Permanent("no") for j in jobs if j.payload["bad"]}

    enqueue_many(engine, [NewJob("in_tests", {"bad": i == 0}) for i in range(3)])
    began = time.monotonic()
    async with JobRunner(db_url, registry) as runner:
        ran = await runner.run_until_idle()
    assert calls == [1, 1, 1]
    assert sorted(r.state for r in ran) == ["FAILED", "SUCCEEDED", "SUCCEEDED"]
    assert time.monotonic() - began < 25, "no batch waited to fill"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stop_past_the_drain_waits_for_a_plain_batch_and_gives_back_an_async_one(
    services, engine: Engine, pg: psycopg.Connection, kind: str
) -> None:
    """A plain function's batch cannot be stopped: none of its jobs is given back
    while its thread runs (each job's thread reservation is the batch's), and all
    end SUCCEEDED once it returns. An async batch is cancelled and every job of it
    given back, attempt refunded."""
    registry = Registry()
    began = threading.Event()
    cancelled = threading.Event()

    if kind == "async":

        @registry.handler("long_batch", batch=10, batch_wait=0.5)
        async def long_async(jobs: list[Job]) -> None:
            began.set()
            try:
                await asyncio.sleep(120)
            except asyncio.CancelledError:
                cancelled.set()
                raise
    else:

        @registry.handler("long_batch", batch=10, batch_wait=0.5)
        def long_plain(jobs: list[Job]) -> None:
            began.set()
            time.sleep(3)

    ids = enqueue_many(engine, [NewJob("long_batch", {}) for _ in range(5)])
    async with (
        relay_running(*services),
        consumer_running(*services, registry, concurrency=10, drain_seconds=0.5),
    ):
        await until(began.is_set, "the batch to start", 60)
    rows = [job(pg, job_id) for job_id in ids]
    if kind == "async":
        assert cancelled.is_set()
        assert {(r["state"], r["attempt_count"]) for r in rows} == {("QUEUED", 0)}
    else:
        assert {r["state"] for r in rows} == {"SUCCEEDED"}, "none was given back mid-thread"
        for job_id in ids:
            assert outcomes(pg, job_id) == [("SUCCEEDED", None)]
