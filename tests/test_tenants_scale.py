"""Tenants at production shape, on the real services: thousands of capped tenants
drained through the relay and consumers with every cap held (a soak test, ``-m
soak``); the reconciler repairs drift without making any other tenant's claims wait;
the backpressure count reads what the limit needs, not the backlog.

What the soak drain shows is in every run at a smaller scale: a cap held at every
moment by a relay and two racing consumers, each slot released once
(tests/test_order.py); the relay's decision against a reference, caps and weights
together (tests/test_relay_decision.py); and its work linear in the tenants, not
their product, from 500 to 1,000 tenants (tests/test_relay_decision.py) and bounded
at 10,000 (tests/test_gate_plans_scale.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.plumbing.db import native
from hybrid_jobs.relay.maintenance import reconcile_tenant_slots, refresh_tenant_usage
from hybrid_jobs.schema.queries import TENANT_BACKPRESSURE, TENANT_USAGE_REFRESH
from hybrid_jobs.schema.topology import Topology
from tests.support.inproc import consumer_running, relay_running
from tests.support.jobs import enqueue_many, wait_until_all

pytestmark = pytest.mark.timeout(300)


def set_limits(engine: Engine, tenants: list[str], **limits: Any) -> None:
    with Session(engine) as session, session.begin():
        for tenant in tenants:
            outbox.set_tenant_limit(session, tenant, **limits)


@pytest.mark.soak
async def test_two_thousand_capped_tenants_drain_with_every_cap_held(
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
    engine: Engine,
    pg: psycopg.Connection,
) -> None:
    """2,000 tenants capped at 2, three jobs each, and five heavy ones (weight 50, so
    the fair share would give them far more than 2 at once) with 30 each; one relay
    and two consumers of 20: every job runs once, and no tenant ever has more than
    2 running. (The decision this replaced took minutes for this: each pass counted
    over every tenant's candidates once per tenant.)"""
    registry = Registry()

    @registry.handler("unit")
    async def unit(j: consumers.Job) -> None:
        await asyncio.sleep(0.02)

    tenants = [f"t{i:04d}" for i in range(2000)]
    heavy = [f"heavy{i}" for i in range(5)]
    set_limits(engine, tenants, max_running=2)
    set_limits(engine, heavy, max_running=2, weight=50)
    jobs = [NewJob("unit", {}, tenant=t) for _ in range(3) for t in tenants]
    jobs += [NewJob("unit", {}, tenant=t) for _ in range(30) for t in heavy]
    enqueue_many(engine, jobs)
    services = (db_url, amqp_url, topology)
    async with (
        relay_running(*services),
        consumer_running(*services, registry, concurrency=20),
        consumer_running(*services, registry, concurrency=20),
    ):
        await wait_until_all(pg, "SUCCEEDED", 6150, timeout=240)
    assert pg.execute("SELECT max(attempt_count), count(*) FROM jobs").fetchone() == (1, 6150)
    # The most of one tenant's attempts running at one instant, from the history.
    peaks: dict[bool, int] = dict(
        pg.execute(
            """SELECT tenant LIKE 'heavy%%', max(running) FROM (
               SELECT tenant, sum(step) OVER (PARTITION BY tenant ORDER BY at, step) AS running
               FROM (SELECT j.tenant, a.started_at AS at, 1 AS step
                     FROM job_attempts AS a JOIN jobs AS j USING (job_id)
                     UNION ALL
                     SELECT j.tenant, a.finished_at, -1
                     FROM job_attempts AS a JOIN jobs AS j USING (job_id)) AS edges
           ) AS s
           GROUP BY 1"""
        ).fetchall()
    )
    assert peaks[True] == 2, f"the heavy tenants' cap was held and used: {peaks}"
    assert peaks[False] <= 2, f"a tenant ran more than its cap at once: {peaks}"
    assert pg.execute("SELECT sum(running) FROM tenant_usage").fetchone() == (0,)


async def test_the_reconciler_repairs_drift_without_waiting_for_any_other_tenant(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    pool: AsyncConnectionPool[AsyncConnection],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A claim of tenant "busy" holds its usage row (as every claim and release does,
    briefly); tenant "drifted" counts 3 slots that no lease holds. The reconciler
    repairs "drifted" and never waits for "busy": it used to lock every tenant's
    row first, so one busy tenant held it up, and it held every claim up."""
    set_limits(engine, ["busy", "drifted", "quiet"], max_running=5)
    pg.execute("UPDATE tenant_usage SET running = 3 WHERE tenant = 'drifted'")
    with psycopg.connect(db_url.conninfo) as claim:
        claim.execute("SELECT 1 FROM tenant_usage WHERE tenant = 'busy' FOR NO KEY UPDATE")
        with caplog.at_level(logging.WARNING, logger="relay"):
            repaired = await asyncio.wait_for(reconcile_tenant_slots(pool), 10)
        claim.rollback()
    assert repaired == 1
    usage: dict[str, int] = dict(pg.execute("SELECT tenant, running FROM tenant_usage").fetchall())
    assert usage == {"busy": 0, "drifted": 0, "quiet": 0}
    (record,) = [r for r in caplog.records if r.message == "relay.tenant_slots_repaired"]
    assert (record.tenant, record.recorded, record.held) == ("drifted", 3, 0)  # type: ignore[attr-defined]
    # Nothing drifted: nothing is locked or written.
    assert await reconcile_tenant_slots(pool) == 0


def _rows_handled(node: dict[str, Any]) -> int:
    rows = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
    own = int(rows * node.get("Actual Loops", 1))
    return own + sum(_rows_handled(child) for child in node.get("Plans", []))


async def test_the_backpressure_count_reads_what_the_limit_needs_not_the_backlog(
    engine: Engine, pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection]
) -> None:
    """A tenant with 20,000 waiting jobs and max_queued 50: a round counts 50 of them
    (it counted all 20,000, every second), Backpressure refuses as before, and a
    tenant under its limit is counted exactly."""
    set_limits(engine, ["bulk"], max_queued=50)
    set_limits(engine, ["small"], max_queued=50)
    pg.execute(
        "INSERT INTO jobs (job_id, job_type, tenant, created_at)"
        " SELECT gen_random_uuid(), 't', 'bulk', now() - interval '1 minute'"
        " FROM generate_series(1, 20000)"
    )
    # and a history, as a real table has
    pg.execute(
        "INSERT INTO jobs (job_id, job_type, tenant, state, finished_at)"
        " SELECT gen_random_uuid(), 't', 'old' || (g % 50), 'SUCCEEDED', now()"
        " FROM generate_series(1, 100000) AS g"
    )
    pg.execute("ANALYZE jobs")
    enqueue_many(engine, [NewJob("t", {}, tenant="small") for _ in range(7)])
    with pg.transaction(force_rollback=True):
        (doc,) = pg.execute(  # type: ignore[misc]
            "EXPLAIN (ANALYZE, FORMAT JSON) " + TENANT_USAGE_REFRESH, {"limit": 100}
        ).fetchone()
    handled = _rows_handled(doc[0]["Plan"])
    assert handled < 500, f"{handled} rows handled to count two tenants up to 50"
    await refresh_tenant_usage(pool)
    usage: dict[str, int] = dict(pg.execute("SELECT tenant, queued FROM tenant_usage").fetchall())
    assert usage == {"bulk": 50, "small": 7}
    with Session(engine) as session, session.begin():
        with pytest.raises(outbox.Backpressure) as refused:
            outbox.enqueue(session, "t", {}, tenant="bulk")
        outbox.enqueue(session, "t", {}, tenant="small")
    assert refused.value.waiting >= 50 and refused.value.limit == 50


async def test_each_round_counts_a_slice_of_the_limited_tenants_stalest_first(
    engine: Engine, pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection]
) -> None:
    tenants = [f"t{i:03d}" for i in range(250)]
    set_limits(engine, tenants, max_queued=10)
    enqueue_many(engine, [NewJob("t", {}, tenant=t) for t in tenants])
    counted = "SELECT count(*) FROM tenant_usage WHERE queued_at IS NOT NULL"
    for expected in (100, 200, 250):
        await refresh_tenant_usage(pool, tenants=100)
        assert pg.execute(counted).fetchone() == (expected,)
    # The next round takes the 100 counted longest ago.
    (oldest,) = pg.execute("SELECT min(queued_at) FROM tenant_usage").fetchone()  # type: ignore[misc]
    await refresh_tenant_usage(pool, tenants=100)
    assert pg.execute("SELECT min(queued_at) > %s FROM tenant_usage", [oldest]).fetchone() == (
        True,
    )
    assert pg.execute("SELECT min(queued), max(queued) FROM tenant_usage").fetchone() == (1, 1)


def test_the_enqueues_backpressure_check_is_planned_once_per_connection(
    engine: Engine, pg: psycopg.Connection
) -> None:
    # A producer's connection prepares it after a few enqueues; given the tenants'
    # array, PostgreSQL kept planning it for the values, at every enqueue of a
    # tenant's job (0.34 ms, for a check that runs in 0.013).
    set_limits(engine, [f"t{i}" for i in range(1000)], max_queued=100)
    pg.execute("ANALYZE")
    for i in range(20):
        pg.execute(TENANT_BACKPRESSURE, {"tenants": [f"t{i}"]}, prepare=True).fetchall()
    (generic, custom) = pg.execute(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = %s",
        [native(TENANT_BACKPRESSURE).sql.decode()],
    ).fetchone() or (0, 0)
    assert (generic, custom) == (20 - 5, 5)
