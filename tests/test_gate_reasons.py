"""Every gate names its reasons where an operator looks: `explain` has words for each
(schema/states.py WAITS), and the metrics count the jobs waiting for it."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from harness.claim import claim_params
from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.gates import (
    concurrency,
    deadline,
    dedicated,
    key,
    queue_limit,
    rate,
    resource,
    tenant,
    weight,
)
from hybrid_jobs.schema.states import WAITS
from tests.support.jobs import enqueue
from tests.support.metrics import scrape_once

GATE_MODULES = (
    key,
    rate,
    resource,
    deadline,
    tenant,
    dedicated,
    concurrency,
    queue_limit,
    weight,
)
REASONS = sorted({str(r) for g in GATE_MODULES for r in g.REASONS})


@pytest.mark.parametrize("reason", REASONS)
async def test_each_gates_reason_is_explained_and_counted_by_a_metric(
    db_url: DatabaseUrl, reason: str
) -> None:
    assert reason in {w.code for w in WAITS}, "explain has no words for it"
    scrape = await scrape_once(db_url, "test-gate-reasons")
    naming = [name for name, f in scrape.families.items() if reason in f.documentation]
    assert naming, f"no metric counts the jobs waiting for {reason}"


async def test_the_metrics_count_the_jobs_waiting_for_their_tenants_slot(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_running=1)
    ids = [enqueue(engine, "noop", tenant="acme") for _ in range(3)]
    rows = pg.execute(q.JOB_CLAIM_MANY, claim_params(ids, "w1")).fetchall()
    assert sorted(row[0] for row in rows) == ["TENANT_CAP", "TENANT_CAP", "claimed"]
    scrape = await scrape_once(db_url, "test-tenant-metrics")
    assert scrape.value("hybrid_jobs_jobs_waiting_for_tenant_slot", queue="default") == 2
