"""Job weights across real consumer processes: a consumer never runs more slots than
its ``--concurrency`` (from the handlers' own clock); a job heavier than its
consumer's whole concurrency is turned down, logged and explained, and runs once a
consumer large enough starts; and a heavy holder killed with SIGKILL gives its
weight back to its tenant once its lease expires, so the jobs waiting for the
tenant's cap run. A heavy job of a plain function is not starved by a stream of
light ones, and light jobs buffered behind a heavy one waiting for room go to a
consumer with room."""

from __future__ import annotations

import asyncio
import time
import uuid

import psycopg
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.check import check, violations
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import DatabaseUrl
from tests.apps.weights import MOST_SLOTS_AT_ONCE, RUNS_TABLE
from tests.support.jobs import enqueue, enqueue_many, job, until, until_started, wait_until_all
from tests.support.processes import Daemon, fleet, running

APP = ["--app", "tests.apps.weights"]


def _one(pg: psycopg.Connection, sql: str) -> int:
    row = pg.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def test_a_consumer_never_runs_more_slots_than_its_concurrency(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str], db_url: DatabaseUrl
) -> None:
    pg.execute(RUNS_TABLE)
    jobs = (
        [NewJob("weighed", {"seconds": 0.2}, weight=3) for _ in range(6)]
        + [NewJob("weighed", {"seconds": 0.2}, weight=2) for _ in range(4)]
        + [NewJob("weighed", {"seconds": 0.1}) for _ in range(16)]
    )
    with fleet(env, [*APP, "--concurrency", "4"], consumers=2):
        enqueue_many(engine, jobs)
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(jobs), timeout=180))
    # From the handlers' own clock: a heavy job ran, and never beside more than fit.
    # (Not from the leases in PostgreSQL: a lease whose handler returned holds its
    # slots of a tenant and a limit until its outcome is written, but no longer its
    # consumer's, which starts the next job meanwhile.)
    assert 3 <= _one(pg, MOST_SLOTS_AT_ONCE) <= 4
    # each ran once: waiting for room spent no attempt
    assert _one(pg, "SELECT max(attempt_count) FROM jobs") == 1
    assert violations(check(db_url.conninfo)) == {}


def test_a_job_heavier_than_the_consumer_is_explained_and_runs_on_a_larger_one(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    pg.execute(RUNS_TABLE)
    small_args = [*APP, "--concurrency", "4"]
    with (
        running("relay", [], env, "relay.started"),
        running("consumer", small_args, env, "consumer.started") as small,
    ):
        heavy = enqueue(engine, "weighed", {"seconds": 0.05}, weight=5)
        light = enqueue(engine, "weighed", {"seconds": 0.05})
        asyncio.run(
            until(
                lambda: (
                    job(pg, heavy)["delay_reason"] == "WEIGHT_OVER_CONCURRENCY"
                    and job(pg, light)["state"] == "SUCCEEDED"
                ),
                "the heavy job is turned down, the light one runs",
                timeout=60,
            )
        )
        warning = small.wait_for_event("consumer.job_heavier_than_concurrency")
        assert warning["concurrency"] == 4
        with Session(engine) as session:
            why = outbox.explain(session, heavy)
        assert "WEIGHT_OVER_CONCURRENCY" in why.codes, why
        assert job(pg, heavy)["attempt_count"] == 0
        with running("consumer", [*APP, "--concurrency", "6"], env, "consumer.started") as big:
            # started, it brought the wake-up forward (the backstop is 10 s off)
            woke = big.wait_for_event("consumer.woke_waiting_jobs")
            assert woke["count"] == 1, woke
            # if the small consumer meets it first, it is sent on for the larger one
            asyncio.run(wait_until_all(pg, "SUCCEEDED", 2, timeout=120))
    assert job(pg, heavy)["attempt_count"] == 1


def test_a_heavy_holder_killed_gives_its_weight_back_when_its_lease_expires(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str], db_url: DatabaseUrl
) -> None:
    pg.execute(RUNS_TABLE)
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_running=4)
    short = [*APP, "--lease-seconds", "3", "--heartbeat-seconds", "1", "--concurrency", "8"]
    relay = ["--sweep-interval", "0.5", "--rewake-interval", "3"]
    usage = "SELECT running FROM tenant_usage WHERE tenant = 'acme'"
    with running("relay", relay, env, "relay.started"):
        with running("consumer", short, env, "consumer.started") as killed:
            heavy = enqueue(engine, "weighed", {"hang_once": True}, tenant="acme", weight=4)
            asyncio.run(until_started(pg, "weight_runs", [heavy]))
            waiting = [
                enqueue(engine, "weighed", {"seconds": 0.05}, tenant="acme") for _ in range(2)
            ]
            # the relay holds their wake-ups back while the cap is full
            assert _one(pg, usage) == 4
            with Session(engine) as session:
                assert all("TENANT_CAP" in outbox.explain(session, w).codes for w in waiting)
            killed.kill()
        with running("consumer", short, env, "consumer.started"):
            asyncio.run(wait_until_all(pg, "SUCCEEDED", 3, timeout=120))
    for w in waiting:
        assert job(pg, w)["attempt_count"] == 1
    # the killed lease cost an attempt, as any lost lease does
    assert job(pg, heavy)["attempt_count"] == 2
    assert _one(pg, usage) == 0
    assert violations(check(db_url.conninfo)) == {}


def _delivered(daemon: Daemon) -> set[str]:
    """The job ids the consumer was sent (its debug trace of each wake-up)."""
    return {
        i for e in daemon.events() if e.get("event") == "consumer.delivered" for i in e["job_ids"]
    }


def test_a_plain_functions_heavy_job_runs_amid_a_stream_of_light_ones(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    light = [NewJob("weighed_sync", {"seconds": 0.3}) for _ in range(4)]
    waiting = "SELECT count(*) FROM jobs WHERE state = 'QUEUED' AND weight IS NULL"
    with fleet(env, [*APP, "--concurrency", "4"]) as (_, [consumer]):
        enqueue_many(engine, light + light)
        asyncio.run(wait_until_all(pg, "RUNNING", 4, timeout=60))
        heavy = enqueue(engine, "weighed_sync", {"seconds": 0.05}, weight=3)
        deadline = time.monotonic() + 90
        while job(pg, heavy)["state"] != "SUCCEEDED":
            # a plain function's job short of slots waits for them: it is not sent
            # away as if no thread were free
            assert not consumer.has_event("consumer.threads_exhausted"), consumer.text()
            assert time.monotonic() < deadline, "the heavy job waited behind the light ones"
            # always more light jobs waiting than the consumer has slots
            if _one(pg, waiting) < 6:
                enqueue_many(engine, light)
            time.sleep(0.1)
    assert job(pg, heavy)["attempt_count"] == 1
    assert not consumer.has_event("consumer.threads_exhausted"), consumer.text()


def test_light_jobs_buffered_behind_a_heavy_one_are_run_by_another_consumer(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    pg.execute(RUNS_TABLE)
    args = [*APP, "--concurrency", "4", "--heartbeat-seconds", "1"]
    with (
        running("relay", [], env, "relay.started"),
        running("consumer", [*args, "--log-level", "debug"], env, "consumer.started") as busy,
    ):
        long = enqueue(engine, "weighed", {"seconds": 600})
        asyncio.run(until(lambda: job(pg, long)["state"] == "RUNNING", "the long job runs", 60))
        heavy = enqueue(engine, "weighed", {"seconds": 0.05}, weight=4)
        asyncio.run(until(lambda: str(heavy) in _delivered(busy), "the heavy job is sent", 60))
        with running("consumer", args, env, "consumer.started") as idle:
            # sent now that the fleet has room, round the two consumers: those the busy
            # one buffered must not wait there for the long job's end
            lights = enqueue_many(engine, [NewJob("weighed", {"seconds": 0.05}) for _ in range(8)])
            asyncio.run(
                until(
                    lambda: all(job(pg, i)["state"] == "SUCCEEDED" for i in lights),
                    "the light jobs run on the idle consumer",
                    60,
                )
            )
            # the heavy one still waits on the busy consumer, for the long job's slot
            assert job(pg, heavy)["state"] == "QUEUED"
            with Session(engine) as session, session.begin():
                outbox.request_cancel(session, long)
            asyncio.run(
                until(lambda: job(pg, heavy)["state"] == "SUCCEEDED", "the heavy job runs", 60)
            )
        ran_on = {
            uuid.UUID(str(row[0])): row[1]
            for row in pg.execute("SELECT job_id, worker FROM weight_runs").fetchall()
        }
    worker = busy.wait_for_event("consumer.started")["worker"]
    assert ran_on[long] == ran_on[heavy] == worker
    assert {ran_on[i] for i in lights} == {idle.wait_for_event("consumer.started")["worker"]}


# Four slots: two jobs of weight 2 at a time. Before the fix, 120 such jobs took 31 s
# here; 240 now take about 3.
JOBS, SLOTS = 240, 4


def test_short_weighed_jobs_each_take_the_next_free_slots_not_a_retry_a_second(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    # Regression: a weighed job the claim found no room for noted, as the room it
    # waits to grow past, the slots free once the claimed jobs were started. Short
    # jobs had often ended by then (starting them awaits), so it noted every slot
    # free, waited for more than there are, and was tried again only after its
    # one-second retry: 20,000 no-op jobs of weight 2 drained at about 100 a second
    # on two consumers of 50 slots, where they now drain at about 2,400.
    jobs = [NewJob("noop", {}, weight=2) for _ in range(JOBS)]
    with fleet(env, ["--app", "tests.apps.basic", "--concurrency", str(SLOTS)]):
        enqueue_many(engine, jobs)
        started = time.monotonic()
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(jobs), timeout=180))
        took = time.monotonic() - started
    # each claim takes the slots the jobs before gave back: a few seconds; a retry a
    # second for every two jobs took a minute
    assert took < 30, f"{JOBS} no-op jobs of weight 2 took {took:.1f} s on {SLOTS} slots"
