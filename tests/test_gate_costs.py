"""A gate's cost is its batch's, not its table's: at production shape (50,000
dedicated tenants, 100,000 jobs waiting for one resource) the claim and the end of a
lease read a bounded stretch of index, in the custom plan of a first execution and in
the generic plan a pooled connection settles on."""

from __future__ import annotations

import json

import psycopg
import pytest
from sqlalchemy import Engine

from harness.claim import claim_params
from hybrid_jobs.schema import queries as q
from tests.support.jobs import enqueue, job
from tests.support.plans import plan as explain_plan
from tests.support.plans import reads as scans

BATCH = 50


def _analyzed(pg: psycopg.Connection, *tables: str) -> None:
    pg.commit()
    pg.autocommit = True
    for table in tables:
        pg.execute(f"VACUUM ANALYZE {table}")
    pg.autocommit = False


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_the_claim_reads_one_dedicated_tenant_per_job_not_every_one(
    engine: Engine, pg: psycopg.Connection, generic: bool
) -> None:
    pg.execute(
        "INSERT INTO tenant_limits (tenant, runners)"
        " SELECT 'd' || i, 'dedicated' FROM generate_series(1, 50000) AS i"
    )
    ids = [enqueue(engine, "noop", key=f"k{i}", tenant=f"shared{i % 5}") for i in range(BATCH)]
    ids.append(enqueue(engine, "noop", key="kd", tenant="d7"))
    _analyzed(pg, "tenant_limits", "jobs")
    found = explain_plan(pg, q.JOB_CLAIM_MANY, claim_params(ids, "w1"), generic=generic)
    read = [(node, rows) for node, rows, _ in scans(found[0]["Plan"], "tenant_limits")]
    assert all(node != "Seq Scan" for node, _ in read), read
    assert sum(rows for _, rows in read) <= 3 * len(ids), read
    status = {row[1]: row[0] for row in pg.execute(q.JOB_CLAIM_MANY, claim_params(ids, "w1"))}
    assert status.pop(ids[-1]) == "NO_AUTHORIZED_RUNNER"
    assert set(status.values()) == {"claimed"}


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_a_freed_resource_finds_its_next_waiter_however_many_wait(
    engine: Engine, pg: psycopg.Connection, generic: bool
) -> None:
    holder = enqueue(engine, "noop", resource="deploy:prod")
    assert pg.execute(q.JOB_CLAIM_MANY, claim_params([holder], "w1")).fetchone()[0] == "claimed"
    pg.execute("DELETE FROM outbox")  # the holder's wake-up, used
    # 100,000 waiting for it: the oldest half turned down for it, the rest not tried
    pg.execute(
        "INSERT INTO jobs (job_id, job_type, resource, delay_reason, created_at)"
        " SELECT gen_random_uuid(), 'noop', 'deploy:prod',"
        "        CASE WHEN i <= 50000 THEN 'RESOURCE_BUSY' END, now()"
        " FROM generate_series(1, 100000) AS i"
    )
    _analyzed(pg, "jobs")
    generation = job(pg, holder)["lease_generation"]
    params = {
        "outcomes": json.dumps(
            [{"job_id": str(holder), "generation": generation, "kind": "succeeded"}]
        ),
        "worker": "w1",
    }
    found = explain_plan(pg, q.JOB_FINISH_MANY, params, generic=generic)
    read = [(node, rows) for node, rows, _ in scans(found[0]["Plan"], "jobs")]
    assert all(node != "Seq Scan" for node, _ in read), read
    assert sum(rows for _, rows in read) <= 20, read
    pg.execute(q.JOB_FINISH_MANY, params)
    (woken,) = pg.execute(
        "SELECT j.delay_reason FROM outbox AS o JOIN jobs AS j USING (job_id)"
        " WHERE o.sent_at IS NULL AND j.resource = 'deploy:prod'"
    ).fetchall()
    assert woken == ("RESOURCE_BUSY",)


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_a_claim_reads_its_jobs_rate_limits_not_every_limit(
    engine: Engine, pg: psycopg.Connection, generic: bool
) -> None:
    """20,000 limits, exact names and prefixes: each job of a claim looks up the few
    that can cover its name (its own, and its name up to each ':' with '*'), not
    every limit for every job (1,000,000 rows read for a claim of 50)."""
    pg.execute(
        "INSERT INTO rate_limits (name, rate, per_seconds, burst)"
        " SELECT CASE WHEN i % 2 = 0 THEN 'api' || i ELSE 'sms:c' || i || ':*' END,"
        "        1000, 1, 1000"
        " FROM generate_series(1, 20000) AS i"
    )
    pg.execute(
        "INSERT INTO rate_buckets (name, tokens, refilled_at)"
        " SELECT name, burst, now() FROM rate_limits WHERE right(name, 2) <> ':*'"
    )
    # half of them named exactly, half under a prefix two levels down
    ids = [
        enqueue(engine, "noop", rate_limit=f"api{2 * i}" if i % 2 else f"sms:c{2 * i + 1}:eu:x")
        for i in range(1, BATCH + 1)
    ]
    _analyzed(pg, "rate_limits", "rate_buckets", "jobs")
    found = explain_plan(pg, q.JOB_CLAIM_MANY, claim_params(ids, "w1"), generic=generic)
    read = [(node, rows) for node, rows, _ in scans(found[0]["Plan"], "rate_limits")]
    assert read, "the claim looks its jobs' limits up"
    assert all(node != "Seq Scan" for node, _ in read), read
    assert sum(rows for _, rows in read) <= 3 * len(ids), read
    # run for real: the exact names take their tokens at once; each prefixed name's
    # bucket is made at its first claim, and the next claim takes from it
    for _ in range(2):
        pg.execute(q.JOB_CLAIM_MANY, claim_params(ids, "w1"))
    (running,) = pg.execute(
        "SELECT count(*) FROM jobs WHERE job_id = ANY(%s) AND state = 'RUNNING'", [ids]
    ).fetchone()
    assert running == BATCH
