"""Faults inflicted on real `relay` and `consumer` processes and on the real services:
each test shows that nothing was lost and no stale write landed."""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import psycopg
import pytest
from sqlalchemy import Engine

from hybrid_jobs.jobctl.check import check, violations
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.chaos.app import EFFECTS_TABLE
from tests.support.broker import close_connections_of, publish_raw, purge
from tests.support.jobs import attempts, enqueue, enqueue_many, job, wait_for_state, wait_until_all
from tests.support.processes import Daemon, running, service_env

pytestmark = pytest.mark.timeout(240)

LEASE = ["--lease-seconds", "2", "--heartbeat-seconds", "0.5"]
CONSUMER = ["--app", "tests.chaos.app", *LEASE]
RELAY = ["--sweep-interval", "0.3", "--rewake-interval", "2"]


@pytest.fixture
def env(db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, pg: psycopg.Connection):
    pg.execute(EFFECTS_TABLE)
    return service_env(db_url, amqp_url, topology)


def effect_jobs(engine: Engine, n: int, **payload: object) -> list[uuid.UUID]:
    prefix = uuid.uuid4().hex[:6]
    return enqueue_many(
        engine, [NewJob("effect", {"key": f"{prefix}-{i}", **payload}) for i in range(n)]
    )


def held_by(pg: psycopg.Connection, job_id: uuid.UUID, daemon: Daemon) -> bool:
    owner = job(pg, job_id)["lease_owner"] or ""
    return f":{daemon.pid}:" in owner


async def wait_held_by(pg, job_id, daemon, timeout=20) -> None:
    deadline = time.monotonic() + timeout
    while not held_by(pg, job_id, daemon):
        assert time.monotonic() < deadline, f"{job_id} never claimed by pid {daemon.pid}"
        await asyncio.sleep(0.05)


def no_violations(db_url: DatabaseUrl) -> dict:
    report = check(db_url.conninfo)
    assert violations(report) == {}, report
    return report


def test_kill_9_mid_handler_the_job_finishes_elsewhere(env, engine, pg, db_url) -> None:
    with running("relay", RELAY, env, "relay.started"):
        with running("consumer", CONSUMER, env, "consumer.started") as doomed:
            (victim,) = effect_jobs(engine, 1, seconds=30)
            asyncio.run(wait_held_by(pg, victim, doomed))
            bystanders = effect_jobs(engine, 20)
            asyncio.run(wait_until_all(pg, "SUCCEEDED", 20))
            doomed.kill()
        # The second run is quick. Changed before a consumer can take the job again:
        # a survivor that claims it before the test reads "consumer.started" (a busy
        # runner) would otherwise run the 30 s version past the wait below.
        pg.execute(
            "UPDATE jobs SET payload = payload || '{\"seconds\": 0}' WHERE job_id = %s",
            [victim],
        )
        with running("consumer", CONSUMER, env, "consumer.started") as survivor:
            row = asyncio.run(wait_for_state(pg, victim, "SUCCEEDED", timeout=30))
    lost, won = attempts(pg, victim)
    assert (lost["outcome"], lost["error_code"]) == ("RETRY_WAIT", "LEASE_EXPIRED")
    assert f":{doomed.pid}:" in lost["worker"]
    assert (won["outcome"], won["attempt"]) == ("SUCCEEDED", 2)
    assert f":{survivor.pid}:" in won["worker"]
    assert row["lease_generation"] == 2
    for job_id in bystanders:
        assert [a["outcome"] for a in attempts(pg, job_id)] == ["SUCCEEDED"], "nothing else changes"
    no_violations(db_url)


def test_sigstop_past_the_lease_every_late_write_bounces(env, engine, pg, db_url) -> None:
    with running("relay", RELAY, env, "relay.started"):
        frozen = Daemon("consumer", CONSUMER, env)
        frozen.wait_for_event("consumer.started")
        try:
            (contested,) = effect_jobs(engine, 1, seconds=3)
            asyncio.run(wait_held_by(pg, contested, frozen))
            frozen.signal(signal.SIGSTOP)
            with running("consumer", CONSUMER, env, "consumer.started") as second:
                row = asyncio.run(wait_for_state(pg, contested, "SUCCEEDED", timeout=30))
                assert f":{second.pid}:" in attempts(pg, contested)[-1]["worker"]
                frozen.signal(signal.SIGCONT)
                # The frozen worker wakes inside its handler and heartbeats: the fence
                # turns it away, and it says so.
                deadline = time.monotonic() + 20
                fenced = ("consumer.lease_lost", "consumer.stale_outcome")
                while not any(e["event"] in fenced for e in frozen.events()):
                    assert time.monotonic() < deadline, frozen.text()[-3000:]
                    time.sleep(0.05)
        finally:
            frozen.signal(signal.SIGCONT)
            frozen.stop()
    rejected = [
        e
        for e in frozen.events()
        if e["event"] in ("consumer.lease_lost", "consumer.stale_outcome")
    ]
    assert rejected, f"the frozen worker should have been fenced off:\n{frozen.text()[-3000:]}"
    after = job(pg, contested)
    assert (after["state"], after["lease_generation"]) == ("SUCCEEDED", row["lease_generation"])
    history = attempts(pg, contested)
    assert [(f":{frozen.pid}:" in a["worker"], a["outcome"]) for a in history] == [
        (True, "RETRY_WAIT"),
        (False, "SUCCEEDED"),
    ]
    effects = pg.execute("SELECT worker FROM chaos_effects").fetchall()
    assert len(effects) == 1 and f":{frozen.pid}:" not in effects[0][0]
    no_violations(db_url)


def test_relay_killed_between_publish_and_mark_sent(env, engine, pg, db_url) -> None:
    faulty = env | {"RELAY_FAULT_INJECTION": "kill-after-publish"}
    with running("consumer", CONSUMER, env, "consumer.started") as consumer:
        crashing = Daemon("relay", RELAY, faulty)
        crashing.wait_for_event("relay.started")
        (job_id,) = effect_jobs(engine, 1)
        assert crashing.proc.wait(20) == -signal.SIGKILL
        asyncio.run(wait_for_state(pg, job_id, "SUCCEEDED"))
        unsent = pg.execute("SELECT count(*) FROM outbox WHERE sent_at IS NULL").fetchone()[0]
        assert unsent == 1, "published, then killed before the commit that marks it sent"
        with running("relay", RELAY, env, "relay.started"):
            # The second wake-up goes out and the consumer explains it (the job is
            # done): its counters in the workers table say so.
            explained = "SELECT coalesce(sum((counts->>'wakeup_finished')::int), 0) FROM workers"
            deadline = time.monotonic() + 20
            while pg.execute(explained).fetchone()[0] < 1:
                assert time.monotonic() < deadline, "the duplicate wake-up never arrived"
                time.sleep(0.05)
        assert consumer.stop() == 0
    stopped = consumer.wait_for_event("consumer.stopped")
    assert stopped["claimed"] == 1
    assert stopped.get("wakeup_finished", 0) == 1, "the second wake-up found it done"
    row = job(pg, job_id)
    assert (row["attempt_count"], row["lease_generation"]) == (1, 1)
    assert len(attempts(pg, job_id)) == 1
    no_violations(db_url)


@contextmanager
def fleet(env: dict[str, str], consumers: int = 2) -> Iterator[list[Daemon]]:
    with ExitStack() as stack:
        daemons = [stack.enter_context(running("relay", RELAY, env, "relay.started"))]
        for _ in range(consumers):
            daemons.append(
                stack.enter_context(running("consumer", CONSUMER, env, "consumer.started"))
            )
        yield daemons


@pytest.mark.skipif(shutil.which("rabbitmqctl") is None, reason="needs rabbitmqctl")
def test_broker_closes_every_connection_while_jobs_flow(env, engine, pg, db_url) -> None:
    ids: list[uuid.UUID] = []
    with fleet(env) as daemons:
        for _ in range(3):
            ids += effect_jobs(engine, 150)
            time.sleep(0.5)
            closed = close_connections_of([d.proc.pid for d in daemons], "fault test")
            assert closed >= len(daemons), "each daemon's broker connection was closed"
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(ids), timeout=120))
        assert all(d.proc.poll() is None for d in daemons), "everyone reconnected"
        assert any(d.has_event("consumer.broker_reconnected") for d in daemons[1:])
        assert daemons[0].has_event("relay.broker_reconnected")
    report = no_violations(db_url)
    assert report["effects_applied_more_than_once"] == 0


def test_database_backends_terminated_while_jobs_flow(env, engine, pg, db_url) -> None:
    ids: list[uuid.UUID] = []
    terminated = 0
    with fleet(env) as daemons:
        for _ in range(4):
            ids += effect_jobs(engine, 100)
            time.sleep(0.4)
            terminated += len(
                pg.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database()"
                    " AND application_name IN ('relay', 'relay-listen', 'consumer')"
                ).fetchall()
            )
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(ids), timeout=120))
        assert all(d.proc.poll() is None for d in daemons)
    assert terminated >= 8
    no_violations(db_url)


def test_purged_wakeups_are_recovered_by_the_rewaker(
    env, engine, pg, db_url, amqp_url, topology
) -> None:
    in_flight = "SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL"
    with running("relay", RELAY, env, "relay.started") as relay:
        ids = effect_jobs(engine, 50)
        for _ in range(100):
            if pg.execute(in_flight).fetchone()[0] == 50:
                break
            time.sleep(0.1)
        asyncio.run(purge(amqp_url.url, topology, "default"))
        with running("consumer", CONSUMER, env, "consumer.started"):
            asyncio.run(wait_until_all(pg, "SUCCEEDED", len(ids), timeout=60))
    assert relay.has_event("relay.rewoke_lost_wakeups")
    no_violations(db_url)


def test_poison_jobs_spend_only_their_own_attempts(env, engine, pg, db_url) -> None:
    raising = enqueue(engine, "always_fails")
    crashing = enqueue(engine, "crash")
    healthy = effect_jobs(engine, 100)
    with running("relay", RELAY, env, "relay.started"):
        consumers = [Daemon("consumer", CONSUMER, env) for _ in range(2)]
        deadline = time.monotonic() + 90
        try:
            # A supervisor's job: bring back the workers the poison kills.
            while time.monotonic() < deadline:
                states = {job(pg, raising)["state"], job(pg, crashing)["state"]}
                done = pg.execute(
                    "SELECT count(*) FROM jobs WHERE job_type = 'effect' AND state = 'SUCCEEDED'"
                ).fetchone()[0]
                if states <= {"FAILED"} and done == len(healthy):
                    break
                for i, c in enumerate(consumers):
                    if c.proc.poll() is not None:
                        consumers[i] = Daemon("consumer", CONSUMER, env)
                time.sleep(0.2)
        finally:
            for c in consumers:
                if c.proc.poll() is None:
                    c.stop()
    failed = job(pg, raising)
    assert (failed["state"], failed["attempt_count"]) == ("FAILED", 3)
    assert failed["last_error_message"] == "RuntimeError: poison payload, attempt 3"
    assert len(attempts(pg, raising)) == 3
    crashed = job(pg, crashing)
    assert (crashed["state"], crashed["attempt_count"]) == ("FAILED", 2), "counted at claim"
    assert crashed["last_error_code"] == "LEASE_EXPIRED"
    assert [a["error_code"] for a in attempts(pg, crashing)] == ["LEASE_EXPIRED"] * 2
    for job_id in healthy:
        assert job(pg, job_id)["state"] == "SUCCEEDED"
    no_violations(db_url)


def test_bad_deliveries_to_a_real_consumer(env, engine, pg, db_url, amqp_url, topology) -> None:
    bodies = [b"", b"garbage", b"\x00" * 10, b"9" * 5_000_000, b'{"job_id": "x"}', b"[]"]
    with (
        running("relay", RELAY, env, "relay.started"),
        running("consumer", CONSUMER, env, "consumer.started") as consumer,
    ):
        for body in bodies:
            asyncio.run(publish_raw(amqp_url.url, topology, "default", body))
        asyncio.run(publish_raw(amqp_url.url, topology, "default", str(uuid.uuid4()).encode()))
        ids = effect_jobs(engine, 10)
        asyncio.run(wait_until_all(pg, "SUCCEEDED", 10))
        assert consumer.proc.poll() is None
    garbage = [e for e in consumer.events() if e["event"] == "consumer.garbage_delivery"]
    assert len(garbage) == len(bodies)
    assert all(e["action"] == "rejected to the dead-letter queue" for e in garbage)
    assert max(e["bytes"] for e in garbage) == 5_000_000
    assert consumer.has_event("consumer.wakeup_for_unknown_job")
    assert len(ids) == 10
    no_violations(db_url)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("DATABASE_URL", "postgres//broken", "DATABASE_URL must be a postgresql:// URL"),
        ("AMQP_URL", "amqps://u:hunter2@:5671/", "AMQP_URL must name a host"),
    ],
)
def test_consumer_refuses_malformed_urls_in_one_line(env, variable, value, message) -> None:
    from tests.support.processes import refused

    done = refused("consumer", CONSUMER, env | {variable: value})
    assert done.stderr.strip() == f"consumer: {message}"
    assert "hunter2" not in done.stdout + done.stderr


def test_unreachable_services_never_leak_credentials(env, db_url) -> None:
    """Both services down: the daemons wait and say so, and never print a password."""
    unreachable = env | {
        "DATABASE_URL": "postgresql://root:pg-hunter2@127.0.0.1:1/nowhere",
        "AMQP_URL": "amqp://guest:mq-hunter2@127.0.0.1:1/",
    }
    for command, args, event in [
        ("relay", RELAY, "relay.waiting_for_rabbitmq"),
        ("consumer", CONSUMER, "consumer.waiting_for_rabbitmq"),
    ]:
        daemon = Daemon(command, args, unreachable)
        try:
            daemon.wait_for_event(event, timeout=30)
            time.sleep(1)
        finally:
            assert daemon.stop() == 0, "a daemon waiting for its services still stops cleanly"
        text = daemon.text()
        assert "hunter2" not in text
        assert "Traceback" not in text


def test_tenant_slots_never_leak_however_a_lease_ends(env, engine, pg, db_url) -> None:
    """A capped tenant's jobs end every way a lease can end: kill -9, frozen past the
    lease, given back at a graceful stop, cancelled while running, failed for good,
    succeeded. After each, the tenant's count of held slots equals the leases that
    hold one, and once everything settled both are zero."""
    from sqlalchemy.orm import Session

    from hybrid_jobs import outbox

    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_running=2)

    def enqueue_for(job_type: str, **payload: object) -> uuid.UUID:
        key = uuid.uuid4().hex
        (job_id,) = enqueue_many(engine, [NewJob(job_type, {"key": key, **payload}, tenant="acme")])
        return job_id

    def slots() -> tuple[int, int]:
        recorded = pg.execute("SELECT running FROM tenant_usage WHERE tenant = 'acme'").fetchone()
        held = pg.execute("SELECT count(*) FROM jobs WHERE tenant = 'acme' AND holds_slot")
        return recorded[0], held.fetchone()[0]

    def settled() -> None:
        deadline = time.monotonic() + 30
        while (s := slots())[0] != s[1]:
            assert time.monotonic() < deadline, f"slots in use {s[0]}, leases holding one {s[1]}"
            time.sleep(0.05)

    with running("relay", RELAY, env, "relay.started"):
        # kill -9 mid-handler: the sweeper ends the lease and frees the slot.
        with running("consumer", CONSUMER, env, "consumer.started") as doomed:
            killed = enqueue_for("effect", seconds=30)
            asyncio.run(wait_held_by(pg, killed, doomed))
            assert slots() == (1, 1)
            doomed.kill()
        asyncio.run(wait_for_state(pg, killed, "RETRY_WAIT", timeout=20))
        settled()
        # Frozen past its lease: swept while frozen; its late writes bounce.
        with running("consumer", CONSUMER, env, "consumer.started") as frozen:
            stuck = enqueue_for("effect", seconds=4)
            asyncio.run(wait_held_by(pg, stuck, frozen))
            frozen.signal(signal.SIGSTOP)
            asyncio.run(wait_for_state(pg, stuck, "RETRY_WAIT", timeout=20))
            settled()
            frozen.signal(signal.SIGCONT)
        # Given back at a graceful stop.
        with running("consumer", [*CONSUMER, "--drain-seconds", "0"], env, "consumer.started") as c:
            returned = enqueue_for("effect", seconds=30)
            asyncio.run(wait_held_by(pg, returned, c))
            assert c.stop() == 0
        assert job(pg, returned)["state"] == "QUEUED"
        settled()
        pg.execute("UPDATE jobs SET payload = payload || '{\"seconds\": 0}' WHERE tenant = 'acme'")
        with running("consumer", CONSUMER, env, "consumer.started") as consumer:
            # Cancelled while running, failed for good, and the ones above succeed.
            cancelled = enqueue_for("cancellable")
            asyncio.run(wait_held_by(pg, cancelled, consumer))
            with Session(engine) as session, session.begin():
                assert outbox.request_cancel(session, cancelled) == "CANCEL_REQUESTED"
            asyncio.run(wait_for_state(pg, cancelled, "CANCELLED"))
            failed = enqueue_for("permanent")
            asyncio.run(wait_for_state(pg, failed, "FAILED"))
            for job_id in (killed, stuck, returned):
                asyncio.run(wait_for_state(pg, job_id, "SUCCEEDED", timeout=30))
            settled()
    assert slots() == (0, 0)
    report = no_violations(db_url)
    assert report["slots_leaked_or_released_twice"] == 0
    assert report["slots_without_lease"] == 0
