"""Snooze: a handler says "not yet, look again in N seconds" and its job goes back to
waiting without spending an attempt, its lease ended through the fence like every
other outcome. Through real consumers (a real process where a kill matters), plain
and async handlers alike, and through the statements themselves."""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from harness.claim import claim_params
from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Backoff, Registry
from hybrid_jobs.consumers.outcome import Outcome
from hybrid_jobs.consumers.store import finish_params
from hybrid_jobs.jobctl.metrics import Collector
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.topology import Topology
from tests.apps.snooze import SNOOZES
from tests.support.inproc import consumer_running, relay_running
from tests.support.jobs import attempts, enqueue, job, until, versions, wait_for_state
from tests.support.metrics import Scrape
from tests.support.processes import jobctl, running, service_env

pytestmark = pytest.mark.timeout(180)

QUICK = Backoff(base=0.1, cap=0.2, jitter=0)


@pytest.fixture
def services(db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology):
    return db_url, amqp_url, topology


def snoozes(pg: psycopg.Connection, job_id: uuid.UUID) -> int:
    row = pg.execute(SNOOZES, [job_id]).fetchone()
    assert row is not None
    return int(row[0])


def claim(pg: psycopg.Connection, job_id: uuid.UUID, worker: str) -> str:
    rows = pg.execute(q.JOB_CLAIM_MANY, claim_params([job_id], worker)).fetchall()
    return {row[1]: row[0] for row in rows}[job_id]


def finish(
    pg: psycopg.Connection, job_id: uuid.UUID, worker: str, generation: int, outcome: Outcome
) -> list[tuple[Any, ...]]:
    params = finish_params(worker, [(job_id, generation, outcome)])
    return pg.execute(q.JOB_FINISH_MANY, params).fetchall()


def pending_wakeups(pg: psycopg.Connection, job_id: uuid.UUID) -> list[Any]:
    rows = pg.execute(
        "SELECT available_at FROM outbox WHERE job_id = %s AND sent_at IS NULL", [job_id]
    )
    return [r[0] for r in rows.fetchall()]


def test_snooze_takes_seconds_or_a_timedelta_bounded_like_a_retry_delay() -> None:
    assert consumers.Snooze(1.5).seconds == 1.5
    assert consumers.Snooze(timedelta(minutes=2)).seconds == 120.0
    assert str(consumers.Snooze(30)) == "snoozed for 30 s"
    for wrong in (-1, 366 * 24 * 3600, math.nan, math.inf):
        with pytest.raises(ValueError, match="between 0 and a year"):
            consumers.Snooze(wrong)
    for wrong_type in (True, "5", None):
        with pytest.raises(TypeError, match="seconds or a timedelta"):
            consumers.Snooze(wrong_type)  # type: ignore[arg-type]
    assert Outcome.snoozed(math.inf).delay_seconds == 365 * 24 * 3600.0


async def test_a_snooze_spends_no_attempt_so_a_one_attempt_job_snoozes_three_times_then_succeeds(
    services, engine: Engine, pg: psycopg.Connection, pool
) -> None:
    collector = Collector(pool)
    assert await collector.collect_once(), "the first round counts none of the history"
    registry = Registry()

    async def run_async(j: consumers.Job) -> str:
        async with j.connection() as conn:
            cur = await conn.execute(SNOOZES, [j.id])
            row = await cur.fetchone()
        assert row is not None
        if row[0] < 3:
            raise consumers.Snooze(0.2)
        return "done"

    def run_plain(j: consumers.Job) -> str:
        with j.connection() as conn:
            row = conn.execute(SNOOZES, [j.id]).fetchone()
        assert row is not None
        if row[0] < 3:
            raise consumers.Snooze(timedelta(milliseconds=200))
        return "done"

    registry.handler("snoozer_async", max_attempts=1, backoff=QUICK)(run_async)
    registry.handler("snoozer_plain", queue="sync", max_attempts=1, backoff=QUICK)(run_plain)
    ids = {
        "async": enqueue(engine, "snoozer_async"),
        "plain": enqueue(engine, "snoozer_plain", queue="sync", max_attempts=1),
    }
    async with (
        relay_running(*services, sweep_interval=0.2),
        consumer_running(*services, registry, queues=("default", "sync")),
    ):
        rows = {k: await wait_for_state(pg, i, "SUCCEEDED", "FAILED") for k, i in ids.items()}
    for kind, job_id in ids.items():
        row = rows[kind]
        assert (row["state"], row["attempt_count"], row["max_attempts"]) == ("SUCCEEDED", 1, 1)
        assert row["result"] == "done"
        assert row["last_error_code"] is None, "a snooze is no error"
        history = attempts(pg, job_id)
        assert [a["outcome"] for a in history] == ["QUEUED"] * 3 + ["SUCCEEDED"], kind
        assert [a["attempt"] for a in history] == [1, 1, 1, 1], "every attempt refunded"
        assert sorted(a["lease_generation"] for a in history) == [1, 2, 3, 4]
        snoozed = [a for a in history if a["outcome"] == "QUEUED"]
        assert {(a["error_code"], a["error_message"]) for a in snoozed} == {
            ("SNOOZED", "snoozed for 0.2 s")
        }
        assert all(a["traceback"] is None for a in snoozed)
    # The metrics count snoozes apart from give-backs, per queue and job type.
    assert await collector.collect_once()
    scrape = Scrape(collector)
    for queue, job_type in (("default", "snoozer_async"), ("sync", "snoozer_plain")):
        labels = {"queue": queue, "job_type": job_type}
        finished = "hybrid_jobs_attempts_finished_total"
        assert scrape.value(finished, **labels, outcome="snoozed") == 3
        assert scrape.value(finished, **labels, outcome="given_back") == 0
        assert scrape.value(finished, **labels, outcome="succeeded") == 1


async def test_a_snoozed_job_is_not_claimable_before_its_run_after_and_is_woken_after_it(
    services, engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    registry = Registry()

    @registry.handler("later", max_attempts=1)
    async def later(j: consumers.Job) -> None:
        async with j.connection() as conn:
            cur = await conn.execute(SNOOZES, [j.id])
            row = await cur.fetchone()
        if row is not None and row[0] == 0:
            raise consumers.Snooze(4)

    job_id = enqueue(engine, "later")
    async with (
        relay_running(*services, sweep_interval=0.2),
        consumer_running(*services, registry),
    ):
        await until(lambda: snoozes(pg, job_id) == 1, "the snooze recorded")
        snoozed = job(pg, job_id)
        assert (snoozed["state"], snoozed["attempt_count"]) == ("QUEUED", 0)
        assert (snoozed["delay_reason"], snoozed["lease_owner"]) == ("SNOOZED", None)
        # Its wake-up is due when it is, and nobody may take it before.
        assert pending_wakeups(pg, job_id) == [snoozed["run_after"]]
        assert claim(pg, job_id, "intruder") == "early"
        with Session(engine) as session:
            why = outbox.explain(session, job_id)
        blocker = why.blocker("SNOOZED")
        assert blocker is not None, why.summary
        assert blocker.facts["until"] == snoozed["run_after"]
        assert blocker.facts["snoozes"] == 1
        assert why.summary.startswith("QUEUED: snoozed by its handler until"), why.summary
        assert "snoozed 1 time(s)" in why.summary
        row = await wait_for_state(pg, job_id, "SUCCEEDED", "FAILED", timeout=30)
    assert (row["state"], row["attempt_count"]) == ("SUCCEEDED", 1)
    _, second = attempts(pg, job_id)
    assert second["started_at"] >= snoozed["run_after"], "claimed only once it was due"
    assert second["ready_at"] == snoozed["run_after"]
    shown = jobctl("jobs", "show", str(job_id), url=db_url, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "SNOOZED: snoozed for 4 s" in shown.stdout
    api = jobctl("jobs", "show", str(job_id), "--json", url=db_url, cwd=tmp_path)
    assert api.returncode == 0, api.stderr
    history = json.loads(api.stdout)["attempts"]
    assert history[0]["outcome"] == "QUEUED"
    assert history[0]["error_message"] == "snoozed for 4 s"


def test_a_stale_workers_snooze_changes_nothing(engine: Engine, pg: psycopg.Connection) -> None:
    job_id = enqueue(engine, "noop")
    assert claim(pg, job_id, "w1") == "claimed"
    # w1 stalls past its lease; the sweeper ends it and w2 claims the job again.
    pg.execute(
        "UPDATE jobs SET lease_expires_at = now() - interval '1 s' WHERE job_id = %s", [job_id]
    )
    pg.execute(q.JOB_SWEEP_EXPIRED, {"limit": 10, "default_backoff": 0})
    pg.execute("UPDATE jobs SET run_after = now() WHERE job_id = %s", [job_id])
    assert claim(pg, job_id, "w2") == "claimed"
    before = versions(pg, [job_id])
    history = attempts(pg, job_id)
    wakeups = pg.execute("SELECT id, sent_at FROM outbox WHERE job_id = %s", [job_id]).fetchall()

    assert finish(pg, job_id, "w1", 1, Outcome.snoozed(60)) == [], "the fence turns it away"
    assert versions(pg, [job_id]) == before, "the row is untouched"
    assert attempts(pg, job_id) == history, "no history row"
    assert pg.execute("SELECT id, sent_at FROM outbox WHERE job_id = %s", [job_id]).fetchall() == (
        wakeups
    ), "no wake-up"
    row = job(pg, job_id)
    assert (row["state"], row["lease_owner"], row["attempt_count"]) == ("RUNNING", "w2", 2)

    # The holder's own snooze applies.
    assert finish(pg, job_id, "w2", 2, Outcome.snoozed(60)) == [(job_id, "QUEUED")]
    assert job(pg, job_id)["attempt_count"] == 1


def test_a_snooze_of_a_job_asked_to_cancel_ends_it_cancelled(
    engine: Engine, pg: psycopg.Connection
) -> None:
    job_id = enqueue(engine, "noop")
    assert claim(pg, job_id, "w1") == "claimed"
    with Session(engine) as session, session.begin():
        assert outbox.request_cancel(session, job_id) == "CANCEL_REQUESTED"
    wakeups = pending_wakeups(pg, job_id)
    assert finish(pg, job_id, "w1", 1, Outcome.snoozed(60)) == [(job_id, "CANCELLED")]
    row = job(pg, job_id)
    assert (row["state"], row["attempt_count"], row["run_after"] < row["finished_at"]) == (
        "CANCELLED",
        1,
        True,
    ), "nobody wants it run again: not refunded, not postponed"
    assert pending_wakeups(pg, job_id) == wakeups, "no wake-up of its own"
    (ended,) = attempts(pg, job_id)
    assert (ended["outcome"], ended["error_code"]) == ("CANCELLED", "SNOOZED")
    assert row["last_error_code"] is None, "a snooze is no error, cancelled or not"


@pytest.mark.parametrize("gate", ["key", "resource"])
async def test_a_snooze_releases_the_key_or_resource_and_the_tenant_slot_and_hands_on(
    services, engine: Engine, pg: psycopg.Connection, gate: str
) -> None:
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_running=1)
    registry = Registry()
    turned_down = "KEY_BUSY" if gate == "key" else "RESOURCE_BUSY"

    @registry.handler("holder", max_attempts=1)
    async def holder(j: consumers.Job) -> None:
        # Holds its gate until the waiter has been turned down for it: from then on,
        # only the end of this lease can wake the waiter.
        for _ in range(300):
            async with j.connection() as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM jobs WHERE job_id <> %s AND delay_reason = %s",
                    [j.id, turned_down],
                )
                row = await cur.fetchone()
            if row is not None and row[0] > 0:
                raise consumers.Snooze(600)
            await asyncio.sleep(0.05)
        raise AssertionError("the waiter was never turned down")

    @registry.handler("waiter")
    async def waiter(j: consumers.Job) -> None:
        return None

    async with (
        relay_running(*services, sweep_interval=0.2),
        consumer_running(*services, registry),
    ):
        held = enqueue(engine, "holder", tenant="acme", **{gate: "account:1"})
        await wait_for_state(pg, held, "RUNNING")
        waiting = enqueue(engine, "waiter", **{gate: "account:1"})
        done = await wait_for_state(pg, waiting, "SUCCEEDED", "FAILED")
        assert done["state"] == "SUCCEEDED"
    row = job(pg, held)
    assert (row["state"], row["delay_reason"], row["attempt_count"]) == ("QUEUED", "SNOOZED", 0)
    assert [a["outcome"] for a in attempts(pg, waiting)] == ["SUCCEEDED"]
    assert pg.execute("SELECT count(*) FROM key_usage").fetchone() == (0,)
    assert pg.execute("SELECT count(*) FROM resource_holds").fetchone() == (0,)
    assert pg.execute("SELECT running FROM tenant_usage WHERE tenant = 'acme'").fetchone() == (0,)
    assert not row["holds_slot"]
    assert len(pending_wakeups(pg, held)) == 1, "its own wake-up, due in ten minutes"


async def test_a_snooze_inside_the_jobs_transaction_rolls_its_writes_back_and_snoozes(
    services, engine: Engine, pg: psycopg.Connection
) -> None:
    pg.execute("CREATE TABLE writes (job_id uuid NOT NULL, snoozes int NOT NULL)")
    registry = Registry()
    insert = "INSERT INTO writes (job_id, snoozes) VALUES (%s, %s)"

    async def run_async(j: consumers.Job) -> None:
        async with j.transaction() as tx:
            cur = await tx.execute(SNOOZES, [j.id])
            row = await cur.fetchone()
            await tx.execute(insert, [j.id, row[0]])
            if row[0] == 0:
                raise consumers.Snooze(0.1)

    def run_plain(j: consumers.Job) -> None:
        with j.transaction() as tx:
            row = tx.execute(SNOOZES, [j.id]).fetchone()
            tx.execute(insert, [j.id, row[0]])
            if row[0] == 0:
                raise consumers.Snooze(0.1)

    registry.handler("tx_async", max_attempts=1)(run_async)
    registry.handler("tx_plain", queue="sync", max_attempts=1)(run_plain)
    ids = [enqueue(engine, "tx_async"), enqueue(engine, "tx_plain", queue="sync")]
    async with (
        relay_running(*services, sweep_interval=0.2),
        consumer_running(*services, registry, queues=("default", "sync")),
    ):
        rows = [await wait_for_state(pg, i, "SUCCEEDED", "FAILED") for i in ids]
    for job_id, row in zip(ids, rows, strict=True):
        assert (row["state"], row["attempt_count"]) == ("SUCCEEDED", 1)
        assert [a["outcome"] for a in attempts(pg, job_id)] == ["QUEUED", "SUCCEEDED"]
        written = pg.execute("SELECT snoozes FROM writes WHERE job_id = %s", [job_id]).fetchall()
        assert written == [(1,)], "the snoozed attempt's writes rolled back"


def test_kill_9_right_after_a_snooze_is_recorded_loses_nothing(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    env = service_env(db_url, amqp_url, topology)
    consumer = ["--app", "tests.apps.snooze", "--lease-seconds", "2", "--heartbeat-seconds", "0.5"]
    relay = ["--sweep-interval", "0.3", "--rewake-interval", "2"]
    with running("relay", relay, env, "relay.started"):
        with running("consumer", consumer, env, "consumer.started") as doomed:
            job_id = enqueue(engine, "snooze_once", {"seconds": 3})
            asyncio.run(until(lambda: snoozes(pg, job_id) == 1, "the snooze recorded"))
            doomed.kill()
        row = job(pg, job_id)
        assert (row["state"], row["attempt_count"], row["lease_owner"]) == ("QUEUED", 0, None)
        # Its wake-up, due when it is, was committed with the snooze (sent or not yet).
        due = pg.execute("SELECT available_at FROM outbox WHERE job_id = %s", [job_id])
        assert row["run_after"] in [r[0] for r in due.fetchall()]
        with running("consumer", consumer, env, "consumer.started") as survivor:
            done = asyncio.run(wait_for_state(pg, job_id, "SUCCEEDED", "FAILED", timeout=60))
    assert (done["state"], done["attempt_count"]) == ("SUCCEEDED", 1)
    snoozed, won = attempts(pg, job_id)
    assert (snoozed["outcome"], snoozed["error_code"]) == ("QUEUED", "SNOOZED")
    assert f":{doomed.pid}:" in snoozed["worker"]
    assert f":{survivor.pid}:" in won["worker"]
    assert won["started_at"] >= row["run_after"]
