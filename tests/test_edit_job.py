"""Editing a job that has not started yet (outbox.update_job): only what is given
changes, a started or finished job is refused, arguments are checked as enqueue
checks them, the wake-up follows a new start so the job runs then (not earlier, not
never), and an edit racing a claim loses or wins whole."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.async_api import expect
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from harness.claim import claim_params
from hybrid_jobs import outbox
from hybrid_jobs.schema import queries as q
from tests.support.api import api_client
from tests.support.dashboard import CHROMIUM, chromium, dashboard_served, sign_in
from tests.support.jobs import enqueue, job, versions
from tests.support.processes import jobctl, running

APP = ["--app", "tests.apps.basic"]
# The dashboard test's picture of the edit form goes to docs/screenshots/ when asked
# as tests/test_screenshots.py is asked (JOBCTL_SCREENSHOTS=1), else nowhere kept.
SCREENSHOTS = os.environ.get("JOBCTL_SCREENSHOTS", "")
DOCS_SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "screenshots" / "job-edit.png"


def _edit(engine: Engine, job_id: uuid.UUID, **fields: Any) -> datetime:
    with Session(engine) as session, session.begin():
        return outbox.update_job(session, job_id, **fields)


def _wakeups(pg: psycopg.Connection, job_id: uuid.UUID) -> list[tuple[Any, ...]]:
    return pg.execute(
        "SELECT priority, available_at, sent_at FROM outbox WHERE job_id = %s ORDER BY id",
        [job_id],
    ).fetchall()


def _claim(conn: psycopg.Connection, job_id: uuid.UUID) -> list[tuple[Any, ...]]:
    """The consumer's claim of ``job_id`` (a "noop" job), its claimed rows."""
    rows = conn.execute(q.job_claim_many(), claim_params([job_id], "w1")).fetchall()
    return [row for row in rows if row[0] == "claimed"]


def test_an_edit_changes_only_the_fields_given(engine: Engine, pg: psycopg.Connection) -> None:
    job_id = enqueue(engine, "echo", {"n": 1}, priority=1, run_after=timedelta(hours=1))
    before = job(pg, job_id)
    _edit(engine, job_id, priority=7)
    after = job(pg, job_id)
    assert after["priority"] == 7
    assert (after["payload"], after["run_after"], after["max_attempts"]) == (
        {"n": 1},
        before["run_after"],
        None,
    )
    assert after["updated_at"] > before["updated_at"]
    assert [w[0] for w in _wakeups(pg, job_id)] == [7], "its pending wake-up's priority moved"

    _edit(engine, job_id, payload=None, max_attempts=3)
    after = job(pg, job_id)
    assert (after["payload"], after["max_attempts"], after["priority"]) == (None, 3, 7)

    when = datetime.now(UTC) + timedelta(days=2)
    assert _edit(engine, job_id, run_after=when) == when
    assert job(pg, job_id)["run_after"] == when
    assert [(w[1], w[2]) for w in _wakeups(pg, job_id)] == [(when, None)]


async def test_the_async_twin_edits_through_an_async_session(
    async_engine: AsyncEngine, engine: Engine, pg: psycopg.Connection
) -> None:
    job_id = enqueue(engine, "echo", {}, run_after=timedelta(hours=1))
    async with AsyncSession(async_engine) as session, session.begin():
        start = await outbox.update_job_async(session, job_id, run_after=timedelta(minutes=5))
    row = job(pg, job_id)
    assert row["run_after"] == start
    assert timedelta(minutes=4) < start - datetime.now(UTC) <= timedelta(minutes=5)


def test_an_edit_that_rolls_back_changes_nothing(engine: Engine, pg: psycopg.Connection) -> None:
    job_id = enqueue(engine, "echo", {"n": 1}, run_after=timedelta(hours=1))
    before = job(pg, job_id), _wakeups(pg, job_id)
    with Session(engine) as session:
        outbox.update_job(session, job_id, payload={"n": 2}, run_after=timedelta(seconds=1))
        session.rollback()
    assert (job(pg, job_id), _wakeups(pg, job_id)) == before


def test_a_started_or_finished_job_is_refused_and_left_as_it_was(
    engine: Engine, pg: psycopg.Connection
) -> None:
    running_id = enqueue(engine, "noop", {})
    assert len(_claim(pg, running_id)) == 1
    asked = enqueue(engine, "noop", {})
    assert len(_claim(pg, asked)) == 1
    with Session(engine) as session, session.begin():
        assert outbox.request_cancel(session, asked) == "CANCEL_REQUESTED"
    cancelled = enqueue(engine, "noop", {})
    with Session(engine) as session, session.begin():
        outbox.request_cancel(session, cancelled)
    ids = [running_id, asked, cancelled]
    before = versions(pg, ids)
    for job_id, state, said in (
        (running_id, "RUNNING", r"it has started \(it is RUNNING\)"),
        (asked, "CANCEL_REQUESTED", "it has started"),
        (cancelled, "CANCELLED", r"it has ended \(CANCELLED\)"),
    ):
        with pytest.raises(outbox.JobNotEditable, match=said) as refused:
            _edit(engine, job_id, priority=5)
        assert refused.value.state == state
    assert versions(pg, ids) == before
    with pytest.raises(outbox.JobNotFound):
        _edit(engine, uuid.uuid4(), priority=5)


def test_an_edit_is_checked_as_enqueue_checks_and_writes_nothing_when_refused(
    engine: Engine, pg: psycopg.Connection
) -> None:
    job_id = enqueue(engine, "echo", {}, expires=timedelta(hours=1), run_after=timedelta(minutes=1))
    before = versions(pg, [job_id])
    for fields, error, said in (
        ({}, ValueError, "nothing to edit"),
        ({"payload": "x" * 300_000}, ValueError, "payload is .* bytes as JSON"),
        ({"payload": {1: "a"}}, TypeError, "payload has a key that is not a string"),
        ({"payload": {"when": datetime.now(UTC)}}, TypeError, "not JSON-serialisable"),
        ({"priority": 40_000}, ValueError, "priority must fit in a smallint"),
        ({"priority": "high"}, TypeError, "priority must be an int"),
        ({"max_attempts": 0}, ValueError, "max_attempts must be between 1 and"),
        ({"run_after": datetime(2030, 1, 1)}, ValueError, "must be timezone-aware"),
        ({"run_after": None}, TypeError, "run_after must be a datetime or a timedelta"),
        ({"run_after": timedelta(hours=2)}, ValueError, "run_after is not before expires"),
    ):
        with pytest.raises(error, match=said):
            _edit(engine, job_id, **fields)
    assert versions(pg, [job_id]) == before
    # json_default makes JSON of what JSON cannot hold, as enqueue's does.
    _edit(engine, job_id, payload={"id": uuid.UUID(int=1)}, json_default=str)
    assert job(pg, job_id)["payload"] == {"id": str(uuid.UUID(int=1))}


def test_max_attempts_must_leave_an_attempt_to_a_job_that_has_made_some(
    engine: Engine, pg: psycopg.Connection
) -> None:
    job_id = enqueue(engine, "echo", {}, max_attempts=5)
    pg.execute(
        "UPDATE jobs SET state = 'RETRY_WAIT', attempt_count = 2, run_after = now() + '1h'"
        " WHERE job_id = %s",
        [job_id],
    )
    with pytest.raises(ValueError, match=r"max_attempts \(2\) must be more than the 2 attempts"):
        _edit(engine, job_id, max_attempts=2)
    _edit(engine, job_id, max_attempts=3, run_after=timedelta(0))
    row = job(pg, job_id)
    assert (row["state"], row["max_attempts"]) == ("RETRY_WAIT", 3)


def test_a_job_held_for_approval_or_parents_is_edited_but_keeps_its_hold(
    engine: Engine, pg: psycopg.Connection
) -> None:
    gated = enqueue(engine, "echo", {"v": 1}, needs_approval=True)
    parent = enqueue(engine, "echo", {}, run_after=timedelta(hours=1))
    child = enqueue(engine, "echo", {}, after=[parent])
    for held, why in ((gated, "waits for approval"), (child, "waits for its parents")):
        _edit(engine, held, payload={"v": 2}, priority=3)
        before = versions(pg, [held])
        with pytest.raises(outbox.JobNotEditable, match=why) as refused:
            _edit(engine, held, run_after=timedelta(seconds=1))
        assert refused.value.state == "QUEUED"
        assert versions(pg, [held]) == before
        row = job(pg, held)
        assert (row["payload"], row["priority"], row["run_after"].year) == ({"v": 2}, 3, 9999)
        assert _wakeups(pg, held) == [], "still held: no wake-up"


def test_a_moved_job_runs_at_its_new_time_not_before_and_not_never(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    sooner = enqueue(engine, "echo", {"job": "sooner"}, run_after=timedelta(hours=1))
    with running("relay", ["--rewake-interval", "0.2"], env, "relay.started"):
        later = enqueue(engine, "echo", {"job": "later"})
        # Its wake-up goes to RabbitMQ with no consumer yet to take it.
        deadline = time.monotonic() + 20
        while not [w for w in _wakeups(pg, later) if w[2] is not None]:
            assert time.monotonic() < deadline, "the relay never sent the wake-up"
            time.sleep(0.05)
        moved_to = _edit(engine, later, run_after=timedelta(seconds=3))
        brought_to = _edit(engine, sooner, run_after=timedelta(seconds=1))
        assert [(w[1], w[2]) for w in _wakeups(pg, later)] == [(moved_to, None)]
        with running("consumer", APP, env, "consumer.started"):
            for job_id, start in ((sooner, brought_to), (later, moved_to)):
                done = outbox.wait_for(engine, job_id, timeout=30)
                assert done.state == "SUCCEEDED"
                row = job(pg, job_id)
                assert row["started_at"] >= start, "it started before its new run_after"
                assert row["attempt_count"] == 1


def test_an_edit_waits_for_a_claim_that_holds_the_job_and_is_refused(
    engine: Engine, pg: psycopg.Connection, db_url: Any
) -> None:
    job_id = enqueue(engine, "noop", {"v": "old"})
    outcome: list[BaseException | datetime] = []

    def edit() -> None:
        try:
            outcome.append(_edit(engine, job_id, payload={"v": "new"}, max_attempts=9))
        except outbox.JobNotEditable as exc:
            outcome.append(exc)

    with psycopg.connect(db_url.conninfo) as claimer:
        (claimed,) = _claim(claimer, job_id)
        rival = threading.Thread(target=edit)
        rival.start()
        time.sleep(0.5)  # the edit waits for the claim's row lock
        assert not outcome
        claimer.commit()
    rival.join(10)
    (refused,) = outcome
    assert isinstance(refused, outbox.JobNotEditable)
    assert refused.state == "RUNNING"
    row = job(pg, job_id)
    assert (row["payload"], row["max_attempts"]) == ({"v": "old"}, 3)
    assert claimed[5] == {"v": "old"}, "the claim read the old payload"


def test_a_claim_racing_an_uncommitted_edit_skips_the_job_then_reads_it_edited_whole(
    engine: Engine, pg: psycopg.Connection
) -> None:
    job_id = enqueue(engine, "noop", {"v": "old"})
    with Session(engine) as session, session.begin():
        outbox.update_job(session, job_id, payload={"v": "new"}, max_attempts=2)
        assert _claim(pg, job_id) == [], "the claim skips the row the edit holds"
    (claimed,) = _claim(pg, job_id)
    assert (claimed[5], claimed[7]) == ({"v": "new"}, 2), "new payload and budget together"


async def test_the_api_edits_a_waiting_job_and_refuses_a_started_one_with_a_problem(
    engine: Engine, pg: psycopg.Connection, db_url: Any
) -> None:
    waiting = enqueue(engine, "echo", {"v": 1}, run_after=timedelta(hours=1))
    started = enqueue(engine, "noop", {})
    assert len(_claim(pg, started)) == 1
    deadline = enqueue(engine, "echo", {}, expires=timedelta(hours=1))
    when = "2031-01-02T03:04:05+00:00"
    change = {"payload": None, "priority": 9, "run_after": when, "max_attempts": 4}
    async with api_client(db_url) as client:
        answer = await client.patch(f"/v1/jobs/{waiting}", json=change)
        assert answer.status_code == 200, answer.text
        shown = answer.json()
        assert (shown["payload"], shown["priority"], shown["max_attempts"]) == (None, 9, 4)
        assert datetime.fromisoformat(shown["run_after"]) == datetime.fromisoformat(when)
        # Absolute values: the same request again sets the same values.
        again = await client.patch(f"/v1/jobs/{waiting}", json=change)
        assert (again.status_code, again.json()["priority"]) == (200, 9)
        before = versions(pg, [started])
        refused = await client.patch(f"/v1/jobs/{started}", json={"priority": 1})
        assert refused.status_code == 409
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["state"] == "RUNNING"
        assert "it has started" in refused.json()["detail"]
        assert versions(pg, [started]) == before
        late = await client.patch(
            f"/v1/jobs/{deadline}", json={"run_after": "2031-01-01T00:00:00Z"}
        )
        assert late.status_code == 422
        assert late.json()["errors"][0]["field"] == "body.run_after"
        empty = await client.patch(f"/v1/jobs/{waiting}", json={})
        assert empty.status_code == 422 and "nothing to edit" in empty.text
        unknown = await client.patch(f"/v1/jobs/{uuid.uuid4()}", json={"priority": 1})
        assert unknown.status_code == 404
        wrong = await client.patch(
            f"/v1/jobs/{waiting}", json={"priority": 1}, headers={"Authorization": "Bearer no"}
        )
        assert wrong.status_code == 401
    row = job(pg, waiting)
    assert (row["priority"], row["run_after"].isoformat()) == (9, when)
    assert [(w[0], w[1].isoformat()) for w in _wakeups(pg, waiting)] == [(9, when)]


def test_jobctl_jobs_edit_changes_a_waiting_job_and_exits_1_for_a_started_one(
    engine: Engine, pg: psycopg.Connection, db_url: Any, tmp_path: Path
) -> None:
    waiting = enqueue(engine, "echo", {"v": 1}, run_after=timedelta(hours=1))
    (tmp_path / "payload.json").write_text('{"v": 2}')
    done = jobctl(
        "jobs", "edit", str(waiting), "--priority", "5", "--run-after", "10m",
        "--max-attempts", "2", "--payload", "@payload.json", url=db_url, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{waiting}: edited, QUEUED, priority 5, run after ")
    row = job(pg, waiting)
    assert (row["payload"], row["priority"], row["max_attempts"]) == ({"v": 2}, 5, 2)
    assert timedelta(minutes=9) < row["run_after"] - datetime.now(UTC) <= timedelta(minutes=10)
    shown = jobctl(
        "jobs", "edit", str(waiting), "--payload", "[1, 2]", "--json", url=db_url, cwd=tmp_path
    )
    assert json.loads(shown.stdout)["job"]["payload"] == [1, 2]
    started = enqueue(engine, "noop", {})
    assert len(_claim(pg, started)) == 1
    refused = jobctl("jobs", "edit", str(started), "--priority", "1", url=db_url, cwd=tmp_path)
    assert refused.returncode == 1 and "it has started (it is RUNNING)" in refused.stderr
    nothing = jobctl("jobs", "edit", str(waiting), url=db_url, cwd=tmp_path)
    assert nothing.returncode == 2 and "say what to change" in nothing.stderr
    bad = jobctl("jobs", "edit", str(waiting), "--run-after", "soon", url=db_url, cwd=tmp_path)
    assert bad.returncode == 2 and "--run-after soon" in bad.stderr


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")
async def test_the_dashboard_edits_a_waiting_job_with_a_csrf_guarded_form(
    engine: Engine, pg: psycopg.Connection, db_url: Any, tmp_path: Path
) -> None:
    waiting = enqueue(
        engine, "send_receipt", {"order": 42}, priority=1, run_after=timedelta(hours=1)
    )
    started = enqueue(engine, "noop", {})
    assert len(_claim(pg, started)) == 1
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base, then=f"/jobs/{started}")
        await expect(page.locator("h1 [data-state]")).to_have_text("RUNNING")
        await expect(page.get_by_test_id("edit")).to_have_count(0)
        # Without the CSRF token the same post is refused, and nothing changes.
        forged = await browser.request.post(
            f"{served.base}/jobs/{waiting}/edit",
            headers={"Origin": served.base},
            form={"priority": "99"},
            max_redirects=0,
        )
        assert forged.status == 403
        assert job(pg, waiting)["priority"] == 1
        await page.goto(f"{served.base}/jobs/{waiting}")
        await page.get_by_test_id("edit").locator("summary").click()
        await page.get_by_test_id("edit-priority").fill("7")
        await page.get_by_test_id("edit-run-after").fill("2031-05-06T07:08:09")
        await page.get_by_test_id("edit-payload").fill('{"order": 43}')
        wanted = SCREENSHOTS.lower() in ("1", "yes", "true")
        shot = DOCS_SCREENSHOT if wanted else tmp_path / "job-edit.png"
        # the viewport, tall enough for the whole page: a full-page picture draws the
        # fixed top bar where the page was scrolled to
        await page.set_viewport_size({"width": 1440, "height": 1100})
        await page.evaluate("window.scrollTo(0, 0)")
        await page.screenshot(path=str(shot))
        await page.get_by_test_id("edit-save").click()
        await expect(page.get_by_test_id("flash")).to_contain_text(
            "Edited: payload, priority, run_after."
        )
        await expect(page.get_by_test_id("payload")).to_contain_text('"order": 43')
    row = job(pg, waiting)
    assert (row["payload"], row["priority"], row["max_attempts"]) == ({"order": 43}, 7, None)
    assert row["run_after"] == datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    assert [(w[0], w[1]) for w in _wakeups(pg, waiting)] == [(7, row["run_after"])]
