"""Enqueue from the handler's own object, on the real services: the rows it writes,
the fields it refuses before writing anything, its async twin, a consumer calling
handlers with the payload's fields (and failing a payload that does not fit them at
once), and strict job types refusing a typo."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.inproc import both_running
from tests.support.jobs import attempts, job, wait_for_state

app = Registry()
seen: dict[uuid.UUID, dict[str, Any]] = {}


@app.handler("send_receipt", queue="mail")
async def send_receipt(j: consumers.Job, *, order_id: int, note: str = "") -> None:
    seen[j.id] = {"order_id": order_id, "note": note}


@app.handler("resize", queue="images")
def resize(j: consumers.Job, *, image: int, sizes: list[int]) -> None:
    seen[j.id] = {"image": image, "sizes": sizes}


COLUMNS = (
    "job_type, queue, state, payload, priority, dedup_key, tenant, max_attempts,"
    " attempt_count, lease_generation, run_after > created_at"
)


def _row(pg: psycopg.Connection, job_id: uuid.UUID) -> tuple[Any, ...]:
    row = pg.execute(f"SELECT {COLUMNS} FROM jobs WHERE job_id = %s", [job_id]).fetchone()
    wakeups = pg.execute("SELECT queue FROM outbox WHERE job_id = %s", [job_id]).fetchall()
    assert row is not None
    return (*row, wakeups)


def _count(pg: psycopg.Connection) -> tuple[int, int]:
    jobs = pg.execute("SELECT count(*) FROM jobs").fetchone()
    wakeups = pg.execute("SELECT count(*) FROM outbox").fetchone()
    assert jobs is not None and wakeups is not None
    return jobs[0], wakeups[0]


def test_enqueue_from_the_handler_writes_what_outbox_enqueue_writes_on_its_queue(
    engine: Engine, pg: psycopg.Connection
) -> None:
    with Session(engine) as session, session.begin():
        typed = send_receipt.enqueue(session, order_id=1, note="thanks")
        plain = outbox.enqueue(
            session, "send_receipt", {"order_id": 1, "note": "thanks"}, queue="mail"
        )
        tuned = send_receipt.with_options(priority=5, dedup_key="r:2", tenant="acme")
        first = tuned.enqueue(session, order_id=2)
        again = tuned.enqueue(session, order_id=2)
        (many,) = outbox.enqueue_many(session, [resize.new_job(image=3, sizes=[64])])
    assert _row(pg, typed) == _row(pg, plain)
    assert _row(pg, typed)[:4] == (
        "send_receipt",
        "mail",
        "QUEUED",
        {"order_id": 1, "note": "thanks"},
    )
    assert again == first, "the dedup_key option found the first job"
    assert _row(pg, first)[4:7] == (5, "r:2", "acme")
    assert _row(pg, many)[:4] == ("resize", "images", "QUEUED", {"image": 3, "sizes": [64]})
    assert _count(pg) == (4, 4)


def test_a_wrong_missing_or_extra_field_is_refused_before_anything_is_written(
    engine: Engine, pg: psycopg.Connection
) -> None:
    with Session(engine) as session, session.begin():
        with pytest.raises(TypeError, match="send_receipt: field 'order_id' must be int, not str"):
            send_receipt.enqueue(session, order_id="1")
        with pytest.raises(TypeError, match="send_receipt: missing field 'order_id'"):
            send_receipt.enqueue(session, note="no order")
        with pytest.raises(TypeError, match=r"unexpected field 'ordre_id'.*'order_id'"):
            send_receipt.enqueue(session, ordre_id=1)
        with pytest.raises(TypeError, match=r"resize: field 'sizes'\[1\] must be int, not str"):
            resize.with_options(priority=1).enqueue(session, image=1, sizes=[1, "2"])
        with pytest.raises(TypeError, match="enqueue has no option 'priorty'"):
            send_receipt.with_options(priorty=1)
        # the transaction is still usable
        send_receipt.enqueue(session, order_id=9)
    assert _count(pg) == (1, 1)


async def test_enqueue_async_writes_through_an_async_session(
    async_engine: AsyncEngine, pg: psycopg.Connection
) -> None:
    async with AsyncSession(async_engine) as session, session.begin():
        job_id = await send_receipt.with_options(priority=2).enqueue_async(session, order_id=4)
        with pytest.raises(TypeError, match="missing field 'order_id'"):
            await send_receipt.enqueue_async(session)
    assert _row(pg, job_id)[:5] == ("send_receipt", "mail", "QUEUED", {"order_id": 4}, 2)
    assert _count(pg) == (1, 1)


async def test_a_consumer_calls_keyword_handlers_with_the_payload_fields(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    with Session(engine) as session, session.begin():
        receipt = send_receipt.enqueue(session, order_id=5)
        image = resize.enqueue(session, image=6, sizes=[32, 64])
    async with both_running(db_url, amqp_url, topology, app):
        for job_id in (receipt, image):
            await wait_for_state(pg, job_id, "SUCCEEDED")
    assert seen[receipt] == {"order_id": 5, "note": ""}
    assert seen[image] == {"image": 6, "sizes": [32, 64]}


async def test_a_payload_that_does_not_fit_the_handler_fails_at_once_with_bad_payload(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    """Written past the check (outbox.enqueue, another language, an older producer):
    no retry can fix the payload, so the first attempt fails the job."""
    with Session(engine) as session, session.begin():
        wrong = outbox.enqueue(session, "send_receipt", {"order_id": "5"}, queue="mail")
        extra = outbox.enqueue(
            session, "resize", {"image": 1, "sizes": [], "dpi": 2}, queue="images"
        )
    async with both_running(db_url, amqp_url, topology, app):
        ended = [await wait_for_state(pg, j, "FAILED") for j in (wrong, extra)]
    assert [(r["attempt_count"], r["last_error_code"]) for r in ended] == [(1, "BAD_PAYLOAD")] * 2
    assert "field 'order_id' must be int, not str" in ended[0]["last_error_message"]
    assert "unexpected field 'dpi'" in ended[1]["last_error_message"]
    assert [a["error_code"] for a in attempts(pg, wrong)] == ["BAD_PAYLOAD"]
    assert wrong not in seen and extra not in seen


@pytest.fixture
def strict_off() -> Any:
    yield
    outbox.require_known_job_types(None)


def test_strict_mode_refuses_a_typo_naming_the_known_type_and_accepts_known_ones(
    engine: Engine, pg: psycopg.Connection, strict_off: None
) -> None:
    outbox.require_known_job_types(app)
    with Session(engine) as session, session.begin():
        with pytest.raises(ValueError, match=r"'send_reciept' has no handler.*'send_receipt'"):
            outbox.enqueue(session, "send_reciept", {"order_id": 1}, queue="mail")
        with pytest.raises(ValueError, match=r"'resise' has no handler.*'resize'"):
            outbox.enqueue_many(
                session,
                [resize.new_job(image=1, sizes=[]), outbox.NewJob("resise", {}, queue="images")],
            )
        known = outbox.enqueue(session, "send_receipt", {"order_id": 1}, queue="mail")
        typed = resize.enqueue(session, image=2, sizes=[8])
    assert job(pg, known)["state"] == job(pg, typed)["state"] == "QUEUED"
    assert _count(pg) == (2, 2), "nothing of the refused batch was written"
    outbox.require_known_job_types(None)
    with Session(engine) as session, session.begin():
        outbox.enqueue(session, "send_reciept", {})  # off again: it waits, NO_HANDLER
    assert _count(pg) == (3, 3)
