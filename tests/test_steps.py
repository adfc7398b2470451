"""Resumable steps: ``job.step`` records a step's result through the job's lease,
and every later attempt (a retry, a lease recovered after a kill -9, a replay)
skips the finished steps and resumes at the first unfinished one. Through a real
consumer process where a kill matters, the test runner's real claim and outcome
elsewhere, plain and async handlers alike."""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from harness.claim import claim_params
from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Backoff, Registry
from hybrid_jobs.consumers.job import Job, Resources
from hybrid_jobs.consumers.testing import JobRunner
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.relay.retention import delete_finished
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.topology import Topology
from tests.apps.steps import AFTER_TWO, STEP_RUNS_TABLE
from tests.conftest import migrate
from tests.support.jobs import attempts, enqueue, job, until, wait_for_state
from tests.support.processes import jobctl, running, service_env

pytestmark = pytest.mark.timeout(240)

QUICK = Backoff(base=0.05, cap=0.1, jitter=0)
LEASE = ["--lease-seconds", "2", "--heartbeat-seconds", "0.5"]
RELAY = ["--sweep-interval", "0.3", "--rewake-interval", "2"]


def steps(pg: psycopg.Connection, job_id: uuid.UUID) -> dict[str, dict[str, Any]]:
    rows = pg.execute(
        "SELECT name, result, attempt, lease_generation FROM job_steps WHERE job_id = %s",
        [job_id],
    ).fetchall()
    return {r[0]: {"result": r[1], "attempt": r[2], "generation": r[3]} for r in rows}


def step_runs(pg: psycopg.Connection, job_id: uuid.UUID) -> list[tuple[str, int, int]]:
    rows = pg.execute(
        "SELECT step, attempt, pid FROM step_runs WHERE job_id = %s ORDER BY at", [job_id]
    )
    return [(r[0], r[1], r[2]) for r in rows.fetchall()]


def claim(pg: psycopg.Connection, job_id: uuid.UUID, worker: str) -> str:
    rows = pg.execute(q.JOB_CLAIM_MANY, claim_params([job_id], worker)).fetchall()
    return str({row[1]: row[0] for row in rows}[job_id])


def holder(
    job_id: uuid.UUID, worker: str, generation: int, pool: AsyncConnectionPool[AsyncConnection]
) -> Job:
    """The handler's ``job`` as the consumer ``worker`` holding ``generation`` has it."""

    def no_sync_pool() -> Any:
        raise AssertionError("steps go through the consumer's async pool")

    resources = Resources(worker, pool, no_sync_pool, asyncio.get_running_loop())
    return Job(
        id=job_id,
        job_type="noop",
        queue="default",
        tenant=None,
        payload={},
        attempt=generation,
        max_attempts=None,
        generation=generation,
        created_at=datetime.now(UTC),
        worker=worker,
        _resources=resources,
    )


# ------------------------------------------------------------------ kill -9


@pytest.mark.parametrize("job_type", ["three_steps", "three_steps_plain"])
def test_after_a_kill_9_between_steps_two_and_three_the_retry_runs_only_step_three(
    job_type: str,
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    pg.execute(STEP_RUNS_TABLE)
    env = service_env(db_url, amqp_url, topology)
    consumer = ["--app", "tests.apps.steps", "--queue", "default", "--queue", "sync", *LEASE]
    queue = "sync" if job_type.endswith("plain") else "default"
    with running("relay", RELAY, env, "relay.started"):
        with running("consumer", consumer, env, "consumer.started") as doomed:
            job_id = enqueue(engine, job_type, {"seconds": 60}, queue=queue)
            asyncio.run(
                until(
                    lambda: AFTER_TWO in [s for s, _, _ in step_runs(pg, job_id)],
                    "steps 1 and 2 recorded, the handler sleeping before step 3",
                    timeout=60,
                )
            )
            recorded = steps(pg, job_id)
            doomed.kill()
        assert set(recorded) == {"charge", "reserve"}
        with running("consumer", consumer, env, "consumer.started") as survivor:
            done = asyncio.run(wait_for_state(pg, job_id, "SUCCEEDED", "FAILED", timeout=90))

    assert (done["state"], done["attempt_count"]) == ("SUCCEEDED", 2)
    lost, won = attempts(pg, job_id)
    assert (lost["outcome"], lost["error_code"]) == ("RETRY_WAIT", "LEASE_EXPIRED")
    runs = step_runs(pg, job_id)
    assert Counter(step for step, _, _ in runs) == {
        "charge": 1,
        "reserve": 1,
        AFTER_TWO: 2,
        "ship": 1,
    }, "steps 1 and 2 ran once, before the kill; step 3 once, after it"
    assert [(s, a, p) for s, a, p in runs if s != AFTER_TWO] == [
        ("charge", 1, doomed.pid),
        ("reserve", 1, doomed.pid),
        ("ship", 2, survivor.pid),
    ]
    assert done["result"] == {
        "charge": {"charged": 100, "attempt": 1},
        "reserve": ["a", "b"],
        "ship": "shipped at attempt 2",
    }, "the skipped steps gave back what they returned the first time"
    recorded_now = steps(pg, job_id)
    assert {n: (s["attempt"], s["generation"]) for n, s in recorded_now.items()} == {
        "charge": (1, 1),
        "reserve": (1, 1),
        "ship": (2, 2),
    }
    assert f":{survivor.pid}:" in won["worker"]


# ------------------------------------------------------------------ the fence


async def test_a_stale_worker_cannot_record_a_step_and_gets_lease_lost(
    engine: Engine, pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection]
) -> None:
    job_id = enqueue(engine, "noop")
    assert claim(pg, job_id, "w1") == "claimed"
    stale = holder(job_id, "w1", 1, pool)
    # The first step reads the job's finished steps while w1 still holds it.
    assert await stale.step_async("before", lambda: "w1's") == "w1's"
    # w1 stalls past its lease; the sweeper ends it and w2 claims the job again.
    pg.execute(
        "UPDATE jobs SET lease_expires_at = now() - interval '1 s' WHERE job_id = %s", [job_id]
    )
    pg.execute(q.JOB_SWEEP_EXPIRED, {"limit": 10, "default_backoff": 0})
    pg.execute("UPDATE jobs SET run_after = now() WHERE job_id = %s", [job_id])
    assert claim(pg, job_id, "w2") == "claimed"
    current = holder(job_id, "w2", 2, pool)

    calls: list[str] = []

    def charge(who: str) -> str:
        calls.append(who)
        return f"charged by {who}"

    with pytest.raises(consumers.LeaseLost, match="step 'charge' was not recorded"):
        await stale.step_async("charge", charge, "w1")
    with pytest.raises(consumers.LeaseLost):
        await asyncio.to_thread(stale.step, "charge", charge, "w1 in a thread")
    assert calls == ["w1", "w1 in a thread"], "its fn ran; its record was turned away"
    assert set(steps(pg, job_id)) == {"before"}, "the stale worker recorded nothing"

    assert await current.step_async("before", charge, "w2") == "w1's", "recorded while held"
    assert await current.step_async("charge", charge, "w2") == "charged by w2"
    assert steps(pg, job_id)["charge"] == {"result": "charged by w2", "attempt": 2, "generation": 2}
    with pytest.raises(consumers.LeaseLost):
        await stale.step_async("charge", charge, "w1 again")
    assert steps(pg, job_id)["charge"]["result"] == "charged by w2"


# ------------------------------------------------------------------ retries


@pytest.mark.parametrize("kind", ["async", "plain"])
async def test_a_retry_after_a_raised_exception_resumes_at_the_step_that_raised(
    kind: str, db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection
) -> None:
    ran: list[tuple[str, int]] = []
    registry = Registry()

    def work(j: consumers.Job, name: str) -> str:
        ran.append((name, j.attempt))
        if name == "second" and j.attempt < 3:
            raise RuntimeError(f"second step failed at attempt {j.attempt}")
        return f"{name} done at attempt {j.attempt}"

    async def run_async(j: consumers.Job) -> list[str]:
        async def step(name: str) -> str:
            await asyncio.sleep(0)
            return work(j, name)

        return [await j.step_async(n, step, n) for n in ("first", "second", "third")]

    def run_plain(j: consumers.Job) -> list[str]:
        return [j.step(n, work, j, n) for n in ("first", "second", "third")]

    handler = run_async if kind == "async" else run_plain
    registry.handler("stepped", max_attempts=3, backoff=QUICK)(handler)
    job_id = enqueue(engine, "stepped")
    async with JobRunner(db_url, registry) as runner:
        done = await runner.run_until_idle(retries=True)

    assert [(r.attempt, r.state) for r in done] == [
        (1, "RETRY_WAIT"),
        (2, "RETRY_WAIT"),
        (3, "SUCCEEDED"),
    ]
    assert ran == [("first", 1), ("second", 1), ("second", 2), ("second", 3), ("third", 3)], (
        "the first step ran once; the one that raised recorded nothing and ran again"
    )
    assert job(pg, job_id)["result"] == [
        "first done at attempt 1",
        "second done at attempt 3",
        "third done at attempt 3",
    ]
    assert {n: s["attempt"] for n, s in steps(pg, job_id).items()} == {
        "first": 1,
        "second": 3,
        "third": 3,
    }


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ({"a set": {1, 2}}, "not JSON-serialisable"),
        (math.nan, "not JSON-serialisable"),
        ("x" * 70_000, "the limit is 65536"),
        ("nul \x00 inside", "NUL character"),
    ],
)
async def test_a_step_whose_result_is_not_storable_json_is_refused_and_records_nothing(
    value: Any, why: str, db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection
) -> None:
    registry = Registry()

    async def refused(j: consumers.Job) -> None:
        await j.step_async("bad", lambda: value)

    registry.handler("refused_step", max_attempts=1)(refused)
    job_id = enqueue(engine, "refused_step")
    async with JobRunner(db_url, registry) as runner:
        (ran,) = await runner.run_until_idle()
    assert (ran.state, ran.error_code) == ("FAILED", "ValueError")
    assert ran.error_message is not None
    assert "step 'bad' returned a result that cannot be recorded" in ran.error_message
    assert why in ran.error_message
    assert steps(pg, job_id) == {}


def test_a_step_name_must_be_a_short_printable_str() -> None:
    from hybrid_jobs.consumers.steps import step_name

    assert step_name("charge card #1") == "charge card #1"
    with pytest.raises(TypeError, match="must be a str"):
        step_name(1)
    for wrong in ("", "x" * 201, "line\nbreak", "nul\x00"):
        with pytest.raises(ValueError, match="a step's name"):
            step_name(wrong)


async def test_an_async_function_given_to_a_plain_handlers_step_is_refused_clearly(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection
) -> None:
    registry = Registry()

    async def later() -> int:
        return 1

    def plain(j: consumers.Job) -> None:
        j.step("later", later)  # type: ignore[unused-coroutine]

    registry.handler("plain_with_async_step", max_attempts=1)(plain)
    job_id = enqueue(engine, "plain_with_async_step")
    async with JobRunner(db_url, registry) as runner:
        (ran,) = await runner.run_until_idle()
    assert (ran.state, ran.error_code) == ("FAILED", "TypeError")
    assert "use await job.step_async" in (ran.error_message or "")
    assert steps(pg, job_id) == {}


# ------------------------------------------------------------------ replay and retention


@pytest.mark.parametrize("reset_steps", [False, True])
async def test_a_replay_resumes_at_the_first_unfinished_step_unless_told_to_reset(
    reset_steps: bool, db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection
) -> None:
    ran: list[str] = []
    registry = Registry()

    def work(name: str) -> str:
        ran.append(name)
        return name

    def fails_once(j: consumers.Job) -> None:
        j.step("first", work, "first")
        if j.attempt == 1:
            raise consumers.Permanent("the second step's input is missing")
        j.step("second", work, "second")

    registry.handler("replayed", max_attempts=1)(fails_once)
    job_id = enqueue(engine, "replayed")
    async with JobRunner(db_url, registry) as runner:
        (first,) = await runner.run_until_idle()
        assert first.state == "FAILED"
        with Session(engine) as session, session.begin():
            replayed = outbox.retry_job(session, job_id, by="test", reset_steps=reset_steps)
        assert replayed == "QUEUED"
        assert set(steps(pg, job_id)) == (set() if reset_steps else {"first"})
        (second,) = await runner.run_until_idle()
    assert second.state == "SUCCEEDED"
    if reset_steps:
        assert ran == ["first", "first", "second"], "started over"
    else:
        assert ran == ["first", "second"], "resumed"


async def test_retry_jobs_with_reset_steps_clears_the_steps_of_every_job_it_replays(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection
) -> None:
    registry = Registry()

    def fails(j: consumers.Job) -> None:
        j.step("only", lambda: 1)
        raise consumers.Permanent("no")

    registry.handler("bulk_replayed", max_attempts=1)(fails)
    ids = [enqueue(engine, "bulk_replayed") for _ in range(3)]
    kept = enqueue(engine, "noop")
    pg.execute(
        "INSERT INTO job_steps (job_id, name, attempt, lease_generation) VALUES (%s, 'x', 1, 1)",
        [kept],
    )
    async with JobRunner(db_url, registry) as runner:
        await runner.run_until_idle(job_type="bulk_replayed")
    assert all(set(steps(pg, i)) == {"only"} for i in ids)
    with Session(engine) as session, session.begin():
        assert outbox.retry_jobs(session, job_type="bulk_replayed", reset_steps=True) == 3
    assert all(steps(pg, i) == {} for i in ids)
    assert set(steps(pg, kept)) == {"x"}, "another job's steps are left alone"


async def test_retention_deletes_a_finished_jobs_steps_with_it(
    db_url: DatabaseUrl,
    engine: Engine,
    pg: psycopg.Connection,
    pool: AsyncConnectionPool[AsyncConnection],
) -> None:
    registry = Registry()

    async def two_steps(j: consumers.Job) -> None:
        await j.step_async("a", lambda: 1)
        await j.step_async("b", lambda: 2)

    registry.handler("retained", max_attempts=1)(two_steps)
    job_id = enqueue(engine, "retained")
    async with JobRunner(db_url, registry) as runner:
        (ran,) = await runner.run_until_idle()
    assert ran.state == "SUCCEEDED"
    assert set(steps(pg, job_id)) == {"a", "b"}
    await until(
        lambda: pg.execute(
            "SELECT now() > finished_at FROM jobs WHERE job_id = %s", [job_id]
        ).fetchone()[0],  # type: ignore[index]
        "the database clock past the job's end",
    )
    assert await delete_finished(pool, keep_seconds=0, batch=100) == 1
    assert pg.execute("SELECT count(*) FROM jobs WHERE job_id = %s", [job_id]).fetchone() == (0,)
    assert steps(pg, job_id) == {}, "its steps went with it"


# ------------------------------------------------------------------ visibility


async def test_jobctl_jobs_show_lists_the_finished_steps_with_their_attempt(
    db_url: DatabaseUrl, engine: Engine, tmp_path: Path
) -> None:
    registry = Registry()

    async def stepped(j: consumers.Job) -> None:
        await j.step_async("fetch", lambda: "page")
        if j.attempt == 1:
            raise RuntimeError("parse failed")
        await j.step_async("parse", lambda: "parsed")

    registry.handler("shown", max_attempts=2, backoff=QUICK)(stepped)
    job_id = enqueue(engine, "shown")
    async with JobRunner(db_url, registry) as runner:
        await runner.run_until_idle(retries=True)

    shown = jobctl("jobs", "show", str(job_id), "--json", url=db_url, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert [(s["name"], s["attempt"]) for s in document["steps"]] == [("fetch", 1), ("parse", 2)]
    assert all(s["finished_at"] for s in document["steps"])
    text = jobctl("jobs", "show", str(job_id), url=db_url, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "steps (finished; a later attempt skips them):" in text.stdout
    assert any(line.split()[:1] == ["parse"] for line in text.stdout.splitlines())


# ------------------------------------------------------------------ migration


def test_the_migration_creates_job_steps_and_its_downgrade_drops_it(
    empty_db_url: DatabaseUrl,
) -> None:
    def has_table() -> bool:
        with psycopg.connect(empty_db_url.conninfo) as conn:
            row = conn.execute("SELECT to_regclass('job_steps') IS NOT NULL").fetchone()
        return bool(row and row[0])

    migrate(empty_db_url, "0024")
    assert has_table()
    with (
        psycopg.connect(empty_db_url.conninfo) as conn,
        pytest.raises(psycopg.errors.CheckViolation),
    ):
        conn.execute(
            "INSERT INTO job_steps (job_id, name, attempt, lease_generation)"
            " VALUES (gen_random_uuid(), '', 1, 1)"
        )
    migrate(empty_db_url, "0023", down=True)
    assert not has_table()
    migrate(empty_db_url, "0024")
    assert has_table()
