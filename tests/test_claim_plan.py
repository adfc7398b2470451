"""The claim reads what its batch costs, not what the backlog costs: with thousands
of jobs waiting and wake-ups in flight, JOB_CLAIM_MANY never scans jobs or outbox,
nor does the shorter claim of plain jobs (JOB_CLAIM_PLAIN_MANY), in the custom plan
of a first execution and in the generic plan the consumer's prepared statement
settles on (psycopg prepares it on its fifth run; PostgreSQL then
keeps a plan made without the values). A generic plan had planned the deletion of
used-up wake-ups as a scan of the whole outbox, paid by every claim."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from harness.claim import claim_params
from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.plumbing.db import CONTROL_OPTIONS, DAEMON_OPTIONS, make_pool, native
from hybrid_jobs.schema import queries as q
from tests.support.plans import plan as explain_plan

BACKLOG = 5_000
IN_FLIGHT = 2_000
BATCH = 50


def scans(plan: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    """Each scan of jobs or outbox: its relation, node type, and the rows it produced
    or filtered away, all its loops together."""

    def walk(node: dict[str, Any]) -> Iterator[tuple[str, str, int]]:
        if node.get("Relation Name") in ("jobs", "outbox") and "Scan" in node["Node Type"]:
            read = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            yield node["Relation Name"], node["Node Type"], read * node["Actual Loops"]
        for child in node.get("Plans", []):
            yield from walk(child)

    return list(walk(plan[0]["Plan"]))


@pytest.fixture
def backlog(engine: Engine, pg: psycopg.Connection) -> list[Any]:
    with Session(engine) as session, session.begin():
        ids = outbox.enqueue_many(
            session, [outbox.NewJob("noop", {"i": i}) for i in range(BACKLOG)]
        )
    # Statistics taken right after a burst of enqueues, before the relay sent any
    # wake-up (autovacuum analyzes a table after many inserts): a plan made from
    # them thinks in-flight wake-ups are nearly none. Then the relay sends some.
    pg.commit()
    pg.autocommit = True
    pg.execute("VACUUM ANALYZE jobs")
    pg.execute("VACUUM ANALYZE outbox")
    pg.execute("UPDATE outbox SET sent_at = now() WHERE job_id = ANY(%s)", [ids[-IN_FLIGHT:]])
    return ids


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("batch", [1, BATCH])
@pytest.mark.parametrize("statement", ["JOB_CLAIM_MANY", "JOB_CLAIM_PLAIN_MANY"])
def test_the_claim_reads_its_batch_not_the_backlog(
    pg: psycopg.Connection, backlog: list[Any], generic: bool, batch: int, statement: str
) -> None:
    chosen = backlog[:batch] if batch == 1 else backlog[-batch:]
    for _ in range(3):  # the generic plan as a settled prepared statement runs it
        found = explain_plan(
            pg, getattr(q, statement), claim_params(chosen, "test-claim-plan"), generic=generic
        )
    read = scans(found)
    assert read, "the claim reads jobs"
    for relation, node, rows in read:
        assert node != "Seq Scan", (relation, read)
        # each id is looked up a few times (locked, claimed, the reply), never the backlog
        assert rows <= 4 * batch, (relation, node, rows, read)
    # one branch of the answer returns the claimed jobs (the other asks only whether
    # an id is among them)
    claimed = sum(1 for r in _branches(found[0]["Plan"]) if _reads_claimed(r))
    assert claimed == 1
    # a batch without a resource never reads the holds (its insert of none runs)
    assert scanned(found, "resource_holds") == 0, found


def _branches(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The node's children that run as part of it (not its sub-plans)."""
    return [c for c in node.get("Plans", []) if c.get("Parent Relationship") not in _SUBPLANS]


_SUBPLANS = ("SubPlan", "InitPlan")


def _reads_claimed(node: dict[str, Any]) -> bool:
    return node.get("CTE Name") == "claimed" or any(_reads_claimed(c) for c in _branches(node))


def scanned(plan: list[dict[str, Any]], relation: str) -> int:
    """The loops of every scan of ``relation`` in the plan that ran."""

    def walk(node: dict[str, Any]) -> Iterator[int]:
        if node.get("Relation Name") == relation and "Scan" in node["Node Type"]:
            yield node.get("Actual Loops", 0)
        for child in node.get("Plans", []):
            yield from walk(child)

    return sum(walk(plan[0]["Plan"]))


# The plans a prepared claim gets in twelve runs: on a connection with PostgreSQL's
# default plan cache, five custom plans and then the generic one, if PostgreSQL
# finds it no costlier (a warning that the statement's generic plan looks dear); on
# one with the consumer's own options, the generic plan from the first run.
PLANS_IN_TWELVE = {"default": (12 - 5, 5), "consumer": (12, 0)}


@pytest.mark.parametrize("options", list(PLANS_IN_TWELVE))
@pytest.mark.parametrize("statement", ["JOB_CLAIM_MANY", "JOB_CLAIM_PLAIN_MANY"])
async def test_the_consumers_prepared_claim_settles_on_its_generic_plan(
    db_url: DatabaseUrl, backlog: list[Any], statement: str, options: str
) -> None:
    """PostgreSQL plans a prepared statement afresh (a custom plan) as long as the
    plans made with the values look cheaper than the one made without. The plain
    claim's did, by its estimate of ten ids per batch against the one it was given,
    once a backlog was analyzed: it was planned at every claim, 0.9 ms of the 1.7
    a claim of one job took (bench.claim_cost). And even a statement that settles
    was planned for its values five times first, 4 to 5 ms each for a claim, on
    every new connection: the consumer's own pool plans each statement once,
    generically (plumbing.db.DAEMON_OPTIONS). Claimed here as a consumer claims, one
    job at a time, on a connection of a pool."""
    given = {"default": CONTROL_OPTIONS, "consumer": DAEMON_OPTIONS}[options]
    pool = make_pool(db_url, "test-claim-plan", max_size=1, options=given)
    await pool.open(wait=True)
    try:
        async with pool.connection() as conn:
            for job_id in backlog[:12]:
                cur = await native(getattr(q, statement)).execute(
                    conn, claim_params([job_id], "test-claim-plan")
                )
                assert [row[0] for row in await cur.fetchall()] == ["claimed"]
            cur = await conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement = %s",
                [native(getattr(q, statement)).sql.decode()],
            )
            generic, custom = await cur.fetchone() or (0, 0)
    finally:
        await pool.close()
    # prepared at its first run (Native)
    assert (generic, custom) == PLANS_IN_TWELVE[options]


def _jobs_indexes(node: dict[str, Any]) -> Iterator[str]:
    """The index of every scan of jobs that ran (a bitmap heap scan's are its
    children's)."""
    if node.get("Actual Loops", 0) and node.get("Index Name", "").startswith("jobs_"):
        yield node["Index Name"]
    for child in node.get("Plans", []):
        yield from _jobs_indexes(child)


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("statement", ["JOB_CLAIM_MANY", "JOB_CLAIM_PLAIN_MANY"])
def test_a_claim_on_a_table_never_analyzed_looks_its_jobs_up_by_id(
    engine: Engine, pg: psycopg.Connection, generic: bool, statement: str
) -> None:
    """A new database, or a table autovacuum has not reached: no statistics. The
    claim of 25 named jobs was planned as a bitmap AND of jobs_claimable_idx, read
    whole (every waiting job), with their primary keys: a claim that grew with the
    backlog (0.29 ms of a 1.0 ms claim with 20,000 waiting)."""
    with Session(engine) as session, session.begin():
        ids = outbox.enqueue_many(
            session, [outbox.NewJob("noop", {"i": i}) for i in range(BACKLOG)]
        )
    found = explain_plan(
        pg, getattr(q, statement), claim_params(ids[:25], "test-claim-plan"), generic=generic
    )
    used = set(_jobs_indexes(found[0]["Plan"]))
    assert "jobs_claimable_idx" not in used, used
    assert "jobs_pkey" in used, used
    assert all(node != "Seq Scan" for _, node, _ in scans(found)), scans(found)
