"""Deadlines, debounce and rate limits (issue 18), on the real services: the relay
and consumer commands as processes, and the claim statement itself."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import consumers
import outbox
from consumers import Registry
from consumers.testing import JobRunner
from plumbing.config import AmqpUrl, DatabaseUrl
from schema.topology import Topology
from tests.apps.limits import STARTS_TABLE
from tests.support.jobs import enqueue, job, wait_for_state
from tests.support.processes import running, service_env

pytestmark = pytest.mark.timeout(120)

APP = ["--app", "tests.apps.limits"]
FAST = ["--sweep-interval", "0.3", "--poll-interval", "0.2"]


def started(pg: psycopg.Connection) -> list[uuid.UUID]:
    return [row[0] for row in pg.execute("SELECT job_id FROM starts ORDER BY at").fetchall()]


def test_an_expired_job_never_starts_and_ends_cancelled_expired(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    """One consumer slot, held by a 1.5 s job: five jobs due now with a deadline
    0.5 s away wait behind it and are woken past their deadline (the claim ends
    them); one delayed past its deadline is ended by the relay's sweep, since no
    claim looks at it before then; one with a deadline far off runs."""
    pg.execute(STARTS_TABLE)
    env = service_env(db_url, amqp_url, topology)
    with (
        running("relay", FAST, env, "relay.started"),
        running("consumer", [*APP, "--concurrency", "1"], env, "consumer.started"),
    ):
        blocker = enqueue(engine, "stamp", {"seconds": 1.5})
        asyncio.run(wait_for_state(pg, blocker, "RUNNING"))
        late = [enqueue(engine, "stamp", {}, expires=timedelta(seconds=0.5)) for _ in range(5)]
        delayed = enqueue(
            engine, "stamp", {}, run_after=timedelta(seconds=60), expires=timedelta(seconds=1)
        )
        kept = enqueue(engine, "stamp", {}, expires=timedelta(minutes=5))
        for job_id in [*late, delayed, kept]:
            asyncio.run(wait_for_state(pg, job_id, "CANCELLED", "SUCCEEDED", timeout=30))
    assert set(started(pg)) == {blocker, kept}, "no expired job started"
    for job_id in [*late, delayed]:
        row = job(pg, job_id)
        assert (row["state"], row["last_error_code"], row["attempt_count"]) == (
            "CANCELLED",
            "EXPIRED",
            0,
        )
        assert row["started_at"] is None and row["finished_at"] >= row["expires_at"]
    assert pg.execute("SELECT count(*) FROM outbox").fetchone() == (0,), "no wake-up left"
    with Session(engine) as session:
        why = outbox.explain(session, delayed)
    assert why.outcome == "CANCELLED" and why.last_error is not None
    assert why.last_error.code == "EXPIRED" and "deadline" in why.summary


async def test_the_claim_ends_a_job_woken_past_its_deadline(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """The claim itself refuses it, in the same statement: no attempt spent, its
    wake-ups gone, reported as EXPIRED."""
    registry = Registry()
    ran: list[uuid.UUID] = []

    @registry.handler("stamp")
    async def stamp(j: consumers.Job) -> None:
        ran.append(j.id)

    job_id = enqueue(engine, "stamp", {}, expires=timedelta(seconds=0.2))
    fresh = enqueue(engine, "stamp", {}, expires=timedelta(minutes=1))
    await asyncio.sleep(0.3)
    async with JobRunner(db_url, registry) as runner:
        claim = await runner.store.claim(
            [job_id, fresh], registry.claim_terms(), free_threads=1, worker_ttl=60
        )
    assert claim.missed == {job_id: "EXPIRED"}
    assert [c.job_id for c in claim.claimed] == [fresh]
    row = job(pg, job_id)
    assert (row["state"], row["last_error_code"], row["attempt_count"]) == (
        "CANCELLED",
        "EXPIRED",
        0,
    )
    assert pg.execute("SELECT count(*) FROM outbox WHERE job_id = %s", [job_id]).fetchone() == (0,)


def test_a_deadline_is_checked_before_anything_is_written(engine: Engine) -> None:
    with Session(engine) as session, pytest.raises(ValueError, match="expires must be"):
        from datetime import datetime

        outbox.enqueue(session, "stamp", {}, expires=datetime(2030, 1, 1))
    with Session(engine) as session, pytest.raises(TypeError, match="expires"):
        outbox.enqueue(session, "stamp", {}, expires=5)  # type: ignore[arg-type]


def test_ten_debounced_enqueues_within_a_second_run_one_job_with_the_last_payload(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    """Trailing edge: each enqueue moves the start to 1 s after it; all ten return
    the same job, which runs once, with the tenth payload. Once it has started, the
    key makes a new job."""
    pg.execute(STARTS_TABLE)
    env = service_env(db_url, amqp_url, topology)
    debounce = {"dedup_key": "reindex:42", "debounce": timedelta(seconds=1)}
    with (
        running("relay", FAST, env, "relay.started"),
        running("consumer", APP, env, "consumer.started"),
    ):
        ids = []
        first = time.monotonic()
        for n in range(10):
            ids.append(enqueue(engine, "stamp", {"n": n}, **debounce))
            time.sleep(0.02)
        assert time.monotonic() - first < 1.0
        assert len(set(ids)) == 1
        row = asyncio.run(wait_for_state(pg, ids[0], "SUCCEEDED", timeout=30))
        assert row["started_at"] >= row["created_at"] + timedelta(seconds=1.5)
        again = enqueue(engine, "stamp", {"n": 10}, **debounce)
        assert again != ids[0], "once started, the key makes a new job"
        asyncio.run(wait_for_state(pg, again, "SUCCEEDED", timeout=30))
    starts = pg.execute("SELECT job_id, payload FROM starts ORDER BY at").fetchall()
    assert starts == [(ids[0], {"n": 9}), (again, {"n": 10})]
    assert pg.execute("SELECT count(*) FROM jobs").fetchone() == (2,)


def test_debounce_never_moves_a_start_past_debounce_max(
    engine: Engine, pg: psycopg.Connection
) -> None:
    debounce = {
        "dedup_key": "k",
        "debounce": timedelta(seconds=30),
        "debounce_max": timedelta(seconds=45),
    }
    first = enqueue(engine, "stamp", {"n": 0}, **debounce)
    created = job(pg, first)["created_at"]
    pg.execute("UPDATE jobs SET debounce_until = created_at + interval '20 seconds'")
    again = enqueue(engine, "stamp", {"n": 1}, **debounce)
    row = job(pg, first)
    assert again == first and row["payload"] == {"n": 1}
    assert row["run_after"] == created + timedelta(seconds=20), "capped at debounce_until"
    (available_at,) = pg.execute("SELECT available_at FROM outbox").fetchone()
    assert available_at == row["run_after"], "its wake-up moved with it"
    # Two in one batch: the last wins, both get its id.
    with Session(engine) as session, session.begin():
        pair = outbox.enqueue_many(
            session,
            [
                outbox.NewJob("stamp", {"n": n}, dedup_key="k", debounce=timedelta(1))
                for n in (2, 3)
            ],
        )
    assert pair == [first, first] and job(pg, first)["payload"] == {"n": 3}
    with Session(engine) as session, pytest.raises(ValueError, match="dedup_key"):
        outbox.enqueue(session, "stamp", {}, debounce=timedelta(seconds=1))
