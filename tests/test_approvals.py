"""Approvals (issue 19 item 3): a job enqueued with needs_approval waits, never
woken or claimed, until approved (then it runs) or rejected (CANCELLED, REJECTED)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from playwright.async_api import expect
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.consumers.testing import JobRunner
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema import queries as q
from tests.support.api import api_client
from tests.support.dashboard import CHROMIUM, chromium, dashboard_served, sign_in
from tests.support.jobs import attempts, enqueue, job
from tests.support.processes import jobctl, running

APP = ["--app", "tests.apps.basic"]
# The relay's backstops as often as they go: none may wake a job before approval.
EAGER_RELAY = ["--rewake-interval", "0.2"]


def _outbox_rows(pg: psycopg.Connection, job_id: uuid.UUID) -> int:
    row = pg.execute("SELECT count(*) FROM outbox WHERE job_id = %s", [job_id]).fetchone()
    assert row is not None
    return int(row[0])


def _explain(engine: Engine, job_id: uuid.UUID) -> outbox.Explanation:
    with Session(engine) as session:
        return outbox.explain(session, job_id)


def test_an_approval_waits_is_approved_through_the_api_and_runs(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    env: dict[str, str],
) -> None:
    with (
        running("relay", EAGER_RELAY, env, "relay.started"),
        running("consumer", APP, env, "consumer.started"),
    ):
        plain = enqueue(engine, "echo", {"plain": True})
        gated = enqueue(engine, "echo", {"gated": True}, needs_approval=True)
        assert outbox.wait_for(engine, plain, timeout=20).state == "SUCCEEDED"
        time.sleep(1.5)  # the relay's re-waker and orphan walk go round meanwhile
        row = job(pg, gated)
        assert (row["state"], row["attempt_count"], row["approval"]) == ("QUEUED", 0, "REQUIRED")
        assert _outbox_rows(pg, gated) == 0, "no wake-up before approval"
        why = _explain(engine, gated)
        assert why.codes == ["APPROVAL_REQUIRED"]
        assert why.approval == {"status": "REQUIRED", "by": None, "at": None}

        async def approve() -> tuple[int, int, dict[str, object]]:
            async with api_client(db_url) as client:
                answer = await client.post(f"/v1/jobs/{gated}/approve")
                again = await client.post(f"/v1/jobs/{gated}/approve")
                shown = await client.get(f"/v1/jobs/{gated}", params={"wait": 20})
                return answer.status_code, again.status_code, shown.json()

        first, second, shown = asyncio.run(approve())
        assert (first, second) == (200, 409), "approved once; the second is refused"
        assert shown["state"] == "SUCCEEDED"
        assert shown["result"] == {"gated": True}
        assert shown["approval"]["status"] == "APPROVED"
        assert shown["approval"]["by"].startswith("api (")
    row = job(pg, gated)
    assert row["approval_at"] is not None and row["approval_at"] <= row["started_at"]
    assert "approved by api" in _explain(engine, gated).summary


def test_a_rejected_job_never_runs(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    with (
        running("relay", EAGER_RELAY, env, "relay.started"),
        running("consumer", APP, env, "consumer.started"),
    ):
        gated = enqueue(engine, "echo", {}, needs_approval=True)
        with Session(engine) as session, session.begin():
            state = outbox.reject(session, gated, by="alice", reason="not on a Friday")
        assert state == "CANCELLED"
        done = outbox.wait_for(engine, gated, timeout=5)
        assert (done.state, done.last_error_code) == ("CANCELLED", "REJECTED")
        assert done.last_error_message == "not on a Friday"
        with (
            Session(engine) as session,
            session.begin(),
            pytest.raises(outbox.NotAwaitingApproval, match="rejected already, by alice"),
        ):
            outbox.approve(session, gated, by="bob")
        time.sleep(1.5)
        assert attempts(pg, gated) == []
    row = job(pg, gated)
    assert (row["state"], row["approval"], row["approval_by"]) == ("CANCELLED", "REJECTED", "alice")
    assert "rejected by alice" in _explain(engine, gated).summary


async def test_refusals_through_the_api_are_409_and_change_nothing(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    plain = enqueue(engine, "echo", {})
    gated = enqueue(engine, "echo", {}, needs_approval=True)
    rejected = enqueue(engine, "echo", {}, needs_approval=True)
    async with api_client(db_url) as client:
        made = await client.post("/v1/jobs", json={"job_type": "echo", "needs_approval": True})
        assert made.status_code == 202
        assert made.json()["approval"]["status"] == "REQUIRED"
        refused = await client.post(
            "/v1/jobs",
            json={"job_type": "echo", "needs_approval": True, "run_after": "2030-01-01T00:00:00Z"},
        )
        assert refused.status_code == 422
        answer = await client.post(f"/v1/jobs/{rejected}/reject", json={"reason": "no"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["state"] == "CANCELLED"
        before = job(pg, rejected)
        for path in (
            f"{plain}/approve",
            f"{plain}/reject",
            f"{rejected}/approve",
            f"{rejected}/reject",
        ):
            refusal = await client.post(f"/v1/jobs/{path}")
            assert refusal.status_code == 409, (path, refusal.text)
        assert job(pg, rejected) == before
        assert (await client.post(f"/v1/jobs/{uuid.uuid4()}/approve")).status_code == 404
        assert (await client.post(f"/v1/jobs/{gated}/approve")).status_code == 200
        assert (await client.post(f"/v1/jobs/{gated}/reject")).status_code == 409
        unauthorised = await client.post(
            f"/v1/jobs/{plain}/approve", headers={"Authorization": "Bearer wrong"}
        )
        assert unauthorised.status_code == 401
    assert job(pg, gated)["approval"] == "APPROVED"
    assert job(pg, plain)["approval"] is None


async def test_no_backstop_wakes_or_claims_an_unapproved_job(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    gated = enqueue(engine, "echo", {}, needs_approval=True)
    # A wake-up of it from before (a replay, say) that was sent and never taken up:
    # the re-waker must not count it lost, nor the claim take the job.
    pg.execute(
        "INSERT INTO outbox (job_id, queue, sent_at) VALUES (%s, 'default', now() - interval '1h')",
        [gated],
    )
    lost = pg.execute(q.OUTBOX_REWAKE_LOST, {"queues": ["default"], "grace_seconds": 0}).fetchall()
    assert lost == []
    pg.execute("DELETE FROM outbox WHERE job_id = %s", [gated])
    orphans = pg.execute(
        q.JOB_WAKE_ORPHANS,
        {"after": str(uuid.UUID(int=0)), "slice": 100, "grace_seconds": 0, "worker_ttl": 60},
    ).fetchall()
    assert [r for r in orphans if r[0] == "woken"] == []
    parked = pg.execute(
        q.JOB_WAKE_PARKED, {"queues": ["default"], "job_types": ["echo"], "tenants": []}
    ).fetchall()
    assert parked == []
    handed = pg.execute(q.OUTBOX_HAND_BACK, {"job_ids": [gated], "delay_seconds": 0}).fetchall()
    assert handed == []
    # A registry of its own: the default one is shared by every test module in the
    # process (the chaos app registers handlers of the same names).
    registry = Registry()

    @registry.handler("echo")
    async def echo(j: consumers.Job) -> object:
        return j.payload

    async with JobRunner(db_url, registry) as runner:
        assert await runner.run_until_idle(retries=True) == []
        assert job(pg, gated)["state"] == "QUEUED"
        with Session(engine) as session, session.begin():
            outbox.approve(session, gated, by="carol")
        ran = await runner.run_until_idle()
    assert [(r.job_id, r.state) for r in ran] == [(gated, "SUCCEEDED")]
    assert _outbox_rows(pg, gated) <= 1


def test_a_replayed_rejection_waits_for_approval_again(
    engine: Engine, pg: psycopg.Connection
) -> None:
    gated = enqueue(engine, "echo", {}, needs_approval=True)
    with Session(engine) as session, session.begin():
        outbox.reject(session, gated, by="alice")
    with Session(engine) as session, session.begin():
        assert outbox.retry_job(session, gated, by="alice") == "QUEUED"
    row = job(pg, gated)
    assert (row["state"], row["approval"], row["approval_by"]) == ("QUEUED", "REQUIRED", None)
    assert _outbox_rows(pg, gated) == 0
    assert _explain(engine, gated).codes == ["APPROVAL_REQUIRED"]


def test_enqueue_checks_needs_approval(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        with pytest.raises(ValueError, match="needs_approval takes no run_after"):
            outbox.enqueue(session, "echo", {}, needs_approval=True, run_after=timedelta(minutes=5))
        with pytest.raises(TypeError, match="needs_approval must be a bool"):
            outbox.enqueue(session, "echo", {}, needs_approval="yes")  # type: ignore[arg-type]
        ids = outbox.enqueue_many(
            session, [outbox.NewJob("echo", {}, needs_approval=True), outbox.NewJob("echo", {})]
        )
    assert len(ids) == 2


def test_jobctl_jobs_approve_and_reject(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    gated = enqueue(engine, "echo", {}, needs_approval=True)
    other = enqueue(engine, "echo", {}, needs_approval=True)
    done = jobctl("jobs", "approve", str(gated), "--by", "dora", url=db_url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{gated}: approved, QUEUED"
    again = jobctl("jobs", "approve", str(gated), url=db_url, cwd=tmp_path)
    assert again.returncode == 1 and "approved already, by dora" in again.stderr
    shown = jobctl("jobs", "show", str(gated), url=db_url, cwd=tmp_path)
    assert "APPROVED by dora" in shown.stdout
    rejected = jobctl(
        "jobs", "reject", str(other), "--reason", "too risky", "--json", url=db_url, cwd=tmp_path
    )
    assert rejected.returncode == 0, rejected.stderr
    assert json.loads(rejected.stdout)["job"]["state"] == "CANCELLED"
    row = job(pg, other)
    assert (row["last_error_code"], row["last_error_message"]) == ("REJECTED", "too risky")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")
async def test_the_dashboard_approves_and_rejects_with_csrf_guarded_buttons(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    gated = enqueue(engine, "echo", {}, needs_approval=True)
    other = enqueue(engine, "echo", {}, needs_approval=True)
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base, then=f"/jobs/{gated}")
        await expect(page.get_by_test_id("approval")).to_contain_text("APPROVAL_REQUIRED")
        await expect(
            page.locator("[data-testid=blocker][data-code=APPROVAL_REQUIRED]")
        ).to_have_count(1)
        # Without the CSRF token the same post is refused, and nothing changes.
        forged = await browser.request.post(
            f"{served.base}/jobs/{gated}/approve",
            headers={"Origin": served.base},
            form={},
            max_redirects=0,
        )
        assert forged.status == 403
        assert job(pg, gated)["approval"] == "REQUIRED"
        await page.get_by_test_id("approve").click()
        await expect(page.get_by_test_id("flash")).to_contain_text("Approved")
        await expect(page.get_by_test_id("approval")).to_contain_text("Approved by dashboard")
        await expect(page.get_by_test_id("approve")).to_have_count(0)
        await page.goto(f"{served.base}/jobs/{other}")
        await page.get_by_test_id("reject").click()
        await expect(page.get_by_test_id("flash")).to_contain_text("Rejected")
        await expect(page.locator("h1 [data-state]")).to_have_text("CANCELLED")
    assert job(pg, gated)["approval"] == "APPROVED"
    row = job(pg, other)
    assert (row["state"], row["approval"], row["last_error_code"]) == (
        "CANCELLED",
        "REJECTED",
        "REJECTED",
    )


def test_an_approval_and_a_rejection_at_once_one_wins(
    engine: Engine, pg: psycopg.Connection
) -> None:
    gated = enqueue(engine, "echo", {}, needs_approval=True)
    outcome: list[BaseException | str] = []

    def reject() -> None:
        try:
            with Session(engine) as session, session.begin():
                outcome.append(outbox.reject(session, gated, by="erin"))
        except outbox.NotAwaitingApproval as exc:
            outcome.append(exc)

    with Session(engine) as session, session.begin():
        outbox.approve(session, gated, by="frank")
        rival = threading.Thread(target=reject)
        rival.start()
        time.sleep(0.5)  # the rejection waits for the approval's row lock
        assert not outcome
    rival.join(10)
    (refused,) = outcome
    assert isinstance(refused, outbox.NotAwaitingApproval)
    assert refused.approval == "APPROVED" and refused.by == "frank"
    row = job(pg, gated)
    assert (row["state"], row["approval"], row["approval_by"]) == ("QUEUED", "APPROVED", "frank")
    assert _outbox_rows(pg, gated) == 1, "one wake-up, from the approval"


async def test_the_metrics_count_the_jobs_awaiting_approval(
    engine: Engine, db_url: DatabaseUrl
) -> None:
    from tests.support.metrics import scrape_once

    gated = [enqueue(engine, "echo", {}, needs_approval=True) for _ in range(3)]
    enqueue(engine, "echo", {})
    with Session(engine) as session, session.begin():
        outbox.reject(session, gated[0])
    scrape = await scrape_once(db_url, "test-metrics")
    assert scrape.value("hybrid_jobs_jobs_awaiting_approval", queue="default") == 2
    assert scrape.value("hybrid_jobs_jobs", queue="default", state="QUEUED") == 3


def test_jobctl_check_does_not_call_a_job_awaiting_approval_lost(
    engine: Engine, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    """A job held for a person's approval is held by design: `jobctl check` counts
    it apart and passes (it called it lost and exited 1)."""
    enqueue(engine, "echo", {}, needs_approval=True)
    done = jobctl("check", "--json", url=db_url, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert (report["lost"], report["awaiting_approval"]) == (0, 1), report
