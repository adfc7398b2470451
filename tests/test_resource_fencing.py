"""Resolving an uncertain resource is fenced by its holder: an answer (a reconcile
hook's, or an operator's who named the holder they saw) is about one hold, the job
and lease generation whose expired lease left it so, and frees that hold only,
never a later holder's. And a hold whose holder job retention deleted is still
offered to a reconcile hook, and stays listed for operators.

The holds are made uncertain by the claim's and the sweeper's own statements (a
lease of 0.2 s runs out), and resolved by the real statements."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.consumers.reconcile import reconcile
from hybrid_jobs.consumers.store import JobStore
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.plumbing.db import make_pool
from hybrid_jobs.schema.queries import JOB_RETENTION_DELETE, JOB_SWEEP_EXPIRED
from tests.support.jobs import enqueue
from tests.support.processes import jobctl

pytestmark = pytest.mark.timeout(120)

RESOURCE = "deploy:prod"


def holds(pg: psycopg.Connection) -> list[tuple[Any, ...]]:
    return pg.execute(
        "SELECT resource, job_id, uncertain_since IS NOT NULL FROM resource_holds ORDER BY 1"
    ).fetchall()


def resolutions(pg: psycopg.Connection) -> list[tuple[Any, ...]]:
    return pg.execute(
        "SELECT resource, job_id, resolved_by, outcome FROM resource_resolutions ORDER BY id"
    ).fetchall()


def generation(pg: psycopg.Connection, resource: str = RESOURCE) -> int:
    (gen,) = pg.execute(  # type: ignore[misc]
        "SELECT lease_generation FROM resource_holds WHERE resource = %s", [resource]
    ).fetchone()
    return int(gen)


async def expire_holding(
    store: JobStore, registry: Registry, pg: psycopg.Connection, job_id: uuid.UUID
) -> str:
    """Claim the job (taking its resource), let its lease run out and sweep it: its
    hold stays, uncertain. Returns the state the sweep moved the job to."""
    claimed = await store.claim(
        [job_id], registry.claim_terms(), queues=registry.queues(), free_threads=0, worker_ttl=60
    )
    assert [c.job_id for c in claimed.claimed] == [job_id], claimed.missed
    await asyncio.sleep(0.3)
    swept = pg.execute(JOB_SWEEP_EXPIRED, {"limit": 10, "default_backoff": 0}).fetchall()
    assert [r[0] for r in swept] == [job_id]
    assert holds(pg) == [(RESOURCE, job_id, True)]
    return str(swept[0][1])


async def turned_down(store: JobStore, registry: Registry, job_id: uuid.UUID) -> None:
    refused = await store.claim(
        [job_id], registry.claim_terms(), queues=registry.queues(), free_threads=0, worker_ttl=60
    )
    assert refused.missed == {job_id: "RESOURCE_UNCERTAIN"}


@pytest.mark.parametrize("later_holder", ["another job", "the same job's retry"])
async def test_a_late_hook_answer_about_an_earlier_holder_leaves_a_later_holders_hold_uncertain(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    caplog: pytest.LogCaptureFixture,
    later_holder: str,
) -> None:
    """The hook is asked about job A's uncertain hold. While it looks, an operator
    resolves that hold, and a later lease takes the resource and expires too: job
    B's, or A's own retry (the same job, the next generation). A's answer, arriving
    late, is about the hold A's first lease left, which is gone: it frees nothing
    (the later hold stays uncertain, only the operator's resolution is recorded) and
    says so."""
    registry = Registry()
    asked: list[consumers.Uncertain] = []
    later_generation: list[int] = []
    pool = make_pool(db_url, "test-resource-fencing", 2)
    store = JobStore(pool, "a-worker", lease_seconds=0.2)

    async def look(hold: consumers.Uncertain) -> str:
        asked.append(hold)
        # meanwhile, elsewhere: A's hold is resolved by hand, and B's lease expires
        with Session(engine) as session, session.begin():
            outbox.resolve_resource(session, RESOURCE, by="alice", outcome="A rolled back")
        await expire_holding(store, registry, pg, later)
        later_generation.append(generation(pg))
        return "A's deploy never started"

    # a retry due at once, for the same job's next lease to take the resource
    @registry.handler("deploy", reconcile=look, backoff=consumers.Backoff(base=0, cap=0))
    async def deploy(j: consumers.Job) -> None:
        return None

    earlier = enqueue(engine, "deploy", {"n": 1}, resource=RESOURCE)
    waiting = enqueue(engine, "deploy", {"n": 2}, resource=RESOURCE)
    later = waiting if later_holder == "another job" else earlier
    await pool.open()
    try:
        await expire_holding(store, registry, pg, earlier)
        earlier_generation = generation(pg)
        await turned_down(store, registry, waiting)
        with caplog.at_level(logging.INFO, logger="consumer"):
            resolved = await reconcile(store, registry, [waiting])
    finally:
        await pool.close()
    # the later hold is the later lease's: A's late answer did not free it
    assert holds(pg) == [(RESOURCE, later, True)]
    assert later_generation == [earlier_generation if later != earlier else earlier_generation + 1]
    assert resolutions(pg) == [(RESOURCE, earlier, "alice", "A rolled back")]
    assert resolved == 0
    assert [(h.resource, h.job_id) for h in asked] == [(RESOURCE, earlier)]
    assert asked[0].lease_generation == earlier_generation
    stale = [r for r in caplog.records if r.getMessage() == "consumer.reconcile_stale"]
    assert len(stale) == 1, [r.getMessage() for r in caplog.records]
    assert stale[0].job_id == str(earlier)  # type: ignore[attr-defined]


async def test_a_hook_is_asked_about_a_hold_whose_holder_retention_deleted(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """The holder's only attempt expires (FAILED, its hold uncertain) and retention
    deletes the job. The hold stays listed for operators, and a job turned down for
    it has the hook of its own type asked, with what is known (the job id, its
    generation, since when; no type or payload): its answer resolves the hold."""
    registry = Registry()
    asked: list[consumers.Uncertain] = []

    def look(hold: consumers.Uncertain) -> str:
        asked.append(hold)
        return "found build 7 deployed"

    @registry.handler("deploy", reconcile=look)
    async def deploy(j: consumers.Job) -> None:
        return None

    gone = enqueue(engine, "deploy", {"sha": "7"}, resource=RESOURCE, max_attempts=1)
    waiting = enqueue(engine, "deploy", {"sha": "8"}, resource=RESOURCE)
    pool = make_pool(db_url, "test-resource-fencing", 2)
    await pool.open()
    try:
        store = JobStore(pool, "a-worker", lease_seconds=0.2)
        assert await expire_holding(store, registry, pg, gone) == "FAILED"
        gone_generation = generation(pg)
        assert pg.execute(JOB_RETENTION_DELETE, {"keep_seconds": 0, "limit": 10}).fetchone() == (1,)
        assert pg.execute("SELECT job_id FROM jobs").fetchall() == [(waiting,)]
        # what operators see: the hold, its job gone
        with Session(engine) as session:
            (listed,) = outbox.resource_holds(session)
        assert (listed.resource, listed.job_id, listed.uncertain) == (RESOURCE, gone, True)
        assert (listed.state, listed.job_type, listed.waiting) == (None, None, 1)
        await turned_down(store, registry, waiting)
        pg.execute("DELETE FROM outbox WHERE job_id = %s", [waiting])
        resolved = await reconcile(store, registry, [waiting])
    finally:
        await pool.close()
    assert resolved == 1
    assert holds(pg) == []
    (hold,) = asked
    assert (hold.resource, hold.job_id, hold.job_type, hold.payload) == (RESOURCE, gone, None, None)
    assert hold.lease_generation == gone_generation
    assert hold.job_gone
    assert resolutions(pg) == [(RESOURCE, gone, "reconcile (a-worker)", "found build 7 deployed")]
    # and the job waiting for it woken
    assert pg.execute(
        "SELECT count(*) FROM outbox WHERE job_id = %s AND sent_at IS NULL", [waiting]
    ).fetchone() == (1,)


async def test_a_hold_whose_holder_is_gone_with_no_hook_to_ask_stays_for_operators(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    """With the holder deleted its type is unknown; the job turned down for the
    resource is of a type with no hook: nobody is asked, nothing is resolved, and
    `jobctl resources list` shows the hold, its job gone."""
    registry = Registry()

    @registry.handler("deploy")
    async def deploy(j: consumers.Job) -> None:
        return None

    gone = enqueue(engine, "deploy", {}, resource=RESOURCE, max_attempts=1)
    waiting = enqueue(engine, "deploy", {}, resource=RESOURCE)
    pool = make_pool(db_url, "test-resource-fencing", 2)
    await pool.open()
    try:
        store = JobStore(pool, "a-worker", lease_seconds=0.2)
        await expire_holding(store, registry, pg, gone)
        pg.execute(JOB_RETENTION_DELETE, {"keep_seconds": 0, "limit": 10})
        await turned_down(store, registry, waiting)
        assert await reconcile(store, registry, [waiting]) == 0
    finally:
        await pool.close()
    assert holds(pg) == [(RESOURCE, gone, True)]
    listed = jobctl("resources", "list", url=db_url, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "UNCERTAIN since" in listed.stdout and str(gone) in listed.stdout
    assert "deleted" in listed.stdout, listed.stdout


async def test_an_operator_naming_the_holder_they_saw_frees_only_that_hold(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    """An operator lists the resource (job A uncertain) and looks at the target;
    meanwhile A's hold is resolved and B's lease expires holding it. Their resolve,
    naming A, changes nothing and says whose hold it is now (so does jobctl's
    --job); naming B, it frees B's. Without a holder it frees whichever is uncertain
    now, as before, and says which."""
    registry = Registry()

    @registry.handler("deploy")
    async def deploy(j: consumers.Job) -> None:
        return None

    first = enqueue(engine, "deploy", {}, resource=RESOURCE)
    second = enqueue(engine, "deploy", {}, resource=RESOURCE)
    pool = make_pool(db_url, "test-resource-fencing", 2)
    await pool.open()
    try:
        store = JobStore(pool, "a-worker", lease_seconds=0.2)
        await expire_holding(store, registry, pg, first)
        with Session(engine) as session:
            (seen,) = outbox.resource_holds(session)
        assert (seen.job_id, seen.lease_generation) == (first, generation(pg))
        with Session(engine) as session, session.begin():
            outbox.resolve_resource(session, RESOURCE, by="bob")
        await expire_holding(store, registry, pg, second)
    finally:
        await pool.close()
    with (
        Session(engine) as session,
        session.begin(),
        pytest.raises(outbox.HeldByAnother, match=f"held by job {second}") as refused,
    ):
        outbox.resolve_resource(
            session,
            RESOURCE,
            by="alice",
            job_id=seen.job_id,
            lease_generation=seen.lease_generation,
        )
    assert isinstance(refused.value, outbox.NotUncertain)
    assert refused.value.job_id == second
    cli = jobctl("resources", "resolve", RESOURCE, "--job", str(first), url=db_url, cwd=tmp_path)
    assert cli.returncode == 1
    assert f"held by job {second}" in cli.stderr, cli.stderr
    assert holds(pg) == [(RESOURCE, second, True)]
    with Session(engine) as session, session.begin():
        done = outbox.resolve_resource(session, RESOURCE, by="alice", job_id=second)
    assert (done.job_id, done.lease_generation) == (second, 1)
    assert holds(pg) == []
    assert [(r[1], r[2]) for r in resolutions(pg)] == [(first, "bob"), (second, "alice")]


def test_naming_a_generation_without_its_job_is_refused(engine: Engine) -> None:
    with (
        Session(engine) as session,
        pytest.raises(ValueError, match="lease_generation names"),
    ):
        outbox.resolve_resource(session, RESOURCE, lease_generation=3)
