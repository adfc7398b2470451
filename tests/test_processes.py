"""The real `relay` and `consumer` commands as processes: the whole path, and a
graceful stop that gives claims back without spending their attempts."""

from __future__ import annotations

import asyncio
import signal

import psycopg
from sqlalchemy import Engine

from hybrid_jobs.outbox import NewJob
from tests.support.jobs import attempts, enqueue, enqueue_many, job, wait_for_state, wait_until_all
from tests.support.processes import fleet, refused, running

APP = ["--app", "tests.apps.basic"]


def test_happy_path_through_real_processes(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    pg.execute("CREATE TABLE effects (key text, job_id uuid, worker text, pid int)")
    with fleet(env, [*APP, "--concurrency", "20"]) as (relay, (consumer,)):
        ids = enqueue_many(engine, [NewJob("noop", {}) for _ in range(200)])
        ids += enqueue_many(engine, [NewJob("record", {"key": i % 50}) for i in range(100)])
        ids += enqueue_many(engine, [NewJob("sync_sleep", {"seconds": 0.01}, queue="sync")])
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(ids)))
        assert consumer.stop() == 0
        assert relay.stop() == 0
    assert consumer.has_event("consumer.stopped")
    assert pg.execute("SELECT count(*) FROM effects").fetchone()[0] == 50, "one effect per key"
    assert pg.execute("SELECT count(*) FROM job_attempts").fetchone()[0] == len(ids)


def test_graceful_stop_gives_the_claim_back_without_spending_the_attempt(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    args = [*APP, "--drain-seconds", "0.5"]
    with running("relay", [], env, "relay.started"):
        quick = enqueue(engine, "sleep", {"seconds": 0.2})
        slow = enqueue(engine, "sleep", {"seconds": 600})
        for signum in (signal.SIGTERM, signal.SIGINT):
            with running("consumer", args, env, "consumer.started") as consumer:
                asyncio.run(wait_for_state(pg, slow, "RUNNING"))
                consumer.signal(signum)
                assert consumer.proc.wait(30) == 0
            gave_back = [e for e in consumer.events() if e["event"] == "consumer.gave_back"]
            assert gave_back and gave_back[0]["states"] == {"QUEUED": 1}
            row = job(pg, slow)
            assert (row["state"], row["attempt_count"], row["lease_owner"]) == ("QUEUED", 0, None)
            assert job(pg, quick)["state"] == "SUCCEEDED", "the short job finished in the drain"
        # Nothing spent: a later consumer gets the slow job as its first attempt.
        pg.execute("UPDATE jobs SET payload = '{\"seconds\": 0}' WHERE job_id = %s", [slow])
        with running("consumer", APP, env, "consumer.started"):
            row = asyncio.run(wait_for_state(pg, slow, "SUCCEEDED"))
    assert row["attempt_count"] == 1
    assert row["lease_generation"] == 3, "three claims, each with its own fencing token"
    # The two given-back claims are in the history too, their attempts refunded.
    history = [(a["attempt"], a["outcome"], a["error_code"]) for a in attempts(pg, slow)]
    assert history == [(1, "QUEUED", "SHUTDOWN"), (1, "QUEUED", "SHUTDOWN"), (1, "SUCCEEDED", None)]


def test_consumer_flags_and_bad_app(
    env: dict[str, str],
) -> None:

    for args, message in [
        (["--app", "no.such.module"], "--app no.such.module: cannot import it"),
        (["--app", "tests.apps.basic", "--queue", "bad queue"], "--queue: queue must be"),
        (
            ["--app", "tests.apps.basic", "--lease-seconds", "3", "--heartbeat-seconds", "5"],
            "heartbeat seconds must be shorter than the lease",
        ),
        (["--app", "tests.apps.basic", "--concurrency", "0"], "concurrency must be at least 1"),
    ]:
        assert message in refused("consumer", args, env).stderr
