"""A queue's concurrency limit at production shape reads a bounded stretch of index,
in the custom plan of a first execution and in the generic plan a pooled connection
settles on, on the consumer's connection options.

100,000 jobs of a limited queue wait, turned down for its full limit
(QUEUE_CONCURRENCY_LIMIT), their wake-ups in flight, over 100,000 finished jobs of
the queue and 100,000 jobs of another queue waiting; the limit's holders run. The
end of 10 holders' leases gives their slots back and wakes 10 waiters, the oldest,
through jobs_queue_limit_waiting_idx; a claim of 50 waiters reads the queue's row
once and its own jobs. A plan that scans jobs, or walks every waiter, reads
100,000 rows or more, a thousand times the bounds below."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from hybrid_jobs import consumers
from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.plumbing.db import CONTROL_OPTIONS
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.queries import WORKER_TTL_SECONDS
from tests.conftest import _database, _url_for
from tests.support.plans import plan as explain_plan
from tests.test_gate_plans_scale import _v7, no_seq_scan, read_by, total

WAITING = 100_000
HOLDERS = 40
HOLDER = "w-other"
QUEUE = "reports"

_REGISTRY = Registry()


@_REGISTRY.handler("report", queue=QUEUE)
async def _report(job: consumers.Job) -> None:
    return None


SETUP = f"""
INSERT INTO jobs (job_id, job_type, queue, state, attempt_count, max_attempts,
                  lease_generation, created_at, started_at, finished_at)
SELECT {_v7("now() - interval '30 days' + i * interval '1 second'", "i")}, 'report',
       '{QUEUE}', 'SUCCEEDED', 1, 3, 1, now() - interval '30 days',
       now() - interval '30 days', now() - interval '30 days'
FROM generate_series(1, %(n)s::int) AS i;
INSERT INTO jobs (job_id, job_type, queue, state, attempt_count, lease_generation,
                  delay_reason, delay_since, created_at, run_after)
SELECT {_v7("now() - interval '2 hours'", "%(n)s + i")}, 'other', 'default', 'QUEUED', 0, 0,
       'NO_HANDLER', now(), now() - interval '2 hours', now() - interval '2 hours'
FROM generate_series(1, %(n)s::int) AS i;
INSERT INTO jobs (job_id, job_type, queue, state, attempt_count, lease_generation,
                  delay_reason, delay_since, created_at, run_after)
SELECT {_v7("now() - interval '1 hour'", "2 * %(n)s + i")}, 'report', '{QUEUE}', 'QUEUED',
       0, 0, 'QUEUE_CONCURRENCY_LIMIT', now(), now() - interval '1 hour',
       now() - interval '1 hour'
FROM generate_series(1, %(n)s::int) AS i;
INSERT INTO jobs (job_id, job_type, queue, state, attempt_count, max_attempts,
                  lease_generation, lease_owner, lease_expires_at, started_at,
                  queue_limit_held, created_at)
SELECT {_v7("now()", "4 * %(n)s + i")}, 'report', '{QUEUE}', 'RUNNING', 1, 3, 1, '{HOLDER}',
       now() + interval '1 hour', now(), true, now()
FROM generate_series(1, %(holders)s::int) AS i;
INSERT INTO queue_limits (queue, max_running, running, updated_by)
VALUES ('{QUEUE}', %(holders)s, %(holders)s, 'w0');
INSERT INTO queues (queue, limited) VALUES ('{QUEUE}', true);
"""


@pytest.fixture(scope="module")
def limited(template_db: str) -> Iterator[psycopg.Connection]:
    with _database("hj_qlimits", template=template_db) as name:
        url = _url_for(name).conninfo
        with psycopg.connect(url, autocommit=True) as pg:
            for statement in SETUP.split(";\n"):
                if statement.strip():
                    pg.execute(statement, {"n": WAITING, "holders": HOLDERS})
            # the waiters' wake-ups used up: none pending (the end of a lease adds one)
            pg.execute("VACUUM ANALYZE")
        with psycopg.connect(url, autocommit=True, options=CONTROL_OPTIONS) as consumer:
            yield consumer


def _waiters(pg: psycopg.Connection) -> str:
    """The query of queue_limit_waiters, which an end of a lease calls for the
    waiters of a freed slot (its reads are not in the calling statement's plan), with
    its arguments as named parameters."""
    row = pg.execute("SELECT prosrc FROM pg_proc WHERE proname = 'queue_limit_waiters'").fetchone()
    assert row is not None
    body = str(row[0])
    for name, cast in (("queue", "text"), ("n", "int"), ("free", "int"), ("ending", "uuid[]")):
        body = re.sub(rf"\bp_{name}\b", f"%({name})s::{cast}", body)
    return body


def _waiters_params(holders: list[Any]) -> dict[str, Any]:
    return {"queue": QUEUE, "n": len(holders), "free": len(holders), "ending": holders}


def _ids(pg: psycopg.Connection, sql: str) -> list[Any]:
    return [row[0] for row in pg.execute(sql).fetchall()]


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_the_end_of_a_limited_queues_leases_wakes_the_oldest_waiters_reading_a_few_rows(
    limited: psycopg.Connection, generic: bool
) -> None:
    pg = limited
    holders = _ids(pg, "SELECT job_id FROM jobs WHERE state = 'RUNNING' ORDER BY job_id")[:10]
    params = {
        "outcomes": json.dumps(
            [{"job_id": str(i), "generation": 1, "kind": "succeeded"} for i in holders]
        ),
        "worker": HOLDER,
    }
    statement = q.job_finish_many({"queue_limit"})
    found = explain_plan(pg, statement, params, generic=generic)
    read = read_by(found, "jobs", "queue_limits", "outbox")
    # (queue_limits holds a row per limited queue, and the outbox none pending:
    # a scan of either reads what a probe would)
    no_seq_scan(read, "jobs")
    assert total(read, "jobs") <= 10 * len(holders), read
    assert total(read, "queue_limits") <= 3, read
    assert total(read, "outbox") <= 3 * len(holders), read
    # the waiters, read by the function the statement calls: the index's first entries
    waiters = read_by(
        explain_plan(pg, _waiters(pg), _waiters_params(holders), generic=generic), "jobs"
    )
    no_seq_scan(waiters, "jobs")
    assert total(waiters, "jobs") <= 4 * len(holders), waiters
    oldest = _ids(
        pg,
        "SELECT job_id FROM jobs WHERE state = 'QUEUED'"
        " AND delay_reason = 'QUEUE_CONCURRENCY_LIMIT'"
        " ORDER BY job_id LIMIT 10",
    )
    with pg.transaction(force_rollback=True):
        ended = pg.execute(statement, params).fetchall()
        running = pg.execute(
            "SELECT running FROM queue_limits WHERE queue = %s", [QUEUE]
        ).fetchone()
        woken = _ids(pg, "SELECT job_id FROM outbox WHERE sent_at IS NULL ORDER BY job_id")
    assert sorted(ended) == sorted((i, "SUCCEEDED") for i in holders)
    assert running == (HOLDERS - len(holders),)
    assert woken == oldest


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_the_claim_of_a_limited_queue_reads_its_batch_and_the_queues_row(
    limited: psycopg.Connection, generic: bool
) -> None:
    pg = limited
    batch = _ids(
        pg,
        f"SELECT job_id FROM jobs WHERE state = 'QUEUED' AND queue = '{QUEUE}'"
        " ORDER BY job_id DESC LIMIT 50",
    )
    params = {
        "job_ids": batch,
        "types": json.dumps(_REGISTRY.claim_terms()),
        "free_threads": 0,
        "concurrency": 10,
        "free_slots": 10,
        "worker": "w1",
        "lease_seconds": 30,
        "worker_ttl": WORKER_TTL_SECONDS,
        "tenants": [],
        "queues": _REGISTRY.queues(),
    }
    statement = q.job_claim_many({"queue_limit"})
    found = explain_plan(pg, statement, params, generic=generic)
    read = read_by(found, "jobs", "queue_limits", "outbox")
    # (queue_limits holds a row per limited queue, and the outbox none pending:
    # a scan of either reads what a probe would)
    no_seq_scan(read, "jobs")
    assert total(read, "jobs") <= 10 * len(batch), read
    assert total(read, "queue_limits") <= 3, read
    assert total(read, "outbox") <= 3 * len(batch), read
    with pg.transaction(force_rollback=True):
        rows = pg.execute(statement, params).fetchall()
    # the limit is full: every one turned down for it, none polled
    assert {row[0] for row in rows} == {"QUEUE_CONCURRENCY_LIMIT"}


def test_without_its_index_the_end_of_a_lease_reads_past_its_bound(
    limited: psycopg.Connection,
) -> None:
    # the bound above is one a degraded plan breaks: without jobs_queue_limit_waiting_idx
    # the next waiters are found by reading the queue's jobs
    pg = limited
    holders = _ids(pg, "SELECT job_id FROM jobs WHERE state = 'RUNNING' ORDER BY job_id")[:10]
    with pg.transaction(force_rollback=True):
        pg.execute("DROP INDEX jobs_queue_limit_waiting_idx")
        found = explain_plan(pg, _waiters(pg), _waiters_params(holders))
    read = read_by(found, "jobs")
    assert total(read, "jobs") > 4 * len(holders), read
