"""Retention never changes what a waiting job waits for: a FAILED head of a strict
key holds the key's later jobs until it is replayed, and a job a waiting child
depends on is that child's only way to run, so retention keeps both, however old.
Everything else finished long enough ago still goes. Real PostgreSQL, the real
retention statement (relay.retention) and the real claim and outcome statements
(consumers.testing), no relay or RabbitMQ."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.consumers.testing import JobRunner
from hybrid_jobs.jobctl.check import check
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.relay.retention import delete_finished
from tests.support.jobs import enqueue, job

pytestmark = pytest.mark.timeout(60)


def _registry() -> Registry:
    registry = Registry()

    # Fails its first attempt for good (Permanent: FAILED at once), succeeds when
    # replayed.
    @registry.handler("first_fails", max_attempts=1)
    async def first_fails(j: consumers.Job) -> None:
        if j.attempt == 1:
            raise consumers.Permanent("not this time", code="FIRST")

    @registry.handler("fails", max_attempts=1)
    async def fails(j: consumers.Job) -> None:
        raise consumers.Permanent("never", code="NEVER")

    @registry.handler("ok")
    async def ok(j: consumers.Job) -> None:
        return None

    return registry


def age(pg: psycopg.Connection, *ids: uuid.UUID) -> None:
    """Finished an hour ago: past a 60-second horizon."""
    pg.execute(
        "UPDATE jobs SET finished_at = now() - interval '1 hour' WHERE job_id = ANY(%s)",
        [list(ids)],
    )


def present(pg: psycopg.Connection, *ids: uuid.UUID) -> set[uuid.UUID]:
    rows = pg.execute("SELECT job_id FROM jobs WHERE job_id = ANY(%s)", [list(ids)]).fetchall()
    return {r[0] for r in rows}


def replay(engine: Engine, job_id: uuid.UUID) -> str | None:
    with Session(engine) as session, session.begin():
        return outbox.retry_job(session, job_id)


def waiting(pg: psycopg.Connection, job_id: uuid.UUID) -> tuple[Any, ...]:
    row = job(pg, job_id)
    return row["state"], row["delay_reason"], row["parents_pending"]


async def test_retention_keeps_a_failed_strict_head_and_its_key_stays_held(
    engine: Engine, db_url: DatabaseUrl, pg: psycopg.Connection, pool: Any
) -> None:
    head = enqueue(engine, "first_fails", key="k", ordered="strict")
    behind = enqueue(engine, "ok", key="k", ordered="strict")
    async with JobRunner(db_url, _registry()) as runner:
        ran = await runner.run_until_idle()
        assert [(r.job_id, r.state) for r in ran] == [(head, "FAILED")]
        assert waiting(pg, behind) == ("QUEUED", "KEY_ORDER", 0)

        age(pg, head)
        deleted = await delete_finished(pool, keep_seconds=60, batch=100)
        assert await runner.run_until_idle() == [], "the key is still held behind the head"
        assert waiting(pg, behind) == ("QUEUED", "KEY_ORDER", 0)
        assert present(pg, head) == {head}, "the FAILED strict head stays until replayed"
        assert deleted == 0

        assert replay(engine, head) == "QUEUED"
        ran = await runner.run_until_idle()
    assert [(r.job_id, r.state) for r in ran] == [(head, "SUCCEEDED"), (behind, "SUCCEEDED")]


async def test_retention_keeps_a_parent_a_replayed_child_waits_for(
    engine: Engine, db_url: DatabaseUrl, pg: psycopg.Connection, pool: Any
) -> None:
    with Session(engine) as session, session.begin():
        parent = outbox.enqueue(session, "first_fails", {})
        child = outbox.enqueue(session, "ok", {}, after=[parent])
    async with JobRunner(db_url, _registry()) as runner:
        ran = await runner.run_until_idle()
        assert [(r.job_id, r.state) for r in ran] == [(parent, "FAILED")]
        assert (job(pg, child)["state"], job(pg, child)["last_error_code"]) == (
            "CANCELLED",
            "PARENT_FAILED",
        )
        # Replayed first, the child waits for its parent again.
        assert replay(engine, child) == "QUEUED"
        assert waiting(pg, child) == ("QUEUED", "DEPENDENCY", 1)

        age(pg, parent)
        deleted = await delete_finished(pool, keep_seconds=60, batch=100)
        assert check(db_url.conninfo)["dependency_counts_off"] == 0, "the child's edge is gone"
        assert present(pg, parent) == {parent}, "the parent a waiting child needs stays"
        assert waiting(pg, child) == ("QUEUED", "DEPENDENCY", 1)
        assert deleted == 0

        assert replay(engine, parent) == "QUEUED"
        ran = await runner.run_until_idle()
    assert [(r.job_id, r.state) for r in ran] == [(parent, "SUCCEEDED"), (child, "SUCCEEDED")]
    assert check(db_url.conninfo)["dependency_counts_off"] == 0


async def test_retention_still_deletes_old_failures_and_parents_nobody_waits_for(
    engine: Engine, db_url: DatabaseUrl, pg: psycopg.Connection, pool: Any
) -> None:
    plain_failed = enqueue(engine, "fails")
    # an ordered (not strict) key moves on past a failure: nothing waits for it
    loose_failed = enqueue(engine, "fails", key="loose", ordered=True)
    loose_next = enqueue(engine, "ok", key="loose", ordered=True)
    # a strict head that succeeded, or was cancelled, holds nothing either
    strict_ok = enqueue(engine, "ok", key="s", ordered="strict")
    with Session(engine) as session, session.begin():
        ok_parent = outbox.enqueue(session, "ok", {})
        ok_child = outbox.enqueue(session, "ok", {}, after=[ok_parent])
        failed_parent = outbox.enqueue(session, "fails", {})
        cancelled_child = outbox.enqueue(session, "ok", {}, after=[failed_parent])
    async with JobRunner(db_url, _registry()) as runner:
        await runner.run_until_idle()
    strict_cancelled = enqueue(engine, "ok", key="s", ordered="strict")
    with Session(engine) as session, session.begin():
        assert outbox.request_cancel(session, strict_cancelled) == "CANCELLED"
    states = {i: job(pg, i)["state"] for i in (ok_child, cancelled_child, loose_next)}
    assert states == {ok_child: "SUCCEEDED", cancelled_child: "CANCELLED", loose_next: "SUCCEEDED"}

    # The parents go, though their (younger) children stay: those are finished.
    old = [
        plain_failed,
        loose_failed,
        strict_ok,
        strict_cancelled,
        ok_parent,
        failed_parent,
    ]
    age(pg, *old)
    assert await delete_finished(pool, keep_seconds=60, batch=100) == len(old)
    assert present(pg, *old) == set()
    assert present(pg, ok_child, cancelled_child, loose_next) == {
        ok_child,
        cancelled_child,
        loose_next,
    }
