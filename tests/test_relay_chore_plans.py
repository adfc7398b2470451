"""The relay's chores (retention, the sweep of lapsed leases, the settling of used-up
wake-ups, the search for lost ones and the orphan walk) read a bounded stretch of an
index in the plan the relay's connections make: one generic plan, made at a
statement's first run (plumbing.db.RELAY_OPTIONS plans every statement with
parameters that way). On a history of finished jobs spread over a week and a
backlog with wake-ups in flight (bench.control_plans' tables), no chore reads
jobs, outbox or job_attempts whole where its plan for the values would not."""

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


@pytest.mark.parametrize("chore", list(CHORES))
def test_a_relay_chore_reads_no_more_in_its_generic_plan(
    history: psycopg.Connection, chore: str
) -> None:
    """Planned once for any values, a chore reads no large table whole that its plan
    for the values does not (the orphan walk hashes a small outbox in both, rather
    than probe it for each of its 5,000 jobs); and retention, the sweep and the
    settling read none whole in either."""
    statement, params = CHORES[chore]
    custom = summarise(plan(history, statement, params))
    generic = summarise(plan(history, statement, params, generic=True))
    assert set(generic["seq_scans_of_big_tables"]) <= set(custom["seq_scans_of_big_tables"]), (
        generic["scans"],
        custom["scans"],
    )
    if chore != "JOB_WAKE_ORPHANS":
        assert generic["seq_scans_of_big_tables"] == [], generic["scans"]
