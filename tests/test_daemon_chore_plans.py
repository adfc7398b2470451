"""The daemons' occasional statements read a bounded stretch of an index in the plan
their connections make: one generic plan, made at a statement's first run
(plumbing.db.DAEMON_OPTIONS, and the relay's RELAY_OPTIONS built on it, plan every
statement with parameters that way). The relay's chores (retention, the sweep of
lapsed leases, the settling of used-up wake-ups, the search for lost ones, the orphan
walk, the tenants' usage counts) and the consumer's statements off its claim and
outcome (waking parked and heavy jobs, handing wake-ups back, marking the ones it
holds, finding its own leases and the uncertain holds of its resources): on a history
of finished jobs spread over a week and a backlog with wake-ups in flight
(bench.control_plans' tables), none reads jobs, outbox or job_attempts whole where
its plan for the values would not."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from bench.control_plans import populate, summarise
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.queries import WORKER_TTL_SECONDS
from tests.conftest import _database, _url_for
from tests.support.plans import plan

FINISHED = 40_000
BACKLOG = 2_000
TENANTS = 5
DAY = 86_400.0

# Each chore as the relay runs it (relay/retention.py, relay/maintenance.py), with
# the values it binds.
CHORES: dict[str, tuple[str, dict[str, Any]]] = {
    "JOB_RETENTION_DELETE": (q.JOB_RETENTION_DELETE, {"keep_seconds": 3 * DAY, "limit": 1000}),
    "EFFECT_RETENTION_DELETE": (
        q.EFFECT_RETENTION_DELETE,
        {"keep_seconds": 3 * DAY, "limit": 1000},
    ),
    "INPUT_RETENTION_DELETE": (q.INPUT_RETENTION_DELETE, {"keep_seconds": 3 * DAY, "limit": 1000}),
    "WEBHOOK_DELIVERY_RETENTION_DELETE": (
        q.WEBHOOK_DELIVERY_RETENTION_DELETE,
        {"keep_seconds": 3 * DAY, "limit": 1000},
    ),
    "JOB_SWEEP_EXPIRED": (q.JOB_SWEEP_EXPIRED, {"limit": 500, "default_backoff": 5.0}),
    "OUTBOX_SETTLE": (q.OUTBOX_SETTLE, {"limit": 500}),
    "OUTBOX_LOST_QUEUES": (
        q.OUTBOX_LOST_QUEUES,
        {"grace_seconds": 30.0, "worker_ttl": WORKER_TTL_SECONDS},
    ),
    "OUTBOX_REWAKE_LOST": (
        q.OUTBOX_REWAKE_LOST,
        {"grace_seconds": 30.0, "worker_ttl": WORKER_TTL_SECONDS, "queues": ["q0"]},
    ),
    "JOB_WAKE_ORPHANS": (
        q.JOB_WAKE_ORPHANS,
        {
            "after": uuid.UUID(int=0),
            "slice": 5000,
            "grace_seconds": 30.0,
            "worker_ttl": WORKER_TTL_SECONDS,
        },
    ),
    "TENANT_USAGE_DRIFTED": (q.TENANT_USAGE_DRIFTED, {"limit": 500}),
    "TENANT_USAGE_REFRESH": (q.TENANT_USAGE_REFRESH, {"limit": 500}),
    "TENANT_USAGE_RECONCILE": (q.TENANT_USAGE_RECONCILE, {"tenants": ["t1", "t2"]}),
}

# The consumer's (consumers/store.py), with the values it binds; JOBS stands for a
# batch of waiting jobs' ids, filled in from the backlog.
JOBS = object()
SERVED = {"queues": ["q0", "q1"], "job_types": ["work0", "work1"]}
CONSUMER: dict[str, tuple[str, dict[str, Any]]] = {
    "JOB_WAKE_PARKED": (q.JOB_WAKE_PARKED, SERVED | {"tenants": []}),
    "JOB_WAKE_HEAVY": (q.JOB_WAKE_HEAVY, SERVED | {"concurrency": 50}),
    "OUTBOX_HAND_BACK": (q.OUTBOX_HAND_BACK, {"job_ids": JOBS, "delay_seconds": 0.0}),
    "OUTBOX_HELD_REFRESH": (q.OUTBOX_HELD_REFRESH, {"job_ids": JOBS}),
    "JOB_HELD_BY": (q.JOB_HELD_BY, {"job_ids": JOBS, "worker": "w1"}),
    "RESOURCE_UNCERTAIN_FOR": (q.RESOURCE_UNCERTAIN_FOR, {"job_ids": JOBS}),
}


@pytest.fixture(scope="module")
def history(template_db: str) -> Iterator[psycopg.Connection]:
    """One database for the module: each plan is rolled back, so the tables stay as
    filled."""
    with (
        _database("hj_chores", template=template_db) as name,
        psycopg.connect(_url_for(name).conninfo, autocommit=True) as conn,
    ):
        populate(conn, FINISHED, BACKLOG, TENANTS)
        yield conn


def _no_more_read(
    conn: psycopg.Connection, statement: str, params: dict[str, Any]
) -> dict[str, Any]:
    """The generic plan's summary, once checked to read no large table whole that
    the plan for the values does not."""
    custom = summarise(plan(conn, statement, params))
    generic = summarise(plan(conn, statement, params, generic=True))
    assert set(generic["seq_scans_of_big_tables"]) <= set(custom["seq_scans_of_big_tables"]), (
        generic["scans"],
        custom["scans"],
    )
    return generic


@pytest.mark.parametrize("chore", list(CHORES))
def test_a_relay_chore_reads_no_more_in_its_generic_plan(
    history: psycopg.Connection, chore: str
) -> None:
    """Planned once for any values, a chore reads no large table whole that its plan
    for the values does not (the orphan walk hashes a small outbox in both, rather
    than probe it for each of its 5,000 jobs); and the others read none whole in
    either."""
    statement, params = CHORES[chore]
    generic = _no_more_read(history, statement, params)
    if chore != "JOB_WAKE_ORPHANS":
        assert generic["seq_scans_of_big_tables"] == [], generic["scans"]


@pytest.mark.parametrize("statement", list(CONSUMER))
def test_a_consumers_occasional_statement_reads_no_large_table_in_its_generic_plan(
    history: psycopg.Connection, statement: str
) -> None:
    sql, given = CONSUMER[statement]
    batch = [
        row[0]
        for row in history.execute(
            "SELECT job_id FROM jobs WHERE queue = 'q0' AND state = 'QUEUED' LIMIT 50"
        )
    ]
    params = {k: batch if v is JOBS else v for k, v in given.items()}
    generic = _no_more_read(history, sql, params)
    assert generic["seq_scans_of_big_tables"] == [], generic["scans"]
