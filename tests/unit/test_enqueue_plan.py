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
    # a field with no value is left out: NULL to jsonb_to_recordset
    assert rows[1]["run_after"] == later.isoformat() and "delay_seconds" not in rows[1]
    assert set(rows[0]) == {"job_id", "job_type", "queue", "tenant", "priority", "payload"}
    assert rows[2]["delay_seconds"] == 90 and rows[2]["max_attempts"] == 2
    assert plan.keys == [("mail", None), ("bill", "b-1"), ("mail", None)]
    assert plan.tenants == {"acme": 2}


def test_a_batch_s_ids_are_time_ordered_distinct_and_ascend_in_its_order() -> None:
    before = datetime.now(UTC)
    _, ids = _plan([NewJob("mail", i) for i in range(5_000)], LIMIT)
    assert len(set(ids)) == len(ids) == 5_000
    assert ids == sorted(ids), "id order is the batch's order"
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    # the first 48 bits are the Unix milliseconds of the call
    made = datetime.fromtimestamp((ids[0].int >> 80) / 1000, UTC)
    assert before - timedelta(seconds=1) <= made <= datetime.now(UTC) + timedelta(seconds=1)
    # the random bits are random: no two ids of the batch share their last 62
    assert len({i.int & (1 << 62) - 1 for i in ids}) == len(ids)


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


def test_tags_and_meta_join_the_row_only_when_given() -> None:
    jobs = [
        NewJob("mail", {}, tags=("vip", "eu", "vip"), meta={"customer": 42, "at": "x"}),
        NewJob("mail", {}, tags=[], meta={}),
    ]
    plan, _ = _plan(jobs, LIMIT)
    tagged, plain = json.loads(plan.document)
    assert (tagged["tags"], tagged["meta"]) == (["vip", "eu"], {"customer": 42, "at": "x"})
    assert "tags" not in plain and "meta" not in plain, "a plain job's row stays as it was"


def test_meta_goes_through_json_default_as_the_payload_does() -> None:
    when = datetime(2026, 5, 1, tzinfo=UTC)
    job = NewJob("mail", {}, meta={"due": when}, json_default=datetime.isoformat)
    plan, _ = _plan([job], LIMIT)
    assert json.loads(plan.document)[0]["meta"] == {"due": when.isoformat()}
