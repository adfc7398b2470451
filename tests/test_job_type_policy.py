"""What a job type allows (replay, cancelling it while it runs, what a cancel
promises), declared on the handler, recorded by the consumer, and held to by the
statements every surface runs."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.async_api import expect
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.queries import JOB_REPLAY, JOB_TYPE_POLICY_RECORD_MANY
from hybrid_jobs.schema.states import JobState
from hybrid_jobs.schema.topology import Topology
from tests.support.api import api_client
from tests.support.dashboard import chromium, dashboard_served, sign_in
from tests.support.jobs import enqueue, job
from tests.support.processes import jobctl, running, service_env

pytestmark = pytest.mark.timeout(120)


def _registry() -> Registry:
    registry = Registry()

    @registry.handler("capture_payment", replay=False, cancel_running=False, on_cancel="compensate")
    def capture(j: consumers.Job) -> None:
        return None

    @registry.handler("send_receipt")
    def receipt(j: consumers.Job) -> None:
        return None

    return registry


def record(pg: psycopg.Connection, registry: Registry, worker: str = "w1") -> list[str]:
    """What a consumer with these handlers records at start-up."""
    rows = pg.execute(
        JOB_TYPE_POLICY_RECORD_MANY,
        {"policies": json.dumps(registry.policies()), "worker": worker},
    ).fetchall()
    return sorted(r[0] for r in rows)


def finish(pg: psycopg.Connection, job_ids: list[uuid.UUID], state: str = "FAILED") -> None:
    pg.execute(
        "UPDATE jobs SET state = %s, attempt_count = 1, max_attempts = 1, started_at = now(),"
        " finished_at = clock_timestamp(), last_error_code = 'Boom' WHERE job_id = ANY(%s)",
        (state, job_ids),
    )


def run(pg: psycopg.Connection, job_id: uuid.UUID) -> None:
    pg.execute(
        "UPDATE jobs SET state = 'RUNNING', lease_owner = 'w', lease_generation = 1,"
        " attempt_count = 1, started_at = now(), lease_expires_at = now() + interval '1 hour'"
        " WHERE job_id = %s",
        [job_id],
    )


def replays(pg: psycopg.Connection, job_id: uuid.UUID) -> list[tuple[Any, ...]]:
    return pg.execute(
        "SELECT replayed_by, forced FROM job_replays WHERE job_id = %s ORDER BY id", [job_id]
    ).fetchall()


@pytest.fixture
def policies(pg: psycopg.Connection) -> Registry:
    registry = _registry()
    assert record(pg, registry) == ["capture_payment"]
    return registry


def test_a_consumer_records_restricting_types_only_and_the_last_to_start_wins(pg) -> None:
    registry = _registry()
    assert record(pg, registry, "w1") == ["capture_payment"]
    assert record(pg, registry, "w2") == [], "the same declaration changes nothing"
    rows = pg.execute(
        "SELECT job_type, replay, cancel_running, on_cancel, updated_by FROM job_type_policies"
    ).fetchall()
    assert rows == [("capture_payment", False, False, "compensate", "w1")]

    # A later deploy whose handler allows replay again: its consumer changes the row.
    later = Registry()

    @later.handler("capture_payment", cancel_running=False)
    def capture(j: consumers.Job) -> None:
        return None

    assert record(pg, later, "w3") == ["capture_payment"]
    assert pg.execute(
        "SELECT replay, cancel_running, on_cancel, updated_by FROM job_type_policies"
    ).fetchall() == [(True, False, None, "w3")]

    # One that declares nothing for it any more removes the row: it allows everything.
    plain = Registry()

    @plain.handler("capture_payment")
    def capture_again(j: consumers.Job) -> None:
        return None

    assert record(pg, plain, "w4") == ["capture_payment"]
    assert pg.execute("SELECT count(*) FROM job_type_policies").fetchone() == (0,)


def test_a_handler_declaration_is_checked_when_it_is_registered() -> None:
    registry = Registry()
    with pytest.raises(TypeError, match="replay must be a bool"):
        registry.handler("a", replay="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_cancel is 201 characters long"):
        registry.handler("a", on_cancel="x" * 201)


def test_a_replay_the_type_forbids_is_refused_with_the_reason_and_changes_nothing(
    engine: Engine, pg, policies
) -> None:
    job_id = enqueue(engine, "capture_payment", {"order": 1})
    finish(pg, [job_id])
    before = job(pg, job_id)
    wakeups = pg.execute("SELECT count(*) FROM outbox WHERE job_id = %s", [job_id]).fetchone()
    with (
        Session(engine) as session,
        session.begin(),
        pytest.raises(outbox.NotAllowed) as refused,
    ):
        outbox.retry_job(session, job_id, by="tired operator")
    assert refused.value.action == "replay"
    assert refused.value.state == JobState.FAILED
    assert (refused.value.policy.replay, refused.value.policy.on_cancel) == (False, "compensate")
    assert "may not be replayed" in str(refused.value)
    assert job(pg, job_id) == before
    assert replays(pg, job_id) == []
    assert (
        pg.execute("SELECT count(*) FROM outbox WHERE job_id = %s", [job_id]).fetchone() == wakeups
    )


def test_a_forced_replay_goes_through_and_is_recorded_as_forced(
    engine: Engine, pg, policies
) -> None:
    forbidden = enqueue(engine, "capture_payment", {})
    allowed = enqueue(engine, "send_receipt", {})
    finish(pg, [forbidden, allowed], "CANCELLED")
    with Session(engine) as session, session.begin():
        state = outbox.retry_job(session, forbidden, by="alice", override_policy=True)
        assert state == JobState.QUEUED
        assert outbox.retry_job(session, allowed, override_policy=True) == JobState.QUEUED
    assert job(pg, forbidden)["state"] == "QUEUED"
    assert replays(pg, forbidden) == [("alice", True)]
    # Overriding a policy that forbids nothing overrides nothing.
    assert replays(pg, allowed)[0][1] is False


def test_a_bulk_replay_passes_over_forbidden_types_and_counts_them(
    engine: Engine, pg, policies
) -> None:
    forbidden = [enqueue(engine, "capture_payment", {"n": n}) for n in range(3)]
    allowed = [enqueue(engine, "send_receipt", {"n": n}) for n in range(2)]
    finish(pg, forbidden + allowed)
    with Session(engine) as session, session.begin():
        done = outbox.retry_jobs(session, error_code="Boom", limit=2, by="bob")
    assert (done, done.not_allowed) == (2, 3), "the limit counts the jobs replayed"
    states = dict(pg.execute("SELECT job_id, state FROM jobs").fetchall())
    assert {states[i] for i in allowed} == {"QUEUED"}
    assert {states[i] for i in forbidden} == {"FAILED"}

    with Session(engine) as session, session.begin():
        forced = outbox.retry_jobs(session, error_code="Boom", override_policy=True)
    assert (forced, forced.not_allowed) == (3, 0)
    assert {replays(pg, i)[0] for i in forbidden} == {(replays(pg, forbidden[0])[0][0], True)}


def test_cancel_of_a_running_job_is_refused_unless_overridden_and_waiting_ones_are_cancelled(
    engine: Engine, pg, policies
) -> None:
    running = enqueue(engine, "capture_payment", {})
    waiting = enqueue(engine, "capture_payment", {})
    run(pg, running)
    with (
        Session(engine) as session,
        session.begin(),
        pytest.raises(outbox.NotAllowed) as refused,
    ):
        outbox.request_cancel(session, running, force=True)
    assert "may not be cancelled running" in str(refused.value)
    assert refused.value.state == JobState.RUNNING
    row = job(pg, running)
    assert (row["state"], row["cancel_requested_at"], row["cancel_override_by"]) == (
        "RUNNING",
        None,
        None,
    )
    with Session(engine) as session, session.begin():
        assert outbox.request_cancel(session, waiting) == JobState.CANCELLED
        state = outbox.request_cancel(session, running, override_policy=True, by="carol")
    assert state == JobState.CANCEL_REQUESTED
    row = job(pg, running)
    assert (row["state"], row["cancel_override_by"]) == ("CANCEL_REQUESTED", "carol")
    assert row["cancel_requested_at"] is not None


def test_a_type_with_no_policy_row_is_replayed_and_cancelled_as_before(
    engine: Engine, pg, policies
) -> None:
    failed = enqueue(engine, "send_receipt", {})
    running = enqueue(engine, "untyped", {})
    finish(pg, [failed])
    run(pg, running)
    with Session(engine) as session, session.begin():
        assert outbox.retry_job(session, failed) == JobState.QUEUED
        assert outbox.request_cancel(session, running) == JobState.CANCEL_REQUESTED
        assert outbox.job_type_policy(session, "untyped").allows_all
        shown = outbox.job_type_policy(session, "capture_payment")
    assert (shown.replay, shown.cancel_running, shown.updated_by) == (False, False, "w1")
    assert replays(pg, failed)[0][1] is False
    assert job(pg, running)["cancel_override_by"] is None


def test_a_replay_of_a_type_without_a_policy_reads_the_policies_once(engine: Engine, pg) -> None:
    """Pay for what you use: the policy of a type without one is one probe (no read
    of it per candidate, none in the select list), in a plan run and rolled back."""
    failed = enqueue(engine, "send_receipt", {})
    finish(pg, [failed])
    params = {"job_id": failed, "by": "x", "override": False}
    with pg.transaction(force_rollback=True):
        row = pg.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + JOB_REPLAY, params).fetchone()
    assert row is not None
    nodes: list[dict[str, Any]] = []

    def walk(node: dict[str, Any]) -> None:
        nodes.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk(row[0][0]["Plan"])
    reads = [n for n in nodes if n.get("Relation Name") == "job_type_policies"]
    assert sum(n["Actual Loops"] for n in reads) == 1, reads
    assert job(pg, failed)["state"] == "FAILED", "rolled back"


# ---------------------------------------------------------------- the surfaces


def test_a_consumer_records_its_handlers_policies_when_it_starts(
    db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, pg
) -> None:
    # A row a deploy left behind for a type this consumer declares nothing for goes.
    pg.execute(
        "INSERT INTO job_type_policies (job_type, replay, updated_by) VALUES"
        " ('resize_image', false, 'an older consumer')"
    )
    env = service_env(db_url, amqp_url, topology)
    with running("consumer", ["--app", "tests.apps.policies"], env, "consumer.started") as c:
        rows = pg.execute(
            "SELECT job_type, replay, cancel_running, on_cancel, updated_by"
            " FROM job_type_policies ORDER BY job_type"
        ).fetchall()
        worker = pg.execute("SELECT worker_id FROM workers").fetchone()
    assert worker is not None
    assert rows == [
        ("capture_payment", False, False, "compensate", worker[0]),
        ("send_receipt", True, True, "none: a sent receipt stays sent", worker[0]),
    ]
    assert c.has_event("consumer.job_type_policy_recorded")


def _api_job(pg: psycopg.Connection, engine: Engine) -> tuple[uuid.UUID, uuid.UUID]:
    failed = enqueue(engine, "capture_payment", {})
    running_job = enqueue(engine, "capture_payment", {})
    finish(pg, [failed])
    run(pg, running_job)
    return failed, running_job


async def test_the_api_refuses_with_409_and_the_policy_and_shows_it_on_the_job(
    db_url: DatabaseUrl, engine: Engine, pg, policies
) -> None:
    failed, running_job = _api_job(pg, engine)
    async with api_client(db_url) as api:
        refused = await api.post(f"/v1/jobs/{failed}/retry")
        assert refused.status_code == 409, refused.text
        problem = refused.json()
        assert problem["state"] == "FAILED"
        assert problem["policy"]["replay"] is False
        assert problem["policy"]["on_cancel"] == "compensate"
        assert "does not allow replay" in problem["detail"]
        stopped = await api.post(f"/v1/jobs/{running_job}/cancel", json={"force": True})
        assert stopped.status_code == 409, stopped.text
        assert job(pg, running_job)["cancel_requested_at"] is None

        shown = (await api.get(f"/v1/jobs/{failed}")).json()
        assert shown["policy"]["job_type"] == "capture_payment"
        assert shown["policy"]["cancel_running"] is False

        bulk = await api.post("/v1/jobs/retry", json={"all": True})
        assert (bulk.json()["matched"], bulk.json()["not_allowed"]) == (0, 1)

        forced = await api.post(f"/v1/jobs/{failed}/retry", json={"override_policy": True})
        assert forced.status_code == 200, forced.text
    assert replays(pg, failed)[0][1] is True


def test_the_cli_exits_1_with_one_line_and_shows_what_the_type_allows(
    db_url: DatabaseUrl, engine: Engine, pg, policies, tmp_path: Path
) -> None:
    failed, running_job = _api_job(pg, engine)
    done = jobctl("jobs", "retry", str(failed), url=db_url, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    (line,) = done.stdout.strip().splitlines()
    assert line.startswith(f"{failed}: not retried: ") and "does not allow replay" in line
    assert job(pg, failed)["state"] == "FAILED"

    done = jobctl("jobs", "cancel", str(running_job), url=db_url, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "does not allow cancelling it while it runs" in done.stdout

    shown = jobctl("jobs", "show", str(failed), url=db_url, cwd=tmp_path).stdout
    assert "type allows  no retry, no cancel while running; on cancel: compensate" in shown

    done = jobctl(
        "jobs",
        "cancel",
        str(running_job),
        "--override-policy",
        "--by",
        "dana",
        url=db_url,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert job(pg, running_job)["cancel_override_by"] == "dana"


async def test_the_dashboard_offers_no_retry_for_a_type_that_forbids_it_and_says_why(
    db_url: DatabaseUrl, engine: Engine, pg, policies
) -> None:
    failed = enqueue(engine, "capture_payment", {})
    allowed = enqueue(engine, "send_receipt", {})
    finish(pg, [failed, allowed])
    async with dashboard_served(db_url, metrics=False) as served, chromium() as browser:
        page = await browser.new_page()
        await sign_in(page, served.base, then=f"/jobs/{failed}")
        await expect(page.get_by_test_id("retry-not-allowed")).to_be_disabled()
        await expect(page.get_by_test_id("retry")).to_have_count(0)
        await expect(page.get_by_test_id("type-policy")).to_contain_text("on cancel: compensate")
        await page.goto(f"{served.base}/jobs/{allowed}")
        await expect(page.get_by_test_id("retry")).to_be_enabled()
        await expect(page.get_by_test_id("retry-not-allowed")).to_have_count(0)
