"""Forced cancellation: ``request_cancel(force=True)`` reaches the worker holding the
lease at its next heartbeat, which interrupts an async handler (its ``finally`` runs)
and ends the lease CANCELLED through the fence, with what every end of a lease does.
A plain function cannot be interrupted in its thread: its lease ends CANCELLED when
it returns, and under ``consumer --processes`` its process is replaced past the
grace. All through real relay and consumer processes, and the operator surfaces."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.consumers.executor import FORCED_DISCARDED, INTERRUPTED
from hybrid_jobs.plumbing.config import DatabaseUrl
from tests.apps.forced import MARKS_TABLE
from tests.support.api import api_client
from tests.support.jobs import attempts, enqueue, job, until, versions, wait_for_state
from tests.support.processes import Daemon, jobctl, running

pytestmark = pytest.mark.timeout(240)

APP = ["--app", "tests.apps.forced", "--queue", "default", "--queue", "sync"]
# A heartbeat every half second: a forced cancel is seen within about that.
LEASE = ["--lease-seconds", "3", "--heartbeat-seconds", "0.5"]
RELAY = ["--sweep-interval", "0.5", "--rewake-interval", "3"]


@pytest.fixture
def marked(pg: psycopg.Connection) -> psycopg.Connection:
    pg.execute(MARKS_TABLE)
    return pg


def marks(pg: psycopg.Connection, job_id: uuid.UUID) -> list[str]:
    rows = pg.execute("SELECT what FROM marks WHERE job_id = %s ORDER BY at", [job_id])
    return [r[0] for r in rows.fetchall()]


def cancel(engine: Engine, job_id: uuid.UUID, *, force: bool = True) -> str | None:
    with Session(engine) as session, session.begin():
        return outbox.request_cancel(session, job_id, force=force)


def running_now(pg: psycopg.Connection, job_id: uuid.UUID) -> None:
    """Its handler has started (it marked so)."""
    asyncio.run(until(lambda: "started" in marks(pg, job_id), f"{job_id} to start", 60))


def ended(pg: psycopg.Connection, job_id: uuid.UUID, *states: str) -> dict[str, Any]:
    return asyncio.run(wait_for_state(pg, job_id, *states, timeout=60))


def test_a_forced_cancel_interrupts_an_async_handler_and_hands_its_key_on(
    engine: Engine, marked: psycopg.Connection, env: dict[str, str]
) -> None:
    """A handler stuck in ``await asyncio.sleep(3600)``, ignoring a cooperative
    cancel, is interrupted by a forced one: its ``finally`` runs, the job ends
    CANCELLED with one history row, its key and its tenant's slot are released, and
    the next job of its key runs. The consumer goes on running other jobs."""
    pg = marked
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_running=2)
    head = enqueue(engine, "stuck", {}, key="doc:1", tenant="acme")
    with (
        running("relay", RELAY, env, "relay.started"),
        running("consumer", [*APP, *LEASE], env, "consumer.started") as consumer,
    ):
        running_now(pg, head)
        behind = enqueue(engine, "stuck", {"seconds": 0}, key="doc:1", tenant="acme")
        asyncio.run(until(lambda: job(pg, behind)["delay_reason"] == "KEY_BUSY", "KEY_BUSY"))
        # cooperative first: the handler ignores it, the job stays where it is
        assert cancel(engine, head, force=False) == "CANCEL_REQUESTED"
        consumer.wait_for_event("consumer.cancel_requested")
        assert job(pg, head)["cancel_forced_at"] is None
        with Session(engine) as session:
            assert "forced" not in outbox.explain(session, head).summary
        # then with force: the earlier request is made forced
        assert cancel(engine, head) == "CANCEL_REQUESTED"
        row = job(pg, head)
        assert row["cancel_forced_at"] is not None and row["state"] == "CANCEL_REQUESTED"
        row = ended(pg, head, "CANCELLED", "SUCCEEDED", "FAILED")
        assert row["state"] == "CANCELLED"
        assert (row["result"], row["lease_owner"], row["holds_slot"]) == (None, None, False)
        assert marks(pg, head) == ["started", "finally"]
        (only,) = attempts(pg, head)
        assert (only["outcome"], only["error_message"]) == ("CANCELLED", INTERRUPTED)
        event = consumer.wait_for_event("consumer.cancel_forced")
        assert (event["job_id"], event["action"]) == (str(head), "interrupted")
        # the key went to the job behind it, which ran; the consumer runs on
        assert ended(pg, behind, "SUCCEEDED")["attempt_count"] == 1
        after = enqueue(engine, "stuck", {"seconds": 0})
        assert ended(pg, after, "SUCCEEDED", "CANCELLED")["state"] == "SUCCEEDED"
        assert pg.execute("SELECT count(*) FROM key_usage").fetchone() == (0,)
        usage = pg.execute("SELECT running FROM tenant_usage WHERE tenant = 'acme'").fetchone()
        assert usage in (None, (0,))
        assert consumer.proc.poll() is None


def test_a_forced_cancel_racing_the_handlers_own_success_ends_one_way_only(
    engine: Engine, marked: psycopg.Connection, env: dict[str, str]
) -> None:
    """Handlers that finish around the moment the forced cancel reaches them: each
    job ends SUCCEEDED (the outcome won: its result kept) or CANCELLED (the cancel
    won: no result), never both, with exactly one history row for its attempt."""
    pg = marked
    rng = random.Random(7)
    jobs = [enqueue(engine, "stuck", {"seconds": rng.uniform(0.2, 1.2)}) for _ in range(8)]
    with (
        running("relay", RELAY, env, "relay.started"),
        running("consumer", [*APP, *LEASE], env, "consumer.started"),
    ):
        for job_id in jobs:
            running_now(pg, job_id)
            time.sleep(rng.uniform(0, 0.6))
            assert cancel(engine, job_id) in ("CANCEL_REQUESTED", "SUCCEEDED")
        seen = {}
        for job_id in jobs:
            row = ended(pg, job_id, "SUCCEEDED", "CANCELLED", "FAILED", "RETRY_WAIT")
            (only,) = attempts(pg, job_id)
            assert only["outcome"] == row["state"], only
            if row["state"] == "SUCCEEDED":
                assert row["result"] == {"slept": True}
            else:
                assert (row["state"], row["result"]) == ("CANCELLED", None)
            seen[row["state"]] = seen.get(row["state"], 0) + 1
    assert set(seen) <= {"SUCCEEDED", "CANCELLED"}, seen


def test_a_stale_worker_cancelled_with_force_cannot_write_after_it_resumes(
    engine: Engine, marked: psycopg.Connection, env: dict[str, str]
) -> None:
    """A consumer frozen (SIGSTOP) past its lease while its job is cancelled with
    force: the sweeper ends the job CANCELLED; once the consumer resumes, its
    handler's end (and its heartbeat) are turned away by the fence, the row is
    untouched, and the history keeps the one row of the lost lease."""
    pg = marked
    job_id = enqueue(engine, "stuck", {"seconds": 2})
    with (
        running("relay", RELAY, env, "relay.started"),
        running("consumer", [*APP, *LEASE], env, "consumer.started") as frozen,
    ):
        running_now(pg, job_id)
        frozen.signal(signal.SIGSTOP)
        try:
            assert cancel(engine, job_id) == "CANCEL_REQUESTED"
            row = ended(pg, job_id, "CANCELLED")
            assert row["last_error_code"] == "LEASE_EXPIRED"
            before = versions(pg, [job_id])
        finally:
            frozen.signal(signal.SIGCONT)
        # its handler's sleep is over, its heartbeat due: whichever writes first is
        # turned away by the fence, and the worker says so
        turned_away = ("consumer.lease_lost", "consumer.stale_outcome")
        asyncio.run(
            until(
                lambda: any(
                    e.get("event") in turned_away and str(job_id) in json.dumps(e)
                    for e in frozen.events()
                ),
                "the resumed worker to find its lease gone",
            )
        )
        assert versions(pg, [job_id]) == before
        assert frozen.proc.poll() is None
    (only,) = attempts(pg, job_id)
    assert (only["outcome"], only["error_code"]) == ("CANCELLED", "LEASE_EXPIRED")


def test_a_plain_function_in_a_thread_ends_cancelled_when_it_returns(
    engine: Engine, marked: psycopg.Connection, env: dict[str, str]
) -> None:
    """A thread cannot be interrupted: a plain function cancelled with force runs to
    its end, and its lease then ends CANCELLED, its result discarded."""
    pg = marked
    job_id = enqueue(engine, "stuck_plain", {"seconds": 2}, queue="sync")
    with (
        running("relay", RELAY, env, "relay.started"),
        running("consumer", [*APP, *LEASE], env, "consumer.started") as consumer,
    ):
        running_now(pg, job_id)
        assert cancel(engine, job_id) == "CANCEL_REQUESTED"
        event = consumer.wait_for_event("consumer.cancel_forced")
        assert event["action"] == "its lease ends CANCELLED when it returns"
        row = ended(pg, job_id, "CANCELLED", "SUCCEEDED")
        assert (row["state"], row["result"]) == ("CANCELLED", None)
        assert marks(pg, job_id) == ["started", "returned"]
        (only,) = attempts(pg, job_id)
        assert (only["outcome"], only["error_message"]) == ("CANCELLED", FORCED_DISCARDED)


def test_under_a_supervisor_a_plain_function_ignoring_a_forced_cancel_has_its_process_replaced(
    engine: Engine, marked: psycopg.Connection, env: dict[str, str]
) -> None:
    """``consumer --processes``: a plain function that ignores a forced cancel past
    ``--force-cancel-grace`` has its worker process replaced. Its job ends CANCELLED
    with one history row; the process's other jobs are not lost: an async handler's
    claim is given back (QUEUED, its attempt refunded) and a plain function still on
    its thread is left to its lease, which the sweeper ends (an attempt spent); both
    run again on the fresh process and succeed."""
    pg = marked
    # one worker process (a limit puts even one under a supervisor), so that every
    # job runs in the process that is replaced
    supervised = ["--processes", "1", "--max-jobs-per-process", "100"]
    args = [*APP, *LEASE, *supervised, "--concurrency", "4", "--force-cancel-grace", "1"]
    stuck = enqueue(engine, "stuck_plain", {}, queue="sync")
    waiting_async = enqueue(engine, "patient", {"seconds": 3600})
    waiting_plain = enqueue(engine, "patient_plain", {"seconds": 3600}, queue="sync")
    with (
        running("relay", RELAY, env, "relay.started"),
        running("consumer", args, env, "consumer.supervisor_started") as supervisor,
    ):
        for job_id in (stuck, waiting_async, waiting_plain):
            running_now(pg, job_id)
        (first,) = {e["pid"] for e in supervisor.events() if e["event"] == "consumer.started"}
        assert cancel(engine, stuck) == "CANCEL_REQUESTED"
        row = ended(pg, stuck, "CANCELLED", "SUCCEEDED")
        assert (row["state"], row["result"]) == ("CANCELLED", None)
        (only,) = attempts(pg, stuck)
        assert (only["outcome"], only["error_message"]) == ("CANCELLED", INTERRUPTED)
        assert marks(pg, stuck) == ["started"]  # it never returned: its process went
        exited = _event(supervisor, "consumer.process_exited", first)
        assert exited["status"] == "exit 0"
        replacing = _event(supervisor, "consumer.replacing_process", first)
        assert replacing["job_id"] == str(stuck)
        assert ended(pg, waiting_async, "SUCCEEDED")["attempt_count"] == 1
        assert [a["outcome"] for a in attempts(pg, waiting_async)] == ["QUEUED", "SUCCEEDED"]
        assert ended(pg, waiting_plain, "SUCCEEDED")["attempt_count"] == 2
        history = [(a["outcome"], a["error_code"]) for a in attempts(pg, waiting_plain)]
        assert history == [("RETRY_WAIT", "LEASE_EXPIRED"), ("SUCCEEDED", None)]
        fresh = {e["pid"] for e in supervisor.events() if e["event"] == "consumer.started"}
        assert len(fresh - {first}) == 1
        assert _event(supervisor, "consumer.process_crashed", None, required=False) is None, (
            "the replacement is no crash"
        )


def _event(
    daemon: Daemon, name: str, pid: int | None, *, required: bool = True
) -> dict[str, Any] | None:
    """The first ``name`` event (of process ``pid``, if given), waited for."""
    deadline = time.monotonic() + (60 if required else 0)
    while True:
        for e in daemon.events():
            if e.get("event") == name and (pid is None or e.get("pid") == pid):
                return e
        if time.monotonic() > deadline:
            if required:
                raise AssertionError(f"no {name} of {pid}:\n{daemon.text()[-4000:]}")
            return None
        time.sleep(0.05)


def _running(engine: Engine, pg: psycopg.Connection, n: int) -> list[uuid.UUID]:
    """Jobs held by a worker that is not there: RUNNING on a long lease."""
    ids = [enqueue(engine, "t", {}) for _ in range(n)]
    pg.execute(
        "UPDATE jobs SET state = 'RUNNING', lease_owner = 'w', lease_generation = 1,"
        " attempt_count = 1, started_at = now(), lease_expires_at = now() + interval '1 hour'"
        " WHERE job_id = ANY(%s)",
        [ids],
    )
    return ids


def test_jobctl_cancel_force_records_it_and_jobs_show_says_so(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, tmp_path: Any
) -> None:
    """`jobctl jobs cancel --force` records the force on a running job and `jobctl
    jobs show` says "cancel requested (forced)"; a waiting job is cancelled at once,
    with nothing to force; repeating the forced request changes nothing."""
    (running_id,) = _running(engine, pg, 1)
    waiting = enqueue(engine, "t", {})
    done = jobctl(
        "jobs", "cancel", "--force", str(running_id), str(waiting), url=db_url, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert f"{running_id}: CANCEL_REQUESTED (forced)" in done.stdout
    assert f"{waiting}: CANCELLED" in done.stdout
    forced_at = job(pg, running_id)["cancel_forced_at"]
    assert forced_at is not None
    assert job(pg, waiting)["cancel_forced_at"] is None
    shown = jobctl("jobs", "show", str(running_id), url=db_url, cwd=tmp_path)
    assert "cancel requested (forced)" in shown.stdout, shown.stdout
    again = jobctl("jobs", "cancel", "--force", "--json", str(running_id), url=db_url, cwd=tmp_path)
    assert json.loads(again.stdout)["forced"] is True
    assert job(pg, running_id)["cancel_forced_at"] == forced_at


async def test_the_api_cancels_with_force_and_its_job_document_says_so(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """POST /v1/jobs/{id}/cancel with {"force": true} makes an earlier cooperative
    request forced; the job document carries cancel_forced_at and explain's
    "cancel requested (forced)"; a force that is not a boolean is refused (422)."""
    (job_id,) = _running(engine, pg, 1)
    async with api_client(db_url) as api:
        plain = await api.post(f"/v1/jobs/{job_id}/cancel")
        assert plain.status_code == 200, plain.text
        assert job(pg, job_id)["cancel_forced_at"] is None
        document = (await api.get(f"/v1/jobs/{job_id}")).json()
        assert "forced" not in document["why"]["summary"]
        forced = await api.post(f"/v1/jobs/{job_id}/cancel", json={"force": True})
        assert (forced.status_code, forced.json()["state"]) == (200, "CANCEL_REQUESTED")
        assert job(pg, job_id)["cancel_forced_at"] is not None
        document = (await api.get(f"/v1/jobs/{job_id}")).json()
        assert document["cancel_forced_at"] is not None
        assert "cancel requested (forced)" in document["why"]["summary"]
        assert document["why"]["blockers"][0]["facts"]["forced"] is True
        wrong = await api.post(f"/v1/jobs/{job_id}/cancel", json={"force": "very"})
        assert wrong.status_code == 422
