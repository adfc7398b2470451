"""The shorter outcome of plain leases (JOB_FINISH_PLAIN_MANY): it records the
outcomes of leases that hold no key and no resource, with the history row, the
retry's wake-up and the tenant slot's release that every end of a lease writes, and
leaves the others exactly as they were ('full'), for the whole outcome; the
consumer's store runs the two, so that every outcome lands as by the whole outcome
alone, and a retry after the second one failed finds the first's recorded."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any, LiteralString

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from harness.claim import claim_params
from hybrid_jobs import outbox
from hybrid_jobs.consumers import store as store_module
from hybrid_jobs.consumers.outcome import Outcome
from hybrid_jobs.consumers.store import JobStore, finish_params
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.plumbing.db import make_pool
from hybrid_jobs.schema import queries as q
from tests.support.jobs import attempts, enqueue, job, versions

Held = dict[str, tuple[uuid.UUID, int]]


@pytest.fixture
async def held(engine: Engine, pool: AsyncConnectionPool[AsyncConnection]) -> Held:
    """Leases of w1 on a plain job, a capped tenant's plain job, a keyed job and a
    job holding a resource, claimed as a consumer claims them."""
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_running=2)
    ids = {
        "plain": enqueue(engine, "noop"),
        "tenant": enqueue(engine, "noop", tenant="acme"),
        "keyed": enqueue(engine, "noop", key="account:1"),
        "resource": enqueue(engine, "noop", resource="deploy:prod"),
    }
    store = JobStore(pool, "w1", lease_seconds=30)
    terms = json.loads(claim_params([], "w1")["types"])
    found = await store.claim(
        list(ids.values()), terms, queues=["default"], free_threads=0, worker_ttl=60
    )
    generation = {c.job_id: c.generation for c in found.claimed}
    assert set(generation) == set(ids.values())
    return {name: (i, generation[i]) for name, i in ids.items()}


def test_the_plain_outcome_records_plain_leases_and_writes_nothing_of_the_others(
    pg: psycopg.Connection, held: Held
) -> None:
    others = [held["keyed"][0], held["resource"][0]]
    before = versions(pg, others)
    batch = [(i, g, Outcome.succeeded('{"ok": true}')) for i, g in held.values()]
    rows = pg.execute(q.JOB_FINISH_PLAIN_MANY, finish_params("w1", batch)).fetchall()
    plain, tenant = held["plain"][0], held["tenant"][0]
    assert dict(rows) == {plain: "SUCCEEDED", tenant: "SUCCEEDED"} | {i: "full" for i in others}
    assert versions(pg, others) == before
    assert job(pg, plain)["result"] == {"ok": True}
    assert [a["outcome"] for a in attempts(pg, tenant)] == ["SUCCEEDED"]
    # the tenant's slot is free again; the key and the resource are still held
    assert pg.execute("SELECT running FROM tenant_usage WHERE tenant = 'acme'").fetchone() == (0,)
    assert pg.execute("SELECT count(*) FROM key_usage").fetchone() == (1,)
    assert pg.execute("SELECT count(*) FROM resource_holds").fetchone() == (1,)
    # a stale outcome (the generation moved on) matches nothing
    stale = [(plain, held["plain"][1], Outcome.succeeded())]
    assert pg.execute(q.JOB_FINISH_PLAIN_MANY, finish_params("w1", stale)).fetchall() == []


def test_a_plain_retry_is_woken_again_at_its_run_after(pg: psycopg.Connection, held: Held) -> None:
    plain, generation = held["plain"]
    batch = [(plain, generation, Outcome.retry("Boom", "boom", 30.0))]
    rows = pg.execute(q.JOB_FINISH_PLAIN_MANY, finish_params("w1", batch)).fetchall()
    assert rows == [(plain, "RETRY_WAIT")]
    # (its first wake-up, never sent here, is still there too)
    later = "SELECT count(*) FROM outbox WHERE job_id = %s AND available_at > now() + '25s'"
    assert pg.execute(later, [plain]).fetchone() == (1,)


async def test_the_store_records_each_outcome_as_the_whole_outcome_would(
    pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection], held: Held
) -> None:
    store = JobStore(pool, "w1", lease_seconds=30)
    finished = await store.finish([(i, g, Outcome.succeeded()) for i, g in held.values()])
    assert finished.applied == {i: "SUCCEEDED" for i, _ in held.values()}
    assert (finished.locked, finished.stale) == (set(), set())
    for job_id, _ in held.values():
        assert [a["outcome"] for a in attempts(pg, job_id)] == ["SUCCEEDED"]
    # the whole outcome released the key and the resource as it always does
    assert pg.execute("SELECT count(*) FROM key_usage").fetchone() == (0,)
    assert pg.execute("SELECT count(*) FROM resource_holds").fetchone() == (0,)


async def test_a_retry_after_the_whole_outcome_failed_finds_the_plain_ones_recorded(
    pg: psycopg.Connection, db_url: DatabaseUrl, held: Held
) -> None:
    # The plain outcome commits first: when the whole one then fails (here, waiting
    # past lock_timeout for the key's row, which another transaction holds), the
    # consumer tries the batch again; the plain outcomes are then found recorded,
    # neither applied twice nor reported stale.
    batch = [(i, g, Outcome.succeeded()) for i, g in held.values()]
    pool = make_pool(db_url, "test-finish-plain", 2, options="-c lock_timeout=200")
    await pool.open(wait=True)
    try:
        store = JobStore(pool, "w1", lease_seconds=30)
        with psycopg.connect(db_url.conninfo) as holder:
            holder.execute("SELECT * FROM key_usage FOR UPDATE")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                await store.finish(batch)
            holder.rollback()
        assert job(pg, held["plain"][0])["state"] == "SUCCEEDED"
        assert job(pg, held["keyed"][0])["state"] == "RUNNING"
        again = await store.finish(batch)
    finally:
        await pool.close()
    keyed, resource = held["keyed"][0], held["resource"][0]
    assert again.applied == {keyed: "SUCCEEDED", resource: "SUCCEEDED"}
    assert (again.locked, again.stale) == (set(), set())
    assert [a["outcome"] for a in attempts(pg, held["plain"][0])] == ["SUCCEEDED"]


async def test_a_lease_that_moves_on_between_the_two_outcomes_is_reported_stale(
    pg: psycopg.Connection,
    pool: AsyncConnectionPool[AsyncConnection],
    held: Held,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Between the plain outcome (which leaves the keyed lease 'full') and the whole
    # one, the sweeper moves the keyed job on (here, its generation): the whole
    # outcome then matches nothing, and the store says stale, never 'full'.
    keyed, _ = held["keyed"]
    original = store_module.finish_on

    async def interleaved(
        conn: AsyncConnection, worker: str, batch: Sequence[Any], statement: LiteralString
    ) -> dict[uuid.UUID, str]:
        if statement == q.JOB_FINISH_MANY:
            pg.execute(
                "UPDATE jobs SET lease_generation = lease_generation + 1 WHERE job_id = %s",
                [keyed],
            )
        return await original(conn, worker, batch, statement)

    monkeypatch.setattr(store_module, "finish_on", interleaved)
    store = JobStore(pool, "w1", lease_seconds=30)
    finished = await store.finish([(i, g, Outcome.succeeded()) for i, g in held.values()])
    assert finished.stale == {keyed}
    assert set(finished.applied) == {i for name, (i, _) in held.items() if name != "keyed"}
    assert finished.locked == set()
