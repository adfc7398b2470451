"""An enqueue with after= names a running parent without holding its row: the
parent's heartbeats and outcome go on while the producer's transaction stays open,
and the new edge is settled at the producer's commit if the parent ended meanwhile
(trigger job_dependencies_check)."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from harness.claim import claim_params
from hybrid_jobs import outbox
from hybrid_jobs.consumers.outcome import Outcome
from hybrid_jobs.consumers.store import finish_params
from hybrid_jobs.schema import queries as q
from tests.support.jobs import enqueue, job


def _running(engine: Engine, pg: psycopg.Connection) -> tuple[uuid.UUID, int]:
    parent = enqueue(engine, "noop")
    (row,) = pg.execute(q.JOB_CLAIM_MANY, claim_params([parent], "w1")).fetchall()
    assert row[0] == "claimed"
    return parent, row[8]


def _pending(pg: psycopg.Connection, job_id: uuid.UUID) -> int:
    row = pg.execute(
        "SELECT count(*) FROM outbox WHERE job_id = %s AND sent_at IS NULL", [job_id]
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("ends", ["succeeded", "failed"])
def test_a_long_producer_transaction_leaves_a_running_parents_lease_alone(
    engine: Engine, pg: psycopg.Connection, ends: str
) -> None:
    parent, generation = _running(engine, pg)
    fence = json.dumps([{"job_id": str(parent), "generation": generation}])
    with Session(engine) as session, session.begin():
        child = outbox.enqueue(session, "noop", {}, after=[parent])
        # the producer's transaction is still open: the parent's worker goes on
        beat = pg.execute(
            q.JOB_HEARTBEAT_MANY, {"jobs": fence, "worker": "w1", "lease_seconds": 60}
        ).fetchall()
        assert beat == [(parent, "RUNNING", False)], "the heartbeat waited for the producer"
        outcome = Outcome.succeeded() if ends == "succeeded" else Outcome.failed("E", "m")
        ended = pg.execute(
            q.JOB_FINISH_MANY, finish_params("w1", [(parent, generation, outcome)])
        ).fetchall()
        assert ended == [(parent, ends.upper())], "the outcome waited for the producer"
    # settled at the producer's commit, as the parent's end would have
    row = job(pg, child)
    assert job(pg, parent)["has_dependants"] is True
    edge = pg.execute(
        "SELECT done, counted FROM job_dependencies WHERE child_id = %s", [child]
    ).fetchone()
    if ends == "succeeded":
        assert (row["state"], row["parents_pending"], row["delay_reason"]) == ("QUEUED", 0, None)
        assert edge == (True, True)
        assert _pending(pg, child) == 1, "the child, due, has its wake-up"
    else:
        assert (row["state"], row["last_error_code"]) == ("CANCELLED", "PARENT_FAILED")
        assert _pending(pg, child) == 0


def test_a_parent_that_ends_after_the_commit_releases_its_child_as_before(
    engine: Engine, pg: psycopg.Connection
) -> None:
    parent, generation = _running(engine, pg)
    with Session(engine) as session, session.begin():
        child = outbox.enqueue(session, "noop", {}, after=[parent])
    assert (job(pg, child)["parents_pending"], _pending(pg, child)) == (1, 0)
    assert job(pg, parent)["has_dependants"] is True
    pg.execute(q.JOB_FINISH_MANY, finish_params("w1", [(parent, generation, Outcome.succeeded())]))
    assert (job(pg, child)["parents_pending"], _pending(pg, child)) == (0, 1)


def test_retention_cannot_delete_a_parent_a_producer_is_naming(
    engine: Engine, pg: psycopg.Connection
) -> None:
    parent, generation = _running(engine, pg)
    pg.execute(q.JOB_FINISH_MANY, finish_params("w1", [(parent, generation, Outcome.succeeded())]))
    with Session(engine) as session, session.begin():
        child = outbox.enqueue(session, "noop", {}, after=[parent])
        deleted = pg.execute(q.JOB_RETENTION_DELETE, {"keep_seconds": 0, "limit": 10}).fetchone()
        assert deleted == (0,), "retention deleted a parent the producer holds"
    assert job(pg, child)["parents_pending"] == 0
