"""Enqueue's plan, before any statement runs: each job validated into the JSON row
JOB_INSERT_MANY takes (a new time-ordered id, the payload spliced in whole), the
(job_type, dedup_key) pairs in order, the jobs per tenant for backpressure; then each
caller's id resolved from what was inserted and what dedup found. Enqueueing into a
real database is tests/test_enqueue.py."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from hybrid_jobs.outbox import NewJob
from hybrid_jobs.outbox.enqueue import _plan, _resolve

LIMIT = 1024


def test_each_job_becomes_one_row_with_its_payload_spliced_in() -> None:
    later = datetime(2026, 5, 1, 12, tzinfo=UTC)
    jobs = [
        NewJob("mail", {"to": "ann", "n": [1, 2]}, tenant="acme", priority=3),
        NewJob("bill", None, queue="billing", dedup_key="b-1", run_after=later),
        NewJob("mail", "x", tenant="acme", run_after=timedelta(seconds=90), max_attempts=2),
    ]
    plan, ids = _plan(jobs, LIMIT)
    rows = json.loads(plan.document)
    assert [uuid.UUID(r["job_id"]) for r in rows] == ids
    assert all(i.version == 7 for i in ids), "time-ordered ids"
    assert rows[0]["payload"] == {"to": "ann", "n": [1, 2]} and rows[0]["priority"] == 3
    assert (rows[1]["queue"], rows[1]["dedup_key"]) == ("billing", "b-1")
    assert rows[1]["run_after"] == later.isoformat() and rows[1]["delay_seconds"] is None
    assert rows[2]["delay_seconds"] == 90 and rows[2]["max_attempts"] == 2
    assert plan.keys == [("mail", None), ("bill", "b-1"), ("mail", None)]
    assert plan.tenants == {"acme": 2}


def test_nothing_is_planned_from_a_job_that_is_refused() -> None:
    with pytest.raises(TypeError, match="NewJob items"):
        _plan([NewJob("ok", 1), ("mail", {})], LIMIT)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="limit is 1024"):
        _plan([NewJob("big", "x" * LIMIT)], LIMIT)
    with pytest.raises(ValueError, match="timezone-aware"):
        _plan([NewJob("t", 1, run_after=datetime(2026, 5, 1))], LIMIT)


def test_a_duplicate_resolves_to_the_job_that_holds_its_key() -> None:
    plan, ids = _plan(
        [NewJob("a", 1, dedup_key="k"), NewJob("b", 2), NewJob("c", 3, dedup_key="k")], LIMIT
    )
    holder_a, holder_c = uuid.uuid4(), uuid.uuid4()
    inserted = {ids[1]}
    assert json.loads(plan.lookup_document(inserted, ids) or "null") == [
        {"job_type": "a", "dedup_key": "k"},
        {"job_type": "c", "dedup_key": "k"},
    ]
    found = [("a", "k", holder_a), ("c", "k", holder_c)]
    assert _resolve(plan, ids, inserted, found) == [holder_a, ids[1], holder_c]
    assert plan.lookup_document(set(ids), ids) is None, "nothing to look up"


def test_a_key_whose_holder_vanished_asks_for_a_retry() -> None:
    plan, ids = _plan([NewJob("a", 1, dedup_key="k")], LIMIT)
    with pytest.raises(RuntimeError, match="retry the transaction"):
        _resolve(plan, ids, set(), [])
