"""The shorter claim of plain jobs (JOB_CLAIM_PLAIN_MANY): it takes the jobs that use
no key, resource, deadline or rate limit, with a handler here, in an unpaused queue,
and leaves every other named job exactly as it was, for the whole claim to decide;
the consumer's store runs the two, so that every job is claimed, or turned down with
its reason recorded, as by the whole claim alone (within one batch the plain jobs
take the free threads and tenant slots first)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from harness.claim import claim_params
from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.consumers import store as store_module
from hybrid_jobs.consumers.store import LOCKED, JobStore
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.plumbing.db import Native, make_pool
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.topology import Topology
from tests.support.broker import publish_raw
from tests.support.inproc import consumer_running
from tests.support.jobs import attempts, enqueue, job, versions, wait_for_state


@pytest.fixture
def mixed(engine: Engine) -> dict[str, uuid.UUID]:
    """One plain job, and one of each kind the plain claim must leave alone."""
    with Session(engine) as session, session.begin():
        outbox.set_rate_limit(session, "stripe", rate=1000, per=timedelta(seconds=1))
        outbox.pause_queue(session, "paused")
    return {
        "plain": enqueue(engine, "noop"),
        "keyed": enqueue(engine, "noop", key="account:1"),
        "ordered": enqueue(engine, "noop", key="account:2", ordered=True),
        "deadline": enqueue(engine, "noop", expires=timedelta(hours=1)),
        "rated": enqueue(engine, "noop", rate_limit="stripe"),
        "resource": enqueue(engine, "noop", resource="deploy:prod"),
        "no_handler": enqueue(engine, "unknown"),
        "paused": enqueue(engine, "noop", queue="paused"),
    }


def test_the_plain_claim_takes_plain_jobs_and_writes_nothing_of_the_others(
    pg: psycopg.Connection, mixed: dict[str, uuid.UUID]
) -> None:
    others = [i for name, i in mixed.items() if name != "plain"]
    before = versions(pg, others)
    rows = pg.execute(q.JOB_CLAIM_PLAIN_MANY, claim_params(list(mixed.values()), "w1")).fetchall()
    status = {row[1]: row[0] for row in rows}
    assert status == {i: "claimed" if i == mixed["plain"] else "full" for i in mixed.values()}
    assert versions(pg, others) == before
    plain = job(pg, mixed["plain"])
    assert (plain["state"], plain["lease_owner"], plain["lease_generation"]) == ("RUNNING", "w1", 1)
    assert plain["attempt_count"] == 1


async def test_the_store_claims_or_turns_down_each_job_as_the_whole_claim_would(
    pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection], mixed: dict[str, uuid.UUID]
) -> None:
    store = JobStore(pool, "w1", lease_seconds=30)
    terms = json.loads(claim_params([], "w1")["types"])
    found = await store.claim(
        list(mixed.values()), terms, queues=["default", "paused"], free_threads=0, worker_ttl=60
    )
    claimed = {c.job_id for c in found.claimed}
    taken = ("plain", "keyed", "ordered", "deadline", "rated", "resource")
    assert claimed == {mixed[n] for n in taken}
    assert found.missed == {mixed["no_handler"]: "NO_HANDLER", mixed["paused"]: "QUEUE_PAUSED"}
    assert job(pg, mixed["no_handler"])["delay_reason"] == "NO_HANDLER"
    assert job(pg, mixed["paused"])["delay_reason"] == "QUEUE_PAUSED"
    # the whole claim took the key, the token and the resource as it always does
    assert pg.execute("SELECT key FROM key_usage ORDER BY key").fetchall() == [
        ("account:1",),
        ("account:2",),
    ]
    assert pg.execute("SELECT taken FROM rate_buckets WHERE name = 'stripe'").fetchone() == (1,)
    holds = pg.execute("SELECT job_id FROM resource_holds").fetchall()
    assert holds == [(mixed["resource"],)]


async def test_the_two_claims_share_the_free_threads(
    pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection], engine: Engine
) -> None:
    # Two plain jobs and a keyed one of a plain-function handler, one thread free:
    # the plain claim takes it for the plain job of higher priority, and the whole
    # claim, given what is left, finds no thread for the other two.
    first = enqueue(engine, "sync", priority=5)
    second = enqueue(engine, "sync")
    keyed = enqueue(engine, "sync", key="k", priority=9)
    terms = [
        {
            "job_type": "sync",
            "max_attempts": 3,
            "backoff_base": 1.0,
            "backoff_cap": 60.0,
            "backoff_jitter": 0.0,
            "sync": True,
            "rate_limit": None,
        }
    ]
    store = JobStore(pool, "w1", lease_seconds=30)
    found = await store.claim(
        [first, second, keyed], terms, queues=["default"], free_threads=1, worker_ttl=60
    )
    assert [c.job_id for c in found.claimed] == [first]
    assert found.missed == {second: "no_thread", keyed: "no_thread"}
    assert job(pg, keyed)["state"] == "QUEUED"


async def test_a_whole_claim_that_fails_leaves_the_plain_jobs_claimed(
    pg: psycopg.Connection, db_url: DatabaseUrl, engine: Engine
) -> None:
    # The plain claim commits first: when the whole claim then fails (here, waiting
    # past lock_timeout for a key another transaction is inserting), the jobs it took
    # are still returned, to be started, and the rest are tried again as 'locked'.
    plain = enqueue(engine, "noop")
    keyed = enqueue(engine, "noop", key="busy")
    with psycopg.connect(db_url.conninfo) as holder:
        holder.execute("INSERT INTO key_usage (key, running, key_limit) VALUES ('busy', 0, 1)")
        pool = make_pool(db_url, "test-claim-plain", 2, options="-c lock_timeout=200")
        await pool.open(wait=True)
        try:
            store = JobStore(pool, "w1", lease_seconds=30)
            terms = json.loads(claim_params([], "w1")["types"])
            found = await store.claim(
                [plain, keyed], terms, queues=["default"], free_threads=0, worker_ttl=60
            )
        finally:
            await pool.close()
        holder.rollback()
    assert [c.job_id for c in found.claimed] == [plain]
    assert found.missed == {keyed: LOCKED}
    assert (job(pg, plain)["state"], job(pg, plain)["lease_owner"]) == ("RUNNING", "w1")
    assert job(pg, keyed)["state"] == "QUEUED"


async def test_a_whole_claim_whose_answer_was_lost_still_starts_its_jobs(
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One wake-up names a plain job and a keyed one. The plain claim takes the first;
    # the whole claim takes the second and commits, and then its connection drops
    # before the answer arrives. The keyed job is this worker's, and only it can start
    # it: it must run now, once, not sit RUNNING until its lease lapses (an attempt
    # spent and the key held for nothing).
    plain = enqueue(engine, "noop")
    keyed = enqueue(engine, "noop", key="account:7")
    lost: list[uuid.UUID] = []

    class AnswerLost(Native):
        async def execute(self, conn, params):  # type: ignore[no-untyped-def]
            cur = await super().execute(conn, params)
            if not lost:
                await cur.fetchall()
                await conn.commit()
                lost.extend(params["job_ids"])
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return cur

    real_native = store_module.native
    monkeypatch.setattr(
        store_module,
        "native",
        # the whole claim, composed of the gates of the jobs it is given
        lambda sql: AnswerLost(sql) if sql == q.job_claim_many(["key"]) else real_native(sql),
    )
    registry = Registry()
    ran: list[uuid.UUID] = []

    @registry.handler("noop")
    async def noop(j: consumers.Job) -> None:
        ran.append(j.id)

    async with consumer_running(db_url, amqp_url, topology, registry) as consumer:
        body = f"{plain}\n{keyed}".encode()
        await publish_raw(amqp_url.url, topology, "default", body)
        await wait_for_state(pg, plain, "SUCCEEDED", timeout=20)
        await wait_for_state(pg, keyed, "SUCCEEDED", timeout=5)
        assert consumer.claimer.counts["claims_recovered"] == 1
    assert lost == [keyed]
    assert sorted(ran) == sorted([plain, keyed])
    assert [a["outcome"] for a in attempts(pg, keyed)] == ["SUCCEEDED"]
    assert pg.execute("SELECT count(*) FROM key_usage").fetchone() == (0,)
