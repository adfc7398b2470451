"""The testing helpers, used the way a user's own test suite would: assert what a
transaction enqueued, then run the jobs in-process through the real claim and
outcome statements, with no relay, consumer or RabbitMQ running."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Backoff, Registry
from hybrid_jobs.consumers.testing import JobRunner, run_jobs
from hybrid_jobs.outbox.testing import assert_enqueued, enqueued
from hybrid_jobs.plumbing.config import DatabaseUrl
from tests.support.jobs import attempts, job

app = Registry()


@app.handler("send_receipt")
async def send_receipt(j: consumers.Job) -> dict[str, int]:
    async with j.transaction() as tx:
        if await tx.once(f"receipt:{j.payload['order_id']}"):
            await tx.execute("INSERT INTO receipts VALUES (%s)", [j.payload["order_id"]])
        tx.set_result({"order_id": j.payload["order_id"]})
    return {"ignored": 1}


@app.handler("flaky", max_attempts=3, backoff=Backoff(base=60))
def flaky(j: consumers.Job) -> None:
    if j.attempt < 3:
        raise ConnectionError("upstream hiccup")


def place_order(session: Session, order_id: int) -> None:
    session.execute(text("INSERT INTO orders VALUES (:id)"), {"id": order_id})
    outbox.enqueue(session, "send_receipt", {"order_id": order_id}, queue="mail")


@pytest.fixture
def tables(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE orders (id int PRIMARY KEY)"))
        conn.execute(text("CREATE TABLE receipts (order_id int PRIMARY KEY)"))


def test_what_a_transaction_enqueued(engine: Engine, tables: None) -> None:
    with Session(engine) as session, session.begin():
        outbox.enqueue(session, "unrelated", {})
    with Session(engine) as session, session.begin():
        with session.begin_nested():  # a savepoint, as test fixtures often use
            place_order(session, 42)
        job = assert_enqueued(session, "send_receipt", payload={"order_id": 42}, queue="mail")
        assert [j.job_id for j in enqueued(session)] == [job.job_id], "only this transaction's"
        with pytest.raises(AssertionError, match=r"no send_receipt .*'order_id': 7"):
            assert_enqueued(session, "send_receipt", payload={"order_id": 7})
        with pytest.raises(TypeError, match="no such job field"):
            assert_enqueued(session, "send_receipt", colour="red")


def test_run_jobs_runs_the_real_claim_and_outcome(
    engine: Engine, db_url: DatabaseUrl, tables: None, pg
) -> None:
    with Session(engine) as session, session.begin():
        place_order(session, 1)
        place_order(session, 2)
    ran = run_jobs(db_url, app)
    assert sorted((r.job_type, r.state, r.attempt) for r in ran) == [
        ("send_receipt", "SUCCEEDED", 1),
        ("send_receipt", "SUCCEEDED", 1),
    ]
    assert pg.execute("SELECT count(*) FROM receipts").fetchone()[0] == 2
    for r in ran:
        row = job(pg, r.job_id)
        assert row["result"] == {"order_id": row["payload"]["order_id"]}
        assert [a["outcome"] for a in attempts(pg, r.job_id)] == ["SUCCEEDED"]
    assert run_jobs(db_url, app) == [], "nothing left to run"


async def test_retries_wait_their_backoff_unless_asked(engine: Engine, db_url: DatabaseUrl) -> None:
    with Session(engine) as session, session.begin():
        outbox.enqueue(session, "flaky", {})
    async with JobRunner(db_url, app) as runner:
        first = await runner.run_until_idle()
        assert [(r.state, r.error_code) for r in first] == [("RETRY_WAIT", "ConnectionError")]
        rest = await runner.run_until_idle(retries=True)
    assert [(r.attempt, r.state) for r in rest] == [(2, "RETRY_WAIT"), (3, "SUCCEEDED")]
