"""The scope of a dedup key (enqueue's unique=): how long an enqueue with the key
returns the job that holds it. Driven through the real enqueue and the real claim,
outcome, sweep, cancel and replay statements."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from harness.claim import claim_params
from hybrid_jobs import outbox
from hybrid_jobs.consumers.outcome import Outcome
from hybrid_jobs.consumers.store import finish_params
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.schema import queries as q
from tests.support.jobs import enqueue, enqueue_many, job


def _claim(pg: psycopg.Connection, job_id: uuid.UUID) -> int:
    """Claims the job for worker w1; its lease generation."""
    rows = pg.execute(q.JOB_CLAIM_MANY, claim_params([job_id], "w1")).fetchall()
    assert [row[0] for row in rows] == ["claimed"], rows
    return int(job(pg, job_id)["lease_generation"])


def _finish(pg: psycopg.Connection, job_id: uuid.UUID, generation: int, outcome: Outcome) -> str:
    rows = pg.execute(q.JOB_FINISH_MANY, finish_params("w1", [(job_id, generation, outcome)]))
    return str(rows.fetchone()[1])  # type: ignore[index]


def _jobs(pg: psycopg.Connection) -> int:
    return int(pg.execute("SELECT count(*) FROM jobs").fetchone()[0])  # type: ignore[index]


def _again(engine: Engine, unique: Any, key: str = "k", **kw: Any) -> uuid.UUID:
    return enqueue(engine, "noop", dedup_key=key, unique=unique, **kw)


def test_a_waiting_key_is_held_until_the_claim_and_free_after_it(
    engine: Engine, pg: psycopg.Connection
) -> None:
    first = _again(engine, "waiting")
    assert _again(engine, "waiting") == first
    generation = _claim(pg, first)
    second = _again(engine, "waiting")
    assert second != first, "a started job still held its waiting key"
    assert _again(engine, "waiting") == second
    # The first one's retry waits again, but has started: the key stays the second's.
    assert _finish(pg, first, generation, Outcome.retry("E", "again", 0)) == "RETRY_WAIT"
    assert _again(engine, "waiting") == second
    assert _jobs(pg) == 2


def test_a_job_waiting_for_approval_holds_its_waiting_key_until_rejected(
    engine: Engine, pg: psycopg.Connection
) -> None:
    held = _again(engine, "waiting", needs_approval=True)
    assert _again(engine, "waiting") == held
    with Session(engine) as session, session.begin():
        outbox.reject(session, held, reason="no")
    assert _again(engine, "waiting") != held


def _succeed(pg: psycopg.Connection, job_id: uuid.UUID, generation: int) -> str:
    return _finish(pg, job_id, generation, Outcome.succeeded())


def _fail(pg: psycopg.Connection, job_id: uuid.UUID, generation: int) -> str:
    return _finish(pg, job_id, generation, Outcome.failed("BAD", "permanent"))


def _cancelled(pg: psycopg.Connection, job_id: uuid.UUID, generation: int) -> str:
    return _finish(pg, job_id, generation, Outcome.cancelled("stop"))


def _swept(pg: psycopg.Connection, job_id: uuid.UUID, generation: int) -> str:
    # its only attempt's lease ran out: the sweeper ends it FAILED
    pg.execute(
        "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = %s",
        [job_id],
    )
    swept = pg.execute(q.JOB_SWEEP_EXPIRED, {"limit": 10, "default_backoff": 5}).fetchall()
    assert [row[0] for row in swept] == [job_id]
    return str(swept[0][1])


@pytest.mark.parametrize(
    ("end", "state"),
    [
        (_succeed, "SUCCEEDED"),
        (_fail, "FAILED"),
        (_cancelled, "CANCELLED"),
        (_swept, "FAILED"),
    ],
    ids=["success", "failure", "cancel", "sweeper"],
)
def test_an_active_key_is_freed_by_every_end_of_the_lease_that_ends_the_job(
    engine: Engine,
    pg: psycopg.Connection,
    end: Callable[[psycopg.Connection, uuid.UUID, int], str],
    state: str,
) -> None:
    first = _again(engine, "active", max_attempts=1)
    generation = _claim(pg, first)
    assert _again(engine, "active") == first, "a running job's active key was free"
    assert end(pg, first, generation) == state
    assert _again(engine, "active") != first, f"a job ended {state} still held its key"


def test_an_active_key_is_kept_through_a_retry_and_a_snooze(
    engine: Engine, pg: psycopg.Connection
) -> None:
    first = _again(engine, "active")
    generation = _claim(pg, first)
    assert _finish(pg, first, generation, Outcome.retry("E", "again", 0)) == "RETRY_WAIT"
    assert _again(engine, "active") == first
    generation = _claim(pg, first)
    assert _finish(pg, first, generation, Outcome.snoozed(0)) == "QUEUED"
    assert _again(engine, "active") == first
    assert _jobs(pg) == 1


def test_a_cancel_request_frees_the_active_key_of_a_waiting_job(
    engine: Engine, pg: psycopg.Connection
) -> None:
    first = _again(engine, "active")
    with Session(engine) as session, session.begin():
        assert outbox.request_cancel(session, first) == "CANCELLED"
    assert _again(engine, "active") != first


def test_a_forever_key_outlives_its_job_as_before(engine: Engine, pg: psycopg.Connection) -> None:
    first = enqueue(engine, "noop", dedup_key="k")
    assert _succeed(pg, first, _claim(pg, first)) == "SUCCEEDED"
    assert enqueue(engine, "noop", dedup_key="k") == first
    assert _again(engine, "forever") == first
    assert job(pg, first)["unique_key"] is None, "a forever key went to the scoped column"


def test_a_period_key_is_held_within_its_window_and_free_in_the_next(
    engine: Engine, pg: psycopg.Connection
) -> None:
    hour = timedelta(hours=1)
    # Never across the hour's end: wait it out if it is a few seconds away.
    left = "SELECT extract(epoch FROM date_trunc('hour', now()) + interval '1 hour' - now())"
    while float(pg.execute(left).fetchone()[0]) < 5:  # type: ignore[index]
        time.sleep(0.2)
    first = _again(engine, hour)
    assert _succeed(pg, first, _claim(pg, first)) == "SUCCEEDED"
    assert _again(engine, hour) == first, "a period key was free within its window"

    second = _again(engine, timedelta(seconds=1), key="short")
    assert _again(engine, timedelta(seconds=1), key="short") == second
    until = job(pg, second)["unique_until"]
    deadline = time.monotonic() + 30
    while pg.execute("SELECT now() < %s", [until]).fetchone()[0]:  # type: ignore[index]
        assert time.monotonic() < deadline, "the database clock did not pass the window"
        time.sleep(0.05)
    third = _again(engine, timedelta(seconds=1), key="short")
    assert third != second, "a period key was held past its window"
    assert job(pg, second)["state"] == "QUEUED"


def test_a_replayed_job_comes_back_without_its_active_key(
    engine: Engine, pg: psycopg.Connection
) -> None:
    first = _again(engine, "active")
    assert _fail(pg, first, _claim(pg, first)) == "FAILED"
    second = _again(engine, "active")
    with Session(engine) as session, session.begin():
        assert outbox.retry_job(session, first) == "QUEUED"
    assert job(pg, first)["unique_key"] is None
    assert _again(engine, "active") == second


def test_two_producers_racing_for_one_key_get_one_job(
    engine: Engine, pg: psycopg.Connection
) -> None:
    results: list[uuid.UUID] = []
    with Session(engine) as first_session:
        with first_session.begin():
            first = outbox.enqueue(first_session, "noop", {}, dedup_key="k", unique="active")
            pid = first_session.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar()
            racer = threading.Thread(target=lambda: results.append(_again(engine, "active")))
            racer.start()
            # The second producer's insert waits for this uncommitted one.
            waiting = """
                SELECT count(*) FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid)
                WHERE NOT l.granted AND a.pid <> %s AND a.datname = current_database()
            """
            deadline = time.monotonic() + 30
            while not pg.execute(waiting, [pid]).fetchone()[0]:  # type: ignore[index]
                assert time.monotonic() < deadline, "the second producer never waited"
                time.sleep(0.02)
        racer.join(timeout=30)
    assert results == [first]
    assert _jobs(pg) == 1


def test_enqueue_many_with_one_key_twice_in_a_batch_makes_one_job(
    engine: Engine, pg: psycopg.Connection
) -> None:
    ids = enqueue_many(
        engine,
        [
            NewJob("noop", {"n": 1}, dedup_key="a", unique="active"),
            NewJob("noop", {"n": 2}, dedup_key="a", unique="active"),
            NewJob("noop", {"n": 3}, dedup_key="b", unique="waiting"),
            NewJob("noop", {"n": 4}, dedup_key="b", unique="waiting", tags=["t"]),
            NewJob("noop", {"n": 5}, dedup_key="a"),
            NewJob("noop", {"n": 6}),
        ],
    )
    assert ids[0] == ids[1] and ids[2] == ids[3]
    assert len(set(ids)) == 4, "a forever key and a scoped one are two keys"
    assert job(pg, ids[0])["payload"] == {"n": 1}
    assert _jobs(pg) == 4
    # and once held, a later batch finds them
    again = enqueue_many(engine, [NewJob("noop", {}, dedup_key="a", unique="active")])
    assert again == [ids[0]]


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"dedup_key": "k", "unique": "sometimes"}, ValueError),
        ({"dedup_key": "k", "unique": True}, TypeError),
        ({"dedup_key": "k", "unique": 60}, TypeError),
        ({"dedup_key": "k", "unique": timedelta(milliseconds=500)}, ValueError),
        ({"dedup_key": "k", "unique": timedelta(days=3651)}, ValueError),
        ({"unique": "active"}, ValueError),
        ({"dedup_key": "k", "unique": "waiting", "debounce": timedelta(seconds=1)}, ValueError),
    ],
    ids=["unknown", "bool", "number", "too-short", "too-long", "no-key", "debounced"],
)
def test_a_bad_unique_is_refused_before_anything_is_written(
    engine: Engine, pg: psycopg.Connection, fields: dict[str, Any], error: type[Exception]
) -> None:
    with Session(engine) as session, session.begin():
        good = NewJob("noop", {}, dedup_key="fine", unique="active")
        with pytest.raises(error, match=r"unique|debounce"):
            outbox.enqueue_many(session, [good, NewJob("noop", {}, **fields)])
    assert _jobs(pg) == 0
