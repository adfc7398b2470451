"""A concurrency limit held across real consumer processes: two consumers draining a
limited type never run more than its limit at once (sampled from PostgreSQL while
they drain, and from the handlers' own clock), and a holder killed with SIGKILL
gives its slot back once its lease expires, so the jobs waiting for it run."""

from __future__ import annotations

import asyncio
import time

import psycopg
from sqlalchemy import Engine

from hybrid_jobs.outbox import NewJob
from tests.apps.concurrency import LIMIT, MOST_AT_ONCE, RUNS_TABLE
from tests.support.jobs import enqueue, enqueue_many, job, until, until_started, wait_until_all
from tests.support.processes import fleet, running

APP = ["--app", "tests.apps.concurrency"]

_LEASED = (
    "SELECT count(*) FROM jobs"
    " WHERE job_type = 'capped' AND state IN ('RUNNING', 'CANCEL_REQUESTED')"
)


def _one(pg: psycopg.Connection, sql: str) -> int:
    row = pg.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def test_two_consumers_never_run_more_than_the_limit_at_once(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    pg.execute(RUNS_TABLE)
    capped = 30
    args = [*APP, "--concurrency", "8"]
    with fleet(env, args, consumers=2):
        enqueue_many(
            engine,
            [NewJob("capped", {"seconds": 0.3}) for _ in range(capped)]
            + [NewJob("free", {}) for _ in range(20)],
        )
        most = held_most = 0
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            most = max(most, _one(pg, _LEASED))
            held_most = max(
                held_most,
                _one(pg, "SELECT COALESCE(max(running), 0) FROM concurrency_limits"),
            )
            if _one(pg, "SELECT count(*) FROM jobs WHERE state = 'SUCCEEDED'") == capped + 20:
                break
            time.sleep(0.02)
        asyncio.run(wait_until_all(pg, "SUCCEEDED", capped + 20, timeout=30))
    assert 1 <= most <= LIMIT, most
    assert held_most <= LIMIT, held_most
    assert 1 <= _one(pg, MOST_AT_ONCE) <= LIMIT
    assert _one(pg, "SELECT running FROM concurrency_limits WHERE job_type = 'capped'") == 0
    # each ran once: waiting for the limit spent no attempt
    assert _one(pg, "SELECT max(attempt_count) FROM jobs") == 1
    assert _one(pg, "SELECT count(*) FROM jobs WHERE limit_held") == 0


def test_a_holder_killed_gives_its_slot_back_when_its_lease_expires(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    pg.execute(RUNS_TABLE)
    short = [*APP, "--lease-seconds", "3", "--heartbeat-seconds", "1", "--concurrency", "8"]
    relay = ["--sweep-interval", "0.5", "--rewake-interval", "3"]
    with running("relay", relay, env, "relay.started"):
        with running("consumer", short, env, "consumer.started") as killed:
            holders = [enqueue(engine, "capped", {"hang_once": True}) for _ in range(LIMIT)]
            asyncio.run(until(lambda: _one(pg, _LEASED) == LIMIT, "the holders run", timeout=60))
            asyncio.run(until_started(pg, "limit_runs", holders))
            waiting = [enqueue(engine, "capped", {"seconds": 0.05}) for _ in range(2)]
            asyncio.run(
                until(
                    lambda: all(job(pg, w)["delay_reason"] == "CONCURRENCY_LIMIT" for w in waiting),
                    "the others are turned down for the limit",
                    timeout=60,
                )
            )
            killed.kill()
        with running("consumer", short, env, "consumer.started"):
            asyncio.run(wait_until_all(pg, "SUCCEEDED", LIMIT + 2, timeout=120))
    for w in waiting:
        assert job(pg, w)["attempt_count"] == 1
    for h in holders:
        # the killed lease cost an attempt, as any lost lease does
        assert job(pg, h)["attempt_count"] == 2
    assert _one(pg, "SELECT running FROM concurrency_limits WHERE job_type = 'capped'") == 0
