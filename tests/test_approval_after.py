"""needs_approval with after= (issue 19): refused at enqueue, everywhere, with an
error that says what to do instead; and what it says to do works: an approval job
of its own that the flow runs after, approved (the flow runs) or rejected (the flow
is cancelled, PARENT_FAILED, and never runs). Real PostgreSQL; the jobs are run by
the real claim and outcome statements (consumers.testing)."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.consumers.testing import JobRunner
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import DatabaseUrl
from tests.support.api import api_client
from tests.support.jobs import enqueue, job


def _registry() -> Registry:
    registry = Registry()

    @registry.handler("step")
    async def step(j: consumers.Job) -> object:
        return {"ran": True}

    return registry


def _count(pg: psycopg.Connection) -> int:
    row = pg.execute("SELECT count(*) FROM jobs").fetchone()
    assert row is not None
    return int(row[0])


async def test_needs_approval_with_after_is_refused_before_anything_is_written(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    parent = enqueue(engine, "step", {})
    for attempt in (
        lambda s: outbox.enqueue(s, "step", {}, needs_approval=True, after=[parent]),
        lambda s: outbox.enqueue_many(s, [NewJob("step", {}, needs_approval=True, after=[parent])]),
    ):
        with (
            pytest.raises(ValueError, match="needs_approval takes no after") as refused,
            Session(engine) as session,
            session.begin(),
        ):
            attempt(session)
        assert "name it in after=" in str(refused.value), "it says what to do instead"
    async with api_client(db_url) as client:
        posted = await client.post(
            "/v1/jobs",
            json={"job_type": "step", "needs_approval": True, "after": [str(parent)]},
        )
    assert posted.status_code == 422, posted.text
    assert "needs_approval takes no after" in posted.text
    assert _count(pg) == 1, "only the parent"
    assert job(pg, parent)["has_dependants"] is False


async def test_an_approval_job_gates_a_flow_approved_or_rejected(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    flows = {}
    for name in ("approved", "rejected"):
        with Session(engine) as session, session.begin():
            gate = outbox.enqueue(session, "step", {"gate": name}, needs_approval=True)
            work = outbox.enqueue(session, "step", {"work": name}, after=[gate])
            then = outbox.enqueue(session, "step", {"then": name}, after=[work])
        flows[name] = (gate, work, then)
    with Session(engine) as session:
        gate, work, _ = flows["approved"]
        assert outbox.explain(session, gate).codes == ["APPROVAL_REQUIRED"]
        why = outbox.explain(session, work)
        assert why.codes == ["DEPENDENCY"]
        facts = why.blocker("DEPENDENCY")
        assert facts is not None
        assert [str(p["job_id"]) for p in facts.facts["waiting_for"]] == [str(gate)]
    async with JobRunner(db_url, _registry()) as runner:
        assert await runner.run_until_idle() == [], "nothing runs before a decision"
        with Session(engine) as session, session.begin():
            outbox.approve(session, flows["approved"][0], by="alice")
            outbox.reject(session, flows["rejected"][0], by="bob", reason="not today")
        ran = await runner.run_until_idle()
    assert [r.job_id for r in ran] == list(flows["approved"]), "gate, then work, then the tail"
    assert all(r.state == "SUCCEEDED" for r in ran)
    gate, work, then = flows["rejected"]
    assert (job(pg, gate)["state"], job(pg, gate)["last_error_code"]) == ("CANCELLED", "REJECTED")
    for child in (work, then):
        row = job(pg, child)
        assert (row["state"], row["last_error_code"], row["attempt_count"]) == (
            "CANCELLED",
            "PARENT_FAILED",
            0,
        )
