"""The invariant checker's dependency checks (issue 19): the chaos soak relies on
them to prove that no child starts before all its parents succeeded, so each must
read 0 on a graph that ran in order and fire on the breakage it names: a child
released early, a child of a failed parent left waiting, a parent counted twice.
Real PostgreSQL and the real claim and outcome statements (consumers.testing)."""

from __future__ import annotations

import uuid

import psycopg
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.consumers.testing import JobRunner
from hybrid_jobs.jobctl.check import check
from hybrid_jobs.plumbing.config import DatabaseUrl

DEPENDENCY_CHECKS = (
    "children_started_before_parents",
    "children_of_failed_parents_not_cancelled",
    "dependency_counts_off",
)


def _registry() -> Registry:
    # Its own registry: the default one is shared with the chaos app's handlers.
    registry = Registry()

    @registry.handler("step", max_attempts=1)
    async def step(job: consumers.Job) -> object:
        if (job.payload or {}).get("fail"):
            raise consumers.Permanent("asked to fail", code="ASKED")
        return {"ok": True}

    return registry


def _dependency_checks(db_url: DatabaseUrl) -> dict[str, int]:
    report = check(db_url.conninfo)
    return {name: report[name] for name in DEPENDENCY_CHECKS}


def _graph(engine: Engine, fail_b: bool = False) -> dict[str, uuid.UUID]:
    """A -> B, A -> C, B + C -> D, in one transaction."""
    with Session(engine) as session, session.begin():
        a = outbox.enqueue(session, "step", {})
        b = outbox.enqueue(session, "step", {"fail": fail_b}, after=[a])
        c = outbox.enqueue(session, "step", {}, after=[a])
        d = outbox.enqueue(session, "step", {}, after=[b, c])
    return {"A": a, "B": b, "C": c, "D": d}


async def test_a_graph_run_in_order_passes_every_dependency_check(
    engine: Engine, db_url: DatabaseUrl
) -> None:
    ok = _graph(engine)
    failing = _graph(engine, fail_b=True)
    async with JobRunner(db_url, _registry()) as runner:
        await runner.run_until_idle()
    assert {name: state(db_url, i)[0] for name, i in ok.items()} == dict.fromkeys(ok, "SUCCEEDED")
    assert {name: state(db_url, i) for name, i in failing.items()} == {
        "A": ("SUCCEEDED", None),
        "B": ("FAILED", "ASKED"),
        "C": ("SUCCEEDED", None),
        "D": ("CANCELLED", "PARENT_FAILED"),
    }
    assert _dependency_checks(db_url) == dict.fromkeys(DEPENDENCY_CHECKS, 0)


def state(db_url: DatabaseUrl, job_id: uuid.UUID) -> tuple[str, str | None]:
    with psycopg.connect(db_url.conninfo) as conn:
        row = conn.execute(
            "SELECT state, last_error_code FROM jobs WHERE job_id = %s", [job_id]
        ).fetchone()
    assert row is not None
    return row[0], row[1]


async def test_a_child_released_before_its_last_parent_succeeded_is_caught(
    engine: Engine, db_url: DatabaseUrl, pg: psycopg.Connection
) -> None:
    ids = _graph(engine)
    # What a trigger that settled the edges at the wrong moment would leave: D due
    # (its edges done, its count 0, its wake-up written) while A has not even run.
    pg.execute(
        "UPDATE job_dependencies SET done = true, counted = true WHERE child_id = %s", [ids["D"]]
    )
    pg.execute(
        "UPDATE jobs SET parents_pending = 0, run_after = now(), delay_reason = NULL"
        " WHERE job_id = %s",
        [ids["D"]],
    )
    async with JobRunner(db_url, _registry()) as runner:
        ran = await runner.run_until_idle()
    assert {r.job_id for r in ran} == set(ids.values())
    # D was claimed with A (or before B and C ended): started before its parents
    # succeeded, and only that check fires.
    assert _dependency_checks(db_url) == {
        "children_started_before_parents": 1,
        "children_of_failed_parents_not_cancelled": 0,
        "dependency_counts_off": 0,
    }


async def test_a_child_of_a_failed_parent_left_waiting_and_a_count_off_are_caught(
    engine: Engine, db_url: DatabaseUrl, pg: psycopg.Connection
) -> None:
    with Session(engine) as session, session.begin():
        b = outbox.enqueue(session, "step", {"fail": True})
        c = outbox.enqueue(session, "step", {})
        d = outbox.enqueue(session, "step", {}, after=[b, c])
        lone = outbox.enqueue(session, "step", {})
    # Without the trigger nothing settles the edges: B's failure leaves D waiting.
    pg.execute("ALTER TABLE jobs DISABLE TRIGGER jobs_release_dependants")
    try:
        async with JobRunner(db_url, _registry()) as runner:
            await runner.run_until_idle()
    finally:
        pg.execute("ALTER TABLE jobs ENABLE TRIGGER jobs_release_dependants")
    assert [state(db_url, i) for i in (b, c, d)] == [
        ("FAILED", "ASKED"),
        ("SUCCEEDED", None),
        ("QUEUED", None),
    ]
    assert _dependency_checks(db_url) == {
        "children_started_before_parents": 0,
        "children_of_failed_parents_not_cancelled": 1,
        # D's two open edges still match its count of 2
        "dependency_counts_off": 0,
    }
    # A parent counted twice (or an edge never settled) leaves count and edges apart.
    pg.execute("UPDATE jobs SET parents_pending = 1 WHERE job_id = %s", [lone])
    pg.execute("UPDATE jobs SET parents_pending = 1 WHERE job_id = %s", [d])
    assert _dependency_checks(db_url)["dependency_counts_off"] == 2
