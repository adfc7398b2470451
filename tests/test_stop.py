"""Stopping real `relay` and `consumer` processes: a graceful stop records every
outcome its handlers produced, never runs a plain-function job twice at once, and one
Ctrl-C means one graceful stop; a second signal always ends the process soon."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

import psycopg
import pytest
from sqlalchemy import Engine

from hybrid_jobs.plumbing.config import DatabaseUrl
from tests.support.jobs import attempts, enqueue, job, wait_for_state
from tests.support.processes import Daemon, running

pytestmark = pytest.mark.timeout(180)

APP = ["--app", "tests.apps.basic"]


def test_a_graceful_stop_records_the_outcome_of_a_job_that_ends_in_the_drain(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    """SIGTERM while a 1 s job runs: the job ends in the drain and its outcome is
    recorded before the process exits (it used to be cancelled mid-write, leaving the
    job RUNNING until its lease ran out). Async and plain handlers alike."""
    args = [*APP, "--drain-seconds", "10", "--lease-seconds", "300"]
    with running("relay", [], env, "relay.started"):
        for job_type in ["sleep", "sleep", "sleep", "sync_sleep", "sync_sleep"]:
            queue = "sync" if job_type == "sync_sleep" else "default"
            with running("consumer", args, env, "consumer.started") as consumer:
                job_id = enqueue(engine, job_type, {"seconds": 1}, queue=queue)
                asyncio.run(wait_for_state(pg, job_id, "RUNNING"))
                consumer.signal(signal.SIGTERM)
                assert consumer.proc.wait(30) == 0
            row = job(pg, job_id)
            assert row["state"] == "SUCCEEDED", (row, consumer.text()[-3000:])
            assert [a["outcome"] for a in attempts(pg, job_id)] == ["SUCCEEDED"]
            assert not consumer.has_event("consumer.outcomes_unrecorded")


SPANS = (
    "CREATE TABLE spans (job_id uuid, generation int, pid int,"
    " started_at timestamptz DEFAULT clock_timestamp(), ended_at timestamptz)"
)


def spans(pg: psycopg.Connection, job_id: object) -> list[tuple[int, object, object]]:
    return pg.execute(
        "SELECT generation, started_at, ended_at FROM spans WHERE job_id = %s ORDER BY started_at",
        [job_id],
    ).fetchall()


async def until_span(pg: psycopg.Connection, job_id: object, generation: int) -> None:
    for _ in range(600):
        if any(g == generation for g, _, _ in spans(pg, job_id)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"generation {generation} of {job_id} never started")


def test_a_stop_never_runs_a_plain_function_job_twice_at_once(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    """The drain runs out while a plain handler's thread still runs: the claim is
    not given back (the thread cannot be stopped); its lease is kept alive until the
    function returns, its outcome is recorded, and a second consumer never starts the
    job meanwhile."""
    pg.execute(SPANS)
    with running("relay", [], env, "relay.started"):
        first = Daemon("consumer", [*APP, "--drain-seconds", "1", "--lease-seconds", "3"], env)
        try:
            first.wait_for_event("consumer.started")
            job_id = enqueue(engine, "span", {"seconds": 8}, queue="sync")
            asyncio.run(until_span(pg, job_id, 1))
            with running("consumer", APP, env, "consumer.started"):
                first.signal(signal.SIGTERM)
                assert first.proc.wait(60) == 0
                row = asyncio.run(wait_for_state(pg, job_id, "SUCCEEDED", timeout=30))
        finally:
            if first.proc.poll() is None:
                first.kill()
    runs = spans(pg, job_id)
    assert [g for g, _, _ in runs] == [1], runs
    assert runs[0][2] is not None, "the first thread ran to its end"
    assert row["lease_generation"] == 1 and row["attempt_count"] == 1
    assert [a["outcome"] for a in attempts(pg, job_id)] == ["SUCCEEDED"]
    (waited,) = [e for e in first.events() if e["event"] == "consumer.waiting_for_threads"]
    assert waited["jobs"] == {str(job_id): 900.0}
    assert not first.has_event("consumer.gave_back")


def test_a_plain_function_past_its_limit_at_a_stop_is_left_to_lapse(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    """The stop waits for a plain handler only up to its time limit; then its lease
    is left to lapse and the process exits without waiting for the thread (which dies
    with it), so the job's next attempt never overlaps this one."""
    pg.execute(SPANS)
    args = [*APP, "--drain-seconds", "0.5", "--lease-seconds", "3"]
    with running("relay", ["--sweep-interval", "0.2"], env, "relay.started"):
        with running("consumer", args, env, "consumer.started") as first:
            job_id = enqueue(engine, "span_limited", {"seconds": 8}, queue="sync")
            asyncio.run(until_span(pg, job_id, 1))
            first.signal(signal.SIGTERM)
            assert first.proc.wait(60) == 0
        exited_at = pg.execute("SELECT clock_timestamp()").fetchone()[0]
        assert spans(pg, job_id)[0][2] is None, "the process did not wait for the thread"
        assert first.has_event("consumer.thread_abandoned")
        assert first.has_event("consumer.threads_abandoned")
        assert not first.has_event("consumer.gave_back")
        pg.execute("UPDATE jobs SET payload = '{\"seconds\": 0}' WHERE job_id = %s", [job_id])
        with running("consumer", APP, env, "consumer.started"):
            asyncio.run(wait_for_state(pg, job_id, "SUCCEEDED", timeout=60))
    (one, two) = spans(pg, job_id)
    assert (one[0], two[0]) == (1, 2)
    assert two[1] > exited_at, "the next attempt began after the first process was gone"
    history = [(a["lease_generation"], a["outcome"], a["error_code"]) for a in attempts(pg, job_id)]
    assert history == [(1, "RETRY_WAIT", "LEASE_EXPIRED"), (2, "SUCCEEDED", None)]


def test_sigint_and_sigterm_together_are_one_graceful_stop(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    """What a terminal's Ctrl-C plus a script's forwarded SIGTERM deliver: one stop,
    with the drain, not "stop now"."""
    args = [*APP, "--drain-seconds", "10"]
    with (
        running("relay", [], env, "relay.started"),
        running("consumer", args, env, "consumer.started") as c,
    ):
        job_id = enqueue(engine, "sleep", {"seconds": 2})
        asyncio.run(wait_for_state(pg, job_id, "RUNNING"))
        c.signal(signal.SIGINT)
        time.sleep(0.01)  # two deliveries, not one pending signal
        c.signal(signal.SIGTERM)
        assert c.proc.wait(30) == 0
    assert job(pg, job_id)["state"] == "SUCCEEDED"
    assert [a["outcome"] for a in attempts(pg, job_id)] == ["SUCCEEDED"]
    actions = [e["action"] for e in c.events() if e["event"] == "consumer.signal"]
    assert actions == ["stopping", "already stopping"]


@pytest.mark.parametrize("command", ["relay", "consumer"])
def test_two_signals_right_after_start_end_the_daemon(
    command: str,
    env: dict[str, str],
) -> None:
    """Stop, then stop now, as soon as the daemon is up: it exits every time
    (the relay used to hang for ever about one time in three: the cancel reached
    psycopg_pool's maintenance task while it opened a connection, which swallows
    the cancellation, so the event loop never closed)."""
    args = APP if command == "consumer" else []
    for attempt in range(6):
        daemon = Daemon(command, args, env)
        try:
            daemon.wait_for_event(f"{command}.started")
            daemon.signal(signal.SIGTERM)
            time.sleep(0.005 * (attempt + 1))  # two deliveries, not one pending signal
            daemon.signal(signal.SIGTERM)
            code = daemon.proc.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{command} still runs:\n{daemon.text()[-3000:]}") from None
        finally:
            if daemon.proc.poll() is None:
                daemon.kill()
        assert code in (0, 1), daemon.text()[-3000:]
        # on its own, not by the watchdog that ends a process stuck on its way out
        assert not daemon.has_event(f"{command}.exit_forced"), daemon.text()[-3000:]


def test_a_second_signal_ends_a_consumer_whose_handler_ignores_cancellation(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    """Stop now while an async handler swallows every cancellation: the process
    exits a few seconds later anyway, naming what would not stop."""
    with running("relay", [], env, "relay.started"):
        consumer = Daemon("consumer", [*APP, "--drain-seconds", "30"], env)
        try:
            consumer.wait_for_event("consumer.started")
            job_id = enqueue(engine, "stubborn")
            asyncio.run(wait_for_state(pg, job_id, "RUNNING"))
            consumer.signal(signal.SIGTERM)
            consumer.wait_for_event("consumer.draining")
            consumer.signal(signal.SIGTERM)
            assert consumer.proc.wait(30) == 1
        finally:
            if consumer.proc.poll() is None:
                consumer.kill()
    (forced,) = [e for e in consumer.events() if e["event"] == "consumer.exit_forced"]
    assert f"job {job_id}" in forced["still_running"]
    # Its claim is left to lapse (never given back while its handler runs), and the
    # log says so.
    (now,) = [e for e in consumer.events() if e["event"] == "consumer.stopped_now"]
    assert now["given_back"] == {}, now
    assert "ignored cancellation" in now["left"][str(job_id)], now


def test_a_stop_gives_thousands_of_claims_back_in_bounded_statements(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    """A consumer of 2,000 slots stopped with no drain: every claim goes back
    (QUEUED, attempt refunded), a bounded batch per statement rather than one
    statement of any size (whose failure or timeout would cost every attempt)."""
    from hybrid_jobs.consumers.worker import GIVE_BACK_BATCH
    from hybrid_jobs.outbox import NewJob
    from tests.support.jobs import enqueue_many

    n = 2000
    args = [*APP, "--concurrency", str(n), "--drain-seconds", "0"]
    with running("relay", [], env, "relay.started"):
        enqueue_many(engine, [NewJob("sleep", {"seconds": 600}) for _ in range(n)])
        with running("consumer", args, env, "consumer.started") as consumer:
            deadline = time.monotonic() + 120
            while pg.execute("SELECT count(*) FROM jobs WHERE state = 'RUNNING'").fetchone()[0] < n:
                assert time.monotonic() < deadline, "not all claimed"
                time.sleep(0.2)
            consumer.signal(signal.SIGTERM)
            assert consumer.proc.wait(120) == 0
    batches = [e["jobs"] for e in consumer.events() if e["event"] == "consumer.gave_back"]
    assert sum(batches) == n and max(batches) <= GIVE_BACK_BATCH, batches
    states = dict(
        pg.execute("SELECT state, max(attempt_count) FROM jobs GROUP BY state").fetchall()
    )
    assert states == {"QUEUED": 0}
    given_back = pg.execute(
        "SELECT count(*) FROM job_attempts WHERE outcome = 'QUEUED' AND error_code = 'SHUTDOWN'"
    ).fetchone()[0]
    assert given_back == n


def test_a_give_back_that_meets_a_locked_row_gives_it_back_once_free(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    env: dict[str, str],
) -> None:
    """SIGTERM while another transaction holds the row of a claim being given back
    (a heartbeat, an operator's cancel request, the relay's sweep hold it a moment):
    the give-back skips the row, tries it again shortly, and gives it back once it is
    free: QUEUED, the attempt refunded. (The consumer used to forget it: the job
    stayed RUNNING until its lease ran out, and the sweeper then spent its attempt.)"""
    args = [*APP, "--drain-seconds", "0", "--lease-seconds", "300"]
    with (
        running("relay", [], env, "relay.started"),
        running("consumer", args, env, "consumer.started") as consumer,
    ):
        job_id = enqueue(engine, "sleep", {"seconds": 600})
        asyncio.run(wait_for_state(pg, job_id, "RUNNING"))
        with psycopg.connect(db_url.conninfo) as other:
            other.execute("SELECT 1 FROM jobs WHERE job_id = %s FOR UPDATE", [job_id])
            consumer.signal(signal.SIGTERM)
            # until the give-back has met the locked row (or the process is gone)
            deadline = time.monotonic() + 30
            while consumer.proc.poll() is None and not any(
                e["event"] == "consumer.gave_back" and e.get("locked") for e in consumer.events()
            ):
                assert time.monotonic() < deadline, consumer.text()[-3000:]
                time.sleep(0.02)
            other.rollback()  # the row is free again
        assert consumer.proc.wait(30) == 0
    row = job(pg, job_id)
    assert (row["state"], row["attempt_count"], row["lease_owner"]) == ("QUEUED", 0, None), (
        row,
        consumer.text()[-3000:],
    )
    history = [(a["outcome"], a["error_code"]) for a in attempts(pg, job_id)]
    assert history == [("QUEUED", "SHUTDOWN")], history
    assert not consumer.has_event("consumer.give_back_left")


def test_a_second_signal_gives_back_the_claim_of_an_async_job_that_honours_cancellation(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    """Stop, then stop now, while an async handler runs: the handler is cancelled and
    its claim given back on the way out (QUEUED, attempt refunded, a fresh wake-up),
    not left RUNNING until its lease runs out and the sweeper spends the attempt."""
    args = [*APP, "--drain-seconds", "30", "--lease-seconds", "60"]
    with running("relay", [], env, "relay.started"):
        consumer = Daemon("consumer", args, env)
        try:
            consumer.wait_for_event("consumer.started")
            job_id = enqueue(engine, "sleep", {"seconds": 600})
            asyncio.run(wait_for_state(pg, job_id, "RUNNING"))
            consumer.signal(signal.SIGTERM)
            consumer.wait_for_event("consumer.draining")
            consumer.signal(signal.SIGTERM)
            assert consumer.proc.wait(30) in (0, 1), consumer.text()[-3000:]
        finally:
            if consumer.proc.poll() is None:
                consumer.kill()
        row = job(pg, job_id)
        assert (row["state"], row["attempt_count"], row["lease_owner"]) == ("QUEUED", 0, None), (
            row,
            consumer.text()[-3000:],
        )
        history = [(a["outcome"], a["error_code"]) for a in attempts(pg, job_id)]
        assert history == [("QUEUED", "SHUTDOWN")], history
        wake = pg.execute("SELECT count(*) FROM outbox WHERE job_id = %s", [job_id]).fetchone()
        assert wake == (1,), "given back with a fresh wake-up"
    (now,) = [e for e in consumer.events() if e["event"] == "consumer.stopped_now"]
    assert now["given_back"] == {str(job_id): "QUEUED"} and now["left"] == {}, now
    assert not consumer.has_event("consumer.exit_forced"), consumer.text()[-3000:]


def test_a_second_signal_leaves_a_plain_function_job_to_its_lease(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    """Stop now while a plain function runs on its thread beside an async handler:
    the async job's claim is given back, but not the plain one's (its thread cannot
    be stopped, and would run on beside another worker's attempt until the process
    is gone): that job stays RUNNING until its lease lapses, and the log says so."""
    args = [*APP, "--drain-seconds", "30", "--lease-seconds", "60"]
    with running("relay", [], env, "relay.started"):
        consumer = Daemon("consumer", args, env)
        try:
            consumer.wait_for_event("consumer.started")
            plain = enqueue(engine, "sync_sleep", {"seconds": 600}, queue="sync")
            other = enqueue(engine, "sleep", {"seconds": 600})
            for job_id in (plain, other):
                asyncio.run(wait_for_state(pg, job_id, "RUNNING"))
            consumer.signal(signal.SIGTERM)
            consumer.wait_for_event("consumer.draining")
            consumer.signal(signal.SIGTERM)
            assert consumer.proc.wait(30) in (0, 1), consumer.text()[-3000:]
        finally:
            if consumer.proc.poll() is None:
                consumer.kill()
        kept = job(pg, plain)
        assert (kept["state"], kept["attempt_count"]) == ("RUNNING", 1), kept
        assert kept["lease_owner"] is not None
        assert attempts(pg, plain) == []
        assert job(pg, other)["state"] == "QUEUED"
    (now,) = [e for e in consumer.events() if e["event"] == "consumer.stopped_now"]
    assert now["given_back"] == {str(other): "QUEUED"}, now
    assert "plain function" in now["left"][str(plain)], now


def test_a_second_signal_does_not_wait_long_for_a_database_that_does_not_answer(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    env: dict[str, str],
) -> None:
    """Stop now while the give-back cannot get through (another transaction holds
    the jobs table): the consumer tries only briefly, since stop now was asked, exits
    within seconds, and names the claim it could not give back (left to lapse)."""
    args = [*APP, "--drain-seconds", "30", "--lease-seconds", "60"]
    with running("relay", [], env, "relay.started"):
        consumer = Daemon("consumer", args, env)
        try:
            consumer.wait_for_event("consumer.started")
            job_id = enqueue(engine, "sleep", {"seconds": 600})
            asyncio.run(wait_for_state(pg, job_id, "RUNNING"))
            consumer.signal(signal.SIGTERM)
            consumer.wait_for_event("consumer.draining")
            with psycopg.connect(db_url.conninfo) as other:
                other.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
                consumer.signal(signal.SIGTERM)
                began = time.monotonic()
                assert consumer.proc.wait(30) in (0, 1), consumer.text()[-3000:]
                took = time.monotonic() - began
                other.rollback()
        finally:
            if consumer.proc.poll() is None:
                consumer.kill()
    assert took < 7, (took, consumer.text()[-3000:])
    assert job(pg, job_id)["state"] == "RUNNING"
    (now,) = [e for e in consumer.events() if e["event"] == "consumer.stopped_now"]
    assert now["given_back"] == {}, now
    assert "give-back failed" in now["left"][str(job_id)], now
    assert consumer.has_event("consumer.give_back_failed")
