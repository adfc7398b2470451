"""outbox.wait_for: woken at the commit that ended the job, through one listening
connection per process, whatever the number of waiters."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import psycopg
import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.outbox.waiting import APPLICATION_NAME
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.api import api_client
from tests.support.jobs import enqueue, enqueue_many
from tests.support.processes import running, service_env

APP = ["--app", "tests.apps.basic"]


def _listeners(pg: psycopg.Connection) -> int:
    row = pg.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = %s",
        [APPLICATION_NAME],
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_wait_for_returns_the_result_of_a_job_run_by_real_processes(
    engine: Engine,
    env: dict[str, str],
) -> None:
    with (
        running("relay", [], env, "relay.started"),
        running("consumer", APP, env, "consumer.started"),
    ):
        job_id = enqueue(engine, "echo", {"seconds": 0.3, "answer": 42})
        done = outbox.wait_for(engine, job_id, timeout=20)
        assert done.state == "SUCCEEDED"
        assert done.result == {"seconds": 0.3, "answer": 42}
        assert done.finished_at is not None
        failing = enqueue(engine, "always_fails")
        failed = outbox.wait_for(engine, failing, timeout=20)
        assert failed.state == "FAILED"
        assert failed.result is None
        assert failed.last_error_message == "RuntimeError: attempt 3 failed"


async def test_wait_for_async_returns_when_the_job_is_cancelled(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    job_id = enqueue(engine, "echo", {})
    waiting = asyncio.create_task(outbox.wait_for_async(async_engine, job_id, timeout=20))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    cancelled_at = time.monotonic()
    with Session(engine) as session, session.begin():
        outbox.request_cancel(session, job_id)
    done = await waiting
    assert done.state == "CANCELLED"
    assert time.monotonic() - cancelled_at < 5


async def test_wait_for_takes_the_id_as_text_as_jobctl_and_the_api_give_it(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    """An id given as text is woken by the commit that ends the job, like a UUID: it
    was kept as text and never matched, so the wait ran out its whole timeout."""
    job_id = enqueue(engine, "echo", {})
    waiting = asyncio.create_task(outbox.wait_for_async(async_engine, str(job_id), timeout=20))
    threaded: list[outbox.Finished] = []
    thread = threading.Thread(
        target=lambda: threaded.append(outbox.wait_for(engine, str(job_id), timeout=20))
    )
    thread.start()
    await asyncio.sleep(0.3)
    assert not waiting.done()
    cancelled_at = time.monotonic()
    with Session(engine) as session, session.begin():
        outbox.request_cancel(session, job_id)
    done = await waiting
    await asyncio.to_thread(thread.join, 20)
    assert done.state == "CANCELLED" and done.job_id == job_id
    assert [t.state for t in threaded] == ["CANCELLED"]
    assert time.monotonic() - cancelled_at < 5
    with pytest.raises(ValueError, match="must be a UUID"):
        outbox.wait_for(engine, "not-an-id", timeout=1)


def test_wait_for_times_out_and_knows_unknown_and_finished_jobs(
    engine: Engine, pg: psycopg.Connection
) -> None:
    job_id = enqueue(engine, "echo", {})
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=str(job_id)):
        outbox.wait_for(engine, job_id, timeout=0.5)
    assert 0.5 <= time.monotonic() - started < 5
    with pytest.raises(outbox.JobNotFound):
        outbox.wait_for(engine, uuid.uuid4(), timeout=5)
    with pytest.raises(ValueError, match="timeout"):
        outbox.wait_for(engine, job_id, timeout=-1)
    # Ended before anyone waited: the read after LISTEN sees it, no notification needed.
    pg.execute(
        "UPDATE jobs SET state = 'CANCELLED', finished_at = now() WHERE job_id = %s", [job_id]
    )
    assert outbox.wait_for(engine, job_id, timeout=5).state == "CANCELLED"


def test_a_thread_waiting_is_woken_at_the_commit_not_before(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    job_id = enqueue(engine, "echo", {})
    got: list[outbox.Finished] = []
    waiter = threading.Thread(target=lambda: got.append(outbox.wait_for(engine, job_id, 20)))
    waiter.start()
    with psycopg.connect(db_url.conninfo) as conn:
        conn.execute(
            "UPDATE jobs SET state = 'CANCELLED', finished_at = now() WHERE job_id = %s", [job_id]
        )
        time.sleep(0.5)
        assert not got, "woken before the commit"
        conn.commit()
    waiter.join(10)
    assert got and got[0].state == "CANCELLED"
    assert _listeners(pg) == 1


async def test_a_thousand_async_waiters_share_one_connection(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    ids = enqueue_many(engine, [NewJob("echo", {"i": i}) for i in range(1000)])
    eng = create_async_engine(db_url.sqlalchemy, pool_size=5, max_overflow=5, pool_timeout=60)
    try:
        waiting = [asyncio.create_task(outbox.wait_for_async(eng, i, timeout=90)) for i in ids]
        await asyncio.sleep(1)
        assert not any(w.done() for w in waiting)
        assert _listeners(pg) == 1
        env = service_env(db_url, amqp_url, topology)
        with (
            running("relay", [], env, "relay.started"),
            running("consumer", [*APP, "--concurrency", "50"], env, "consumer.started"),
        ):
            done = await asyncio.gather(*waiting)
        assert [d.result for d in done] == [{"i": i} for i in range(1000)]
        assert _listeners(pg) == 1
    finally:
        await eng.dispose()


async def test_get_a_job_with_wait_answers_when_it_ends(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection
) -> None:
    job_id = enqueue(engine, "echo", {})
    async with api_client(db_url) as client:
        assert (await client.get(f"/v1/jobs/{job_id}", params={"wait": 31})).status_code == 422
        assert (await client.get(f"/v1/jobs/{job_id}", params={"wait": -1})).status_code == 422
        started = time.monotonic()
        timed_out = await client.get(f"/v1/jobs/{job_id}", params={"wait": 0.5})
        assert timed_out.status_code == 200
        assert timed_out.json()["state"] == "QUEUED"
        assert time.monotonic() - started >= 0.5

        async def finish() -> None:
            await asyncio.sleep(0.5)
            await asyncio.to_thread(
                pg.execute,
                "UPDATE jobs SET state = 'SUCCEEDED', finished_at = now(), result = '7'"
                " WHERE job_id = %s",
                [job_id],
            )

        finishing = asyncio.create_task(finish())
        started = time.monotonic()
        answer = await client.get(f"/v1/jobs/{job_id}", params={"wait": 20})
        await finishing
        assert answer.status_code == 200
        assert answer.json()["state"] == "SUCCEEDED"
        assert answer.json()["result"] == 7
        assert time.monotonic() - started < 10
        assert "Retry-After" not in answer.headers


def test_the_listener_follows_the_engine_url_not_a_global(db_url: DatabaseUrl) -> None:
    eng = create_engine(db_url.sqlalchemy)
    try:
        with pytest.raises(outbox.JobNotFound):
            outbox.wait_for(eng, uuid.uuid4(), timeout=5)
    finally:
        eng.dispose()


def test_an_engine_with_startup_options_listens_with_them(
    db_url: DatabaseUrl, pg: psycopg.Connection
) -> None:
    """An engine made from an instance's URL carries ``options=-c search_path=...``,
    which SQLAlchemy writes with a ``+`` for the space. Its listener read that as a
    setting named ``+search_path``, was refused at every connect, and each wait ran
    to its timeout, as `jobctl serve`'s ``?wait=`` did."""
    eng = create_engine(db_url.in_schema("public").sqlalchemy)
    try:
        job_id = enqueue(eng, "echo", {})
        got: list[outbox.Finished] = []
        waiter = threading.Thread(target=lambda: got.append(outbox.wait_for(eng, job_id, 60)))
        waiter.start()
        deadline = time.monotonic() + 30
        while _listeners(pg) == 0:
            assert time.monotonic() < deadline, "the listener never connected"
            time.sleep(0.05)
        pg.execute(
            "UPDATE jobs SET state = 'SUCCEEDED', attempt_count = 1, started_at = now(),"
            " finished_at = now() WHERE job_id = %s",
            [job_id],
        )
        waiter.join(30)
        assert not waiter.is_alive(), "woken by the job's end, not by its timeout"
        assert got[0].state == "SUCCEEDED"
    finally:
        eng.dispose()


def test_a_lost_listening_connection_is_replaced_and_no_end_is_missed(
    engine: Engine, pg: psycopg.Connection
) -> None:
    job_id = enqueue(engine, "echo", {})
    got: list[outbox.Finished] = []
    waiter = threading.Thread(target=lambda: got.append(outbox.wait_for(engine, job_id, 20)))
    waiter.start()
    time.sleep(0.5)
    assert _listeners(pg) == 1
    pg.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = %s",
        [APPLICATION_NAME],
    )
    # Ended while nobody listens: its notification is lost, the row is not.
    pg.execute(
        "UPDATE jobs SET state = 'CANCELLED', finished_at = now() WHERE job_id = %s", [job_id]
    )
    waiter.join(15)
    assert got and got[0].state == "CANCELLED"
