"""A claim and an end of leases composed of one gate each read what their batch
costs, not what the tables hold: at production shape (40,000 finished jobs, 20,000
rate limits, 200,000 keys in use, 2,000 queues with limits, 5,000 consumers known),
in the custom plan of a first execution and in the generic plan the daemons make
(plumbing.db.DAEMON_OPTIONS), none reads jobs, outbox or job_attempts whole, and
each reads a few rows of each gate's table per job. (The tenant cap and the
dedicated runners: tests/test_gate_plans_scale.py and tests/test_gate_costs.py; a
type's concurrency limit: tests/test_concurrency_limit_plans.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bench.control_plans import BIG_TABLES, populate
from harness.claim import claim_params
from hybrid_jobs import outbox
from hybrid_jobs.outbox.validation import NewJob
from hybrid_jobs.schema.gates import HELD_GATES
from hybrid_jobs.schema.queries.lease import job_claim_many, job_finish_many
from tests.conftest import _database, _url_for
from tests.support.plans import plan, reads

BATCH = 50
WORKER = "w-plans"
# The gates' own tables, and the ones every claim or end of a lease may look at,
# each filled far beyond a batch.
SIDE_TABLES = ("rate_limits", "rate_buckets", "key_usage", "queue_limits", "queues", "workers")
# What a job of each gate is enqueued with (a job's own key or resource is its
# index in the batch's).
GATES: dict[str, dict[str, Any]] = {
    "plain": {},
    "key": {"key": "key"},
    "rate": {"rate_limit": "rate"},
    "resource": {"resource": "resource"},
    "deadline": {"expires": timedelta(hours=1)},
    "queue_limit": {"queue": "limited"},
    "weight": {"weight": 2},
}
# Rate limits: half exact names, half 'prefix:*'; a batch's jobs are named by both.
SIDE = """
INSERT INTO rate_limits (name, rate, per_seconds, burst)
SELECT CASE WHEN i % 2 = 0 THEN 'api' || i ELSE 'sms:c' || i || ':*' END, 1000, 1, 1000
FROM generate_series(1, 20000) AS i;
INSERT INTO rate_buckets (name, tokens, refilled_at)
SELECT name, burst, now() FROM rate_limits WHERE right(name, 2) <> ':*';
INSERT INTO key_usage (key, running, key_limit)
SELECT 'used' || i, 0, 1 FROM generate_series(1, 200000) AS i;
INSERT INTO queues (queue) SELECT 'other' || i FROM generate_series(1, 2000) AS i;
INSERT INTO queue_limits (queue, max_running, updated_by)
SELECT 'other' || i, 5, 'ops' FROM generate_series(1, 2000) AS i;
INSERT INTO queue_limits (queue, max_running, updated_by) VALUES ('limited', 100000, 'ops');
INSERT INTO workers (worker_id, host, pid, queues, job_types, concurrency, prefetch)
SELECT 'known' || i, 'h', i, '{q0}', '{work0}', 5, 10 FROM generate_series(1, 5000) AS i;
"""


@dataclass(frozen=True)
class Batches:
    """Per gate and plan (custom, generic): the jobs a claim is explained for, still
    waiting, and those of an end of leases, claimed by WORKER."""

    waiting: dict[tuple[str, bool], list[Any]]
    running: dict[tuple[str, bool], list[tuple[Any, int]]]


def _jobs(gate: str, part: int) -> list[NewJob]:
    def named(i: int) -> dict[str, Any]:
        given = dict(GATES[gate])
        if gate in ("key", "resource"):
            given[gate] = f"{gate}-{part}-{i}"
        elif gate == "rate":
            given["rate_limit"] = f"api{2 * i + 2}" if i % 2 else f"sms:c{2 * i + 1}:eu:{part}"
        return given

    return [NewJob("noop", {}, **named(i)) for i in range(BATCH)]


def _params(ids: list[Any]) -> dict[str, Any]:
    params = claim_params(ids, WORKER)
    params["queues"] = [*params["queues"], "limited"]
    return params


@pytest.fixture(scope="module")
def shape(template_db: str) -> Iterator[tuple[psycopg.Connection, Batches]]:
    """One database for the module, each plan rolled back so the tables stay as
    filled."""
    with (
        _database("hj_gateplans", template=template_db) as name,
        psycopg.connect(_url_for(name).conninfo, autocommit=True) as conn,
    ):
        populate(conn, 40_000, 2_000, 5)
        conn.execute(SIDE)
        engine = create_engine(_url_for(name).sqlalchemy)
        made: dict[tuple[str, int], list[Any]] = {}
        with Session(engine) as session, session.begin():
            for gate in GATES:
                for part in range(4):
                    made[gate, part] = outbox.enqueue_many(session, _jobs(gate, part))
        engine.dispose()
        conn.execute("ANALYZE")
        running: dict[tuple[str, bool], list[tuple[Any, int]]] = {}
        for gate in GATES:
            for generic in (False, True):
                # each prefixed name's bucket is made at its first claim: a second
                # claims those jobs
                ids = made[gate, 2 + int(generic)]
                for _ in range(2):
                    conn.execute(job_claim_many(_used(gate)), _params(ids))
                running[gate, generic] = [
                    (row[0], row[1])
                    for row in conn.execute(
                        "SELECT job_id, lease_generation FROM jobs"
                        " WHERE job_id = ANY(%s) AND state = 'RUNNING'",
                        [ids],
                    )
                ]
        waiting = {(g, generic): made[g, int(generic)] for g in GATES for generic in (False, True)}
        yield conn, Batches(waiting, running)


def _used(gate: str) -> frozenset[str]:
    return frozenset() if gate == "plain" else frozenset({gate})


def _check(found: list[dict[str, Any]], jobs: int) -> None:
    top = found[0]["Plan"]
    for table in BIG_TABLES:
        scanned = [node for node, _, loops in reads(top, table) if loops]
        assert "Seq Scan" not in scanned, (table, scanned)
    for table in SIDE_TABLES:
        read = list(reads(top, table))
        assert sum(rows for _, rows, _ in read) <= 4 * jobs + 10, (table, read)


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("gate", list(GATES))
def test_a_claim_of_one_gate_reads_its_batch(
    shape: tuple[psycopg.Connection, Batches], gate: str, generic: bool
) -> None:
    conn, batches = shape
    ids = batches.waiting[gate, generic]
    found = plan(conn, job_claim_many(_used(gate)), _params(ids), generic=generic)
    _check(found, len(ids))


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("gate", list(GATES))
def test_an_end_of_leases_of_one_gate_reads_its_batch(
    shape: tuple[psycopg.Connection, Batches], gate: str, generic: bool
) -> None:
    conn, batches = shape
    held = batches.running[gate, generic]
    # the whole batch claimed, by the fixture's two claims
    assert len(held) == BATCH
    params = {
        "outcomes": json.dumps(
            [
                {"job_id": str(job_id), "generation": generation, "kind": "succeeded"}
                for job_id, generation in held
            ]
        ),
        "worker": WORKER,
    }
    statement = job_finish_many(_used(gate) & HELD_GATES)
    found = plan(conn, statement, params, generic=generic)
    _check(found, len(held))
