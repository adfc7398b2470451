"""Every fenced write looks its handles up by id, whatever the statistics say.

jobs_leased_idx keeps an entry for every lease taken since the last vacuum, the dead
ones of finished leases included, and the planner does not know it: with the table
analyzed while nothing ran (as autovacuum would, at a quiet moment), or never (a new
database), it chose to read all of it for an outcome's fence rather than look the
batch's jobs up by their ids; and with that index out of its reach, on a table
never analyzed, it scanned the whole table. In a drain of 60,000 jobs an outcome of 50
then took 18 ms instead of 1.3, and the outcome was half of PostgreSQL's time.
Checked here in the generic plan the consumer's prepared statements settle on, and
in the custom plan of their first executions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from hybrid_jobs.schema import queries as q
from tests.conftest import _database, _url_for
from tests.support.plans import plan as explain_plan

JOBS = 20_000
FINISHED = 15_000
BATCH = 30
WORKER = "test-fence-plan"


@pytest.fixture(scope="module", params=["analyzed_idle", "never_analyzed"])
def _fenced(template_db: str, request: pytest.FixtureRequest) -> Iterator[tuple[str, list[str]]]:
    """A database of this module's own (its tests only read it: each plan is taken
    in a transaction rolled back) with JOBS jobs, analyzed while none ran (or never,
    as on a new database); then FINISHED of them claimed and finished (leaving their
    dead entries in jobs_leased_idx), and the next ones running."""
    with _database("hj_fence", template=template_db) as name:
        url = _url_for(name).conninfo
        with psycopg.connect(url, autocommit=True) as pg:
            pg.execute(
                "INSERT INTO jobs (job_id, job_type) SELECT gen_random_uuid(), 'noop'"
                " FROM generate_series(1, %s)",
                [JOBS],
            )
            if request.param == "analyzed_idle":
                pg.execute("VACUUM ANALYZE jobs")
            ids = [str(r[0]) for r in pg.execute("SELECT job_id FROM jobs ORDER BY job_id")]
            claim = (
                "UPDATE jobs SET state = 'RUNNING', attempt_count = 1, lease_owner = %s,"
                " lease_expires_at = now() + interval '1 hour', lease_generation = 1,"
                " started_at = now() WHERE job_id = ANY(%s::uuid[])"
            )
            finish = (
                "UPDATE jobs SET state = 'SUCCEEDED', lease_owner = NULL,"
                " lease_expires_at = NULL, finished_at = now() WHERE job_id = ANY(%s::uuid[])"
            )
            for i in range(0, FINISHED + 4 * BATCH, 500):
                pg.execute(claim, [WORKER, ids[i : i + 500]])
                if i < FINISHED:
                    pg.execute(finish, [ids[i : i + 500]])
        yield url, ids[FINISHED : FINISHED + 4 * BATCH]


@pytest.fixture
def running(_fenced: tuple[str, list[str]]) -> Iterator[list[str]]:
    yield _fenced[1]


@pytest.fixture
def fenced_pg(_fenced: tuple[str, list[str]]) -> Iterator[psycopg.Connection]:
    with psycopg.connect(_fenced[0], autocommit=True) as pg:
        yield pg


def _handles(ids: list[str], **extra: Any) -> str:
    return json.dumps([{"job_id": i, "generation": 1, **extra} for i in ids])


def _params(statement: str, ids: list[str]) -> dict[str, Any]:
    if statement.startswith("JOB_FINISH"):
        return {"outcomes": _handles(ids, kind="succeeded"), "worker": WORKER}
    if statement == "JOB_HEARTBEAT_MANY":
        return {"jobs": _handles(ids), "worker": WORKER, "lease_seconds": 30}
    if statement == "JOB_GIVE_BACK_MANY":
        return {"jobs": _handles(ids), "worker": WORKER}
    assert statement == "JOB_PROGRESS"
    return {"job_id": ids[0], "generation": 1, "worker": WORKER, "progress": "{}"}


def _scans_of_jobs(plan: list[dict[str, Any]]) -> Iterator[tuple[str, str | None]]:
    def walk(node: dict[str, Any]) -> Iterator[tuple[str, str | None]]:
        if node.get("Relation Name") == "jobs" or node.get("Index Name", "").startswith("jobs_"):
            yield node["Node Type"], node.get("Index Name")
        for child in node.get("Plans", []):
            yield from walk(child)

    yield from walk(plan[0]["Plan"])


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize(
    "statement",
    [
        "JOB_FINISH_PLAIN_MANY",
        "JOB_FINISH_MANY",
        "JOB_FINISH_MANY_IN_TX",
        "JOB_HEARTBEAT_MANY",
        "JOB_GIVE_BACK_MANY",
        "JOB_PROGRESS",
    ],
)
def test_a_fenced_write_looks_its_jobs_up_by_id(
    fenced_pg: psycopg.Connection, running: list[str], statement: str, generic: bool
) -> None:
    params = _params(statement, running[:BATCH])
    found = explain_plan(fenced_pg, getattr(q, statement), params, generic=generic)
    scans = list(_scans_of_jobs(found))
    assert scans, "the statement reads jobs"
    # Never jobs_leased_idx, which holds 15,000 dead entries here (a bitmap scan of
    # it read every one), nor the whole table: the handles by their ids. (The whole
    # outcome also looks for the next job of a key or a resource, by their indexes.)
    for node, index in scans:
        assert index != "jobs_leased_idx" and node != "Seq Scan", (node, index, scans)
    assert ("Index Scan", "jobs_pkey") in scans, scans
    # and the fence let every handle of the batch through
    assert found[0]["Plan"]["Actual Rows"] == (1 if statement == "JOB_PROGRESS" else BATCH)


def _jobs_rows_read(node: dict[str, Any]) -> int:
    read = 0
    if node.get("Relation Name") == "jobs":
        read += node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
    return read + sum(_jobs_rows_read(child) for child in node.get("Plans", []))


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize(
    "statement", ["JOB_FINISH_PLAIN_MANY", "JOB_FINISH_MANY", "JOB_GIVE_BACK_MANY"]
)
def test_an_end_of_leases_that_all_applied_reads_no_handle_again_for_its_answer(
    fenced_pg: psycopg.Connection, running: list[str], statement: str, generic: bool
) -> None:
    # The answer's second part names the handles not applied (a row another
    # transaction held, or a lease holding a gate the statement leaves out). It
    # looked every handle's row up once more, after the statement had applied them
    # all: about a tenth of an outcome of 50.
    params = _params(statement, running[:BATCH])
    found = explain_plan(fenced_pg, getattr(q, statement), params, generic=generic)
    top = found[0]["Plan"]
    assert top["Node Type"] == "Append" and top["Actual Rows"] == BATCH, top["Node Type"]
    applied, not_applied = [p for p in top["Plans"] if p["Parent Relationship"] == "Member"]
    assert applied["Actual Rows"] == BATCH
    assert _jobs_rows_read(not_applied) == 0
