"""Outcomes the database could refuse: whatever a handler returns or reports, its
job's outcome is recorded once, and nothing it hands over turns into a driver error
or a lease left to lapse. Through real consumers, plain and async handlers alike."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine

from hybrid_jobs import consumers
from hybrid_jobs.consumers import Backoff, Registry
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.inproc import consumer_running, relay_running
from tests.support.jobs import attempts, enqueue_many, job, wait_for_state

pytestmark = pytest.mark.timeout(180)

# A short lease: on code that drops an outcome, the sweeper retries the job soon,
# and the test sees the extra attempts instead of waiting a minute.
LEASE = {"lease_seconds": 2.0, "heartbeat_seconds": 0.5}
QUICK = Backoff(base=0.1, cap=0.2, jitter=0)


def deep(levels: int) -> Any:
    value: Any = []
    for _ in range(levels):
        value = [value]
    return value


UNSTORABLE: dict[str, Callable[[], Any]] = {
    "surrogate": lambda: {"name": "report-\udcff.csv"},
    "nul": lambda: {"line": "a\x00b"},
    "too_big": lambda: "x" * 70_000,
    "not_json": lambda: {"when": object()},
    "nan": lambda: {"ratio": math.nan},
    "too_deep": lambda: deep(100),
    "recursive": lambda: deep(5000),
    "huge_int": lambda: 10**5000,
}


@pytest.fixture
def services(db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology):
    return db_url, amqp_url, topology


def register(registry: Registry, job_type: str, make: Callable[[consumers.Job], Any]) -> None:
    """An async and a plain handler (queue "sync") of the same behaviour."""

    async def run_async(j: consumers.Job) -> Any:
        return make(j)

    def run_plain(j: consumers.Job) -> Any:
        return make(j)

    common = {"max_attempts": 3, "backoff": QUICK}
    registry.handler(f"{job_type}_async", **common)(run_async)
    registry.handler(f"{job_type}_plain", queue="sync", **common)(run_plain)


async def test_a_result_that_cannot_be_stored_is_replaced_by_a_note_and_succeeds_once(
    services, engine: Engine, pg: psycopg.Connection
) -> None:
    registry = Registry()
    for name, value in UNSTORABLE.items():
        register(registry, name, lambda j, value=value: value())

    async def in_tx(j: consumers.Job) -> None:
        async with j.transaction() as tx:
            tx.set_result({"name": "report-\udcff.csv"})

    def in_tx_plain(j: consumers.Job) -> None:
        with j.transaction() as tx:
            tx.set_result({"line": "a\x00b"})

    registry.handler("in_tx_async", max_attempts=3, backoff=QUICK)(in_tx)
    registry.handler("in_tx_plain", queue="sync", max_attempts=3, backoff=QUICK)(in_tx_plain)
    types = [*(f"{n}_{k}" for n in [*UNSTORABLE, "in_tx"] for k in ("async", "plain"))]
    ids = enqueue_many(
        engine, [NewJob(t, {}, queue="sync" if t.endswith("_plain") else "default") for t in types]
    )
    async with (
        relay_running(*services, sweep_interval=0.2),
        consumer_running(*services, registry, queues=("default", "sync"), **LEASE),
    ):
        # (Had an outcome been dropped, its lease would lapse and the job run again,
        # until FAILED with LEASE_EXPIRED.)
        rows = {
            t: await wait_for_state(pg, i, "SUCCEEDED", "FAILED")
            for t, i in zip(types, ids, strict=True)
        }
    for (job_type, row), job_id in zip(rows.items(), ids, strict=True):
        assert row["state"] == "SUCCEEDED", (job_type, row["last_error_code"])
        assert row["attempt_count"] == 1, job_type
        assert [a["outcome"] for a in attempts(pg, job_id)] == ["SUCCEEDED"], job_type
        assert set(job(pg, job_id)["result"]) == {"result_dropped"}, job_type
    notes = {t: r["result"]["result_dropped"] for t, r in rows.items()}
    assert "lone surrogate (U+DCFF)" in notes["surrogate_async"]
    assert "NUL character" in notes["nul_plain"]
    assert "70002 bytes" in notes["too_big_async"]
    assert "nested 101 levels deep" in notes["too_deep_plain"]
    assert "RecursionError" in notes["recursive_async"]
    assert "not JSON-serialisable" in notes["not_json_plain"]


async def test_a_progress_report_that_cannot_be_stored_is_refused_at_the_call(
    services, engine: Engine, pg: psycopg.Connection
) -> None:
    bad = [
        {"done": 1, "stage": "a\x00b"},
        {"done": 1, "stage": "report-\udcff"},
        {"done": math.nan},
        {"done": 1, "total": math.inf},
        {"done": "1"},
        {"done": 1, "stage": 7},
    ]

    def refusals(j: consumers.Job) -> list[str]:
        found = []
        for kwargs in bad:
            try:
                j.progress(**kwargs)
            except (TypeError, ValueError) as exc:
                found.append(f"{type(exc).__name__}: {exc}")
            else:
                found.append("accepted")
        return found

    registry = Registry()

    @registry.handler("reports_async", max_attempts=3, backoff=QUICK)
    async def reports_async(j: consumers.Job) -> list[str]:
        found = refusals(j)
        await j.progress(2, total=3, stage="fine")
        return found

    @registry.handler("reports_plain", queue="sync", max_attempts=3, backoff=QUICK)
    def reports_plain(j: consumers.Job) -> list[str]:
        found = refusals(j)
        j.progress(2, total=3, stage="fine").result(10)
        return found

    ids = enqueue_many(
        engine, [NewJob("reports_async", {}), NewJob("reports_plain", {}, queue="sync")]
    )
    async with (
        relay_running(*services, sweep_interval=0.2),
        consumer_running(*services, registry, queues=("default", "sync"), **LEASE),
    ):
        rows = [await wait_for_state(pg, i, "SUCCEEDED", "FAILED") for i in ids]
    for row in rows:
        assert (row["state"], row["attempt_count"]) == ("SUCCEEDED", 1), row["last_error_code"]
        assert row["progress"] == {"done": 2, "total": 3, "stage": "fine"}
        found = row["result"]
        assert [f.split(":")[0] for f in found] == ["ValueError"] * 4 + ["TypeError"] * 2, found
        assert "NUL character" in found[0] and "lone surrogate" in found[1]


async def test_an_outcome_the_database_refuses_is_recorded_without_what_it_refused(
    services, engine: Engine, pg: psycopg.Connection
) -> None:
    """Valid as far as the consumer can tell, refused by the database (here by
    CHECK constraints of the test's own): the outcome is recorded without the part
    refused, never dropped for the lease to lapse, and its batch is still recorded."""
    pg.execute(
        "ALTER TABLE jobs ADD CONSTRAINT no_forbidden_result"
        " CHECK (result IS NULL OR NOT result ? 'forbidden')"
    )
    pg.execute(
        "ALTER TABLE jobs ADD CONSTRAINT plain_errors"
        " CHECK (last_error_message IS NULL OR last_error_message NOT LIKE '%%secret%%')"
    )
    registry = Registry()
    register(registry, "forbidden", lambda j: {"forbidden": True})

    @registry.handler("tells_secrets", max_attempts=1)
    async def tells_secrets(j: consumers.Job) -> None:
        raise ValueError("the secret is 42")

    @registry.handler("fine")
    async def fine(j: consumers.Job) -> dict[str, int]:
        return {"ok": 1}

    jobs = [
        NewJob("forbidden_async", {}),
        NewJob("forbidden_plain", {}, queue="sync"),
        NewJob("tells_secrets", {}),
        *(NewJob("fine", {}) for _ in range(20)),
    ]
    ids = enqueue_many(engine, jobs)
    async with (
        relay_running(*services, sweep_interval=0.2),
        consumer_running(*services, registry, queues=("default", "sync"), **LEASE),
    ):
        rows = [await wait_for_state(pg, i, "SUCCEEDED", "FAILED") for i in ids]
    for row, job_id in zip(rows, ids, strict=True):
        assert row["attempt_count"] == 1
        assert len(attempts(pg, job_id)) == 1
    forbidden_async, forbidden_plain, secret, *others = rows
    for row in (forbidden_async, forbidden_plain):
        assert row["state"] == "SUCCEEDED"
        assert "no_forbidden_result" in row["result"]["result_dropped"]
    assert (secret["state"], secret["last_error_code"]) == ("FAILED", "ValueError")
    assert "refused this attempt's error text" in secret["last_error_message"]
    assert {r["state"] for r in others} == {"SUCCEEDED"}
    assert all(r["result"] == {"ok": 1} for r in others)
