"""Completion webhooks, on the real services: a job's end owes a call, written in the
transaction that ends it, and a relay delivers it, signed, at least once, against a
receiver on 127.0.0.1 that fails, hangs and recovers."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.jobctl.metrics import Collector
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.relay import service as relay_service
from hybrid_jobs.relay import webhooks
from hybrid_jobs.relay.service import Relay
from hybrid_jobs.relay.webhooks import sign
from hybrid_jobs.schema.queries import (
    WEBHOOK_DELIVERY_CLAIM,
    WEBHOOK_DELIVERY_DELIVERED,
    WEBHOOK_DELIVERY_FAILED,
)
from hybrid_jobs.schema.topology import Topology
from tests.support.api import api_client
from tests.support.inproc import consumer_running, relay_running
from tests.support.jobs import enqueue, until, wait_for_state
from tests.support.processes import jobctl, running, service_env
from tests.support.receiver import receiving

pytestmark = pytest.mark.timeout(240)

SECRET = b"test-secret-0123456789abcdef"
# Fast rounds and short back-offs, so retries come within a test's patience.
FAST = {
    "webhook_secret": SECRET,
    # the test's receivers listen on loopback, which no call may reach unless allowed
    "webhook_allow_hosts": "127.0.0.1",
    "webhook_interval": 0.2,
    "webhook_backoff": 0.3,
    "webhook_endpoint_backoff": 0.1,
}


def _cancel(engine: Engine, job_id: uuid.UUID) -> None:
    """End a waiting job (CANCELLED) in a transaction of its own."""
    with Session(engine) as session, session.begin():
        outbox.request_cancel(session, job_id)


def _deliveries(pg: psycopg.Connection, job_id: uuid.UUID) -> list[dict[str, Any]]:
    cur = pg.execute(
        "SELECT * FROM webhook_deliveries WHERE job_id = %s ORDER BY delivery_id", [job_id]
    )
    names = [d.name for d in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _delivery(pg: psycopg.Connection, job_id: uuid.UUID) -> dict[str, Any]:
    found = _deliveries(pg, job_id)
    assert len(found) == 1, found
    return found[0]


async def _settled(
    pg: psycopg.Connection, job_id: uuid.UUID, timeout: float = 90
) -> dict[str, Any]:
    """The job's call once it is DELIVERED or GAVE_UP."""
    await until(
        lambda: any(d["state"] != "PENDING" for d in _deliveries(pg, job_id)),
        f"the webhook call of job {job_id} to settle",
        timeout,
    )
    return _delivery(pg, job_id)


async def _counted(relay: Relay, outcome: str, count: int) -> None:
    """The relay's count of calls that ended so (counted once the row is written)."""
    deliverer = relay.webhooks
    assert deliverer is not None
    await until(lambda: deliverer.counts[outcome] == count, f"{count} {outcome}", 30)


# ---------------------------------------------------------------- declaring


def test_a_job_without_a_webhook_owes_no_call(engine: Engine, pg: psycopg.Connection) -> None:
    job_id = enqueue(engine, "plain")
    _cancel(engine, job_id)
    assert _deliveries(pg, job_id) == []
    assert pg.execute("SELECT webhook_url FROM jobs WHERE job_id = %s", [job_id]).fetchone() == (
        None,
    )


def test_the_end_of_a_job_with_a_url_owes_one_call_with_its_end(
    engine: Engine, pg: psycopg.Connection
) -> None:
    url = "https://hooks.example.com/jobs?team=7"
    job_id = enqueue(engine, "report", {"secret": "s3cr3t"}, queue="reports", on_complete_url=url)
    assert _deliveries(pg, job_id) == []  # owed only once it ends
    _cancel(engine, job_id)
    call = _delivery(pg, job_id)
    assert call["url"] == url
    assert call["endpoint"] == "https://hooks.example.com"
    assert call["state"] == "PENDING" and call["attempts"] == 0
    body = call["body"]
    assert body["job_id"] == str(job_id)
    assert body["job_type"] == "report" and body["queue"] == "reports"
    assert body["state"] == "CANCELLED" and body["attempts"] == 0
    assert body["finished_at"]
    assert "payload" not in body and "s3cr3t" not in json.dumps(body)


def test_one_statement_ending_many_jobs_owes_each_once_and_notifies_each(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """The end of a job is noted once per statement (trigger jobs_finished, from the
    statement's transition tables): a statement that ends several jobs owes the call
    of each that has a URL (its own, else its type's) once and notifies each waiter's
    channel (PostgreSQL folds a repeated notification within one transaction, so how
    many times is not seen); a job it updates without ending it, or updates again
    once ended, owes and notifies nothing."""
    pg.execute(
        "INSERT INTO job_type_webhooks (job_type, url, updated_by)"
        " VALUES ('typed', 'https://types.example.com/done', 'test')"
    )
    own = enqueue(engine, "plain", on_complete_url="https://own.example.com/done")
    typed = enqueue(engine, "typed")
    bare = enqueue(engine, "plain")
    waiting = enqueue(engine, "typed")
    done = enqueue(engine, "typed")
    _cancel(engine, done)
    assert len(_deliveries(pg, done)) == 1
    with psycopg.connect(db_url.conninfo, autocommit=True) as listener:
        listener.execute('LISTEN "public.job_finished"')
        pg.execute(
            "UPDATE jobs SET state = CASE WHEN job_id = %(waiting)s THEN state ELSE 'SUCCEEDED'"
            " END, finished_at = CASE WHEN job_id = %(waiting)s THEN NULL ELSE now() END,"
            " result = '{}' WHERE job_id = ANY(%(ids)s)",
            {"waiting": waiting, "ids": [own, typed, bare, waiting]},
        )
        pg.execute("UPDATE jobs SET updated_at = now() WHERE job_id = %s", [done])
        notes = list(listener.notifies(timeout=1))
    assert sorted(n.payload for n in notes) == sorted(str(j) for j in (own, typed, bare))
    assert [d["url"] for d in _deliveries(pg, own)] == ["https://own.example.com/done"]
    assert [d["url"] for d in _deliveries(pg, typed)] == ["https://types.example.com/done"]
    assert _delivery(pg, typed)["body"]["state"] == "SUCCEEDED"
    assert _deliveries(pg, bare) == [] and _deliveries(pg, waiting) == []
    assert len(_deliveries(pg, done)) == 1, "owed once, at its end"


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("ftp://example.com/x", ValueError),
        ("file:///etc/passwd", ValueError),
        ("https://user:pw@example.com/x", ValueError),
        ("https://example.com/" + "a" * 2100, ValueError),
        ("https://exa mple.com/", ValueError),
        ("/relative", ValueError),
        (42, TypeError),
    ],
)
def test_a_bad_url_is_refused_before_anything_is_written(
    engine: Engine, pg: psycopg.Connection, url: Any, error: type[Exception]
) -> None:
    with pytest.raises(error), Session(engine) as session, session.begin():
        outbox.enqueue(session, "report", {}, on_complete_url=url)
    assert pg.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_a_url_whose_scheme_is_in_capitals_ends_its_job_like_any_other(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """The scheme was checked case-blind and stored as written; the call's table
    wanted it in lower case, so the end of such a job failed its trigger: the
    outcome was refused, the job ran again, and its expired lease stopped the
    sweeper for every other lease of the instance."""
    job_id = enqueue(engine, "report", on_complete_url="HTTPS://Hooks.example.com/Done")
    stored = pg.execute("SELECT webhook_url FROM jobs WHERE job_id = %s", [job_id]).fetchone()
    assert stored == ("https://Hooks.example.com/Done",)
    _cancel(engine, job_id)
    assert _delivery(pg, job_id)["endpoint"] == "https://hooks.example.com"
    # one written in capitals by SQL of the user's own ends its job too
    other = enqueue(engine, "report")
    pg.execute("UPDATE jobs SET webhook_url = 'HTTP://a.example/x' WHERE job_id = %s", [other])
    _cancel(engine, other)
    assert _delivery(pg, other)["url"] == "HTTP://a.example/x"
    with pytest.raises(ValueError, match="webhook"):
        Registry().handler("t", webhook="JAVASCRIPT:alert(1)")
    assert Registry().handler("t", webhook="HTTPS://a.example/t")(lambda job: None)


def test_a_handler_webhook_must_be_a_valid_url() -> None:
    with pytest.raises(ValueError, match="webhook"):
        Registry().handler("t", webhook="javascript:alert(1)")


def test_a_duplicate_keeps_the_url_of_the_job_holding_its_key(
    engine: Engine, pg: psycopg.Connection
) -> None:
    first = enqueue(engine, "report", dedup_key="k", on_complete_url="https://a.example/1")
    again = enqueue(engine, "report", dedup_key="k", on_complete_url="https://b.example/2")
    assert again == first
    row = pg.execute("SELECT webhook_url FROM jobs WHERE job_id = %s", [first]).fetchone()
    assert row == ("https://a.example/1",)


def test_a_stale_relay_cannot_record_an_outcome(engine: Engine, pg: psycopg.Connection) -> None:
    """The fence: once a call's lease ran out and another relay claimed it, the
    first relay's outcome changes nothing."""
    job_id = enqueue(engine, "report", on_complete_url="https://a.example/x")
    _cancel(engine, job_id)
    claim = {
        "limit": 1,
        "scan": 10,
        "per_endpoint": 4,
        "in_flight": "{}",
        "resting": [],
        "max_attempts": 5,
        "lease_seconds": 0,
    }
    first = pg.execute(WEBHOOK_DELIVERY_CLAIM, {**claim, "relay": "relay-a"}).fetchall()
    assert len(first) == 1 and first[0][5] == 1
    # Its lease (0 s) is over: another relay claims it.
    second = pg.execute(WEBHOOK_DELIVERY_CLAIM, {**claim, "relay": "relay-b"}).fetchall()
    assert len(second) == 1 and second[0][5] == 2
    delivery_id = first[0][0]
    stale = {"delivery_id": delivery_id, "relay": "relay-a", "attempt": 1}
    assert pg.execute(WEBHOOK_DELIVERY_DELIVERED, {**stale, "status": 200}).fetchone() is None
    failed = {
        "status": 500,
        "error": "HTTP 500",
        "max_attempts": 5,
        "backoff_base": 1,
        "backoff_cap": 1,
        "backoff_jitter": 0,
    }
    assert pg.execute(WEBHOOK_DELIVERY_FAILED, {**stale, **failed}).fetchone() is None
    current = {"delivery_id": delivery_id, "relay": "relay-b", "attempt": 2}
    assert pg.execute(WEBHOOK_DELIVERY_DELIVERED, {**current, "status": 204}).fetchone()
    row = _delivery(pg, job_id)
    assert (row["state"], row["attempts"], row["last_status"]) == ("DELIVERED", 2, 204)
    assert row["lease_owner"] is None and row["delivered_at"] is not None


# ---------------------------------------------------------------- delivering


async def test_a_job_run_by_a_consumer_is_delivered_once_signed(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    registry = Registry()

    @registry.handler("charge")
    def charge(job: consumers.Job) -> None:
        return None

    with receiving() as receiver:
        job_id = enqueue(engine, "charge", {"card": "4242"}, on_complete_url=receiver.url("/done"))
        async with (
            relay_running(db_url, amqp_url, topology, **FAST) as relay,
            consumer_running(db_url, amqp_url, topology, registry),
        ):
            await wait_for_state(pg, job_id, "SUCCEEDED", timeout=60)
            call = await _settled(pg, job_id)
            await _counted(relay, "delivered", 1)
        (request,) = receiver.requests("/done")
    assert (call["state"], call["attempts"], call["last_status"]) == ("DELIVERED", 1, 200)
    assert request.signature_valid(SECRET)
    assert not request.signature_valid(b"another-secret-0123456789")
    assert request.headers["webhook-id"] == str(call["delivery_id"])
    assert request.headers["content-type"] == "application/json"
    body = request.json
    assert body["job_id"] == str(job_id) and body["state"] == "SUCCEEDED"
    assert body["attempts"] == 1 and body["error"] is None
    assert "4242" not in request.body.decode()


async def test_failures_are_retried_with_back_off_until_the_endpoint_recovers(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    with receiving(answers={"/flaky": [500, 503]}) as receiver:
        job_id = enqueue(engine, "report", on_complete_url=receiver.url("/flaky"))
        _cancel(engine, job_id)
        async with relay_running(db_url, amqp_url, topology, **FAST) as relay:
            # Each failure is on the row while the call waits for its next attempt.
            failed = await until(
                lambda: [d for d in _deliveries(pg, job_id) if d["last_status"] == 500],
                "the first failure recorded",
                60,
            )
            assert failed[0]["last_error"] == "HTTP 500" and failed[0]["state"] == "PENDING"
            call = await _settled(pg, job_id)
            await _counted(relay, "failed", 2)
        calls = receiver.requests("/flaky")
    assert (call["state"], call["attempts"], call["last_status"]) == ("DELIVERED", 3, 200)
    assert call["last_error"] is None
    assert len(calls) == 3
    assert len({c.headers["webhook-id"] for c in calls}) == 1  # one delivery, retried
    assert all(c.signature_valid(SECRET) for c in calls)
    # The back-off doubles: at least 0.3 s (less 10% jitter), then 0.6 s.
    assert calls[1].at - calls[0].at >= 0.27
    assert calls[2].at - calls[1].at >= 0.54


async def test_it_gives_up_after_the_bound_and_says_so(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    with receiving(default=500) as receiver:
        job_id = enqueue(engine, "report", on_complete_url=receiver.url("/down"))
        _cancel(engine, job_id)
        async with relay_running(
            db_url, amqp_url, topology, **FAST, webhook_max_attempts=3
        ) as relay:
            call = await _settled(pg, job_id)
            await _counted(relay, "gave_up", 1)
        assert len(receiver.requests("/down")) == 3
    assert (call["state"], call["attempts"], call["last_status"]) == ("GAVE_UP", 3, 500)
    assert call["gave_up_at"] is not None and call["last_error"] == "HTTP 500"


async def test_a_hanging_endpoint_holds_up_neither_other_endpoints_nor_wake_ups(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Also the regression of a claim that looked at the oldest due calls first and
    then left out the endpoints at their limit: a backlog of the hanging endpoint's
    calls larger than the look hid every other endpoint's call behind it."""
    monkeypatch.setattr(webhooks, "CLAIM_SCAN", 3)  # fewer than the hanging backlog
    registry = Registry()

    @registry.handler("work")
    def work(job: consumers.Job) -> None:
        return None

    # The hanging calls outlast the test (the timeout is longer than its patience),
    # so everything below happens while they still hang: no timing is assumed.
    with receiving(default="hang") as slow, receiving() as fast:
        hanging = [enqueue(engine, "report", on_complete_url=slow.url("/slow")) for _ in range(6)]
        for job_id in hanging:
            _cancel(engine, job_id)
        async with relay_running(
            db_url, amqp_url, topology, **FAST, webhook_timeout=200, webhook_per_endpoint=2
        ):
            await until(lambda: len(slow.requests("/slow")) == 2, "two calls hanging", 60)
            # Another endpoint's call goes through.
            other = enqueue(engine, "report", on_complete_url=fast.url("/fast"))
            _cancel(engine, other)
            assert (await _settled(pg, other))["state"] == "DELIVERED"
            # And the relay's wake-ups go out: a job runs.
            async with consumer_running(db_url, amqp_url, topology, registry):
                ran = enqueue(engine, "work")
                await wait_for_state(pg, ran, "SUCCEEDED", timeout=60)
            assert slow.in_flight["/slow"] == 2  # still hanging, both
            assert slow.most_in_flight["/slow"] == 2  # never more than per endpoint
            assert len(slow.requests("/slow")) == 2
            assert all(_delivery(pg, j)["state"] == "PENDING" for j in hanging)


async def test_a_call_whose_relay_is_killed_is_made_again_by_another(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    env = service_env(db_url, amqp_url, topology, WEBHOOK_SECRET=SECRET.decode())
    # Long enough that the call is still open when the relay is killed (the kill
    # follows the call's arrival within a poll of 50 ms); its lease (twice that) is
    # what the next relay waits out.
    args = ["--webhook-timeout", "5", "--webhook-allow-hosts", "127.0.0.1"]
    with receiving(answers={"/once": ["hang"]}) as receiver:
        job_id = enqueue(engine, "report", on_complete_url=receiver.url("/once"))
        _cancel(engine, job_id)
        with running("relay", args, env, "relay.started") as first:
            await until(lambda: receiver.requests("/once"), "the first call", 60)
            first.kill()  # kill -9, mid-call
        row = _delivery(pg, job_id)
        assert (row["state"], row["attempts"]) == ("PENDING", 1)
        assert row["lease_owner"] is not None
        receiver.release.set()  # the dead relay's call gets its answer, unheard
        with running("relay", args, env, "relay.started"):
            call = await _settled(pg, job_id)
        calls = receiver.requests("/once")
    assert (call["state"], call["attempts"], call["last_status"]) == ("DELIVERED", 2, 200)
    assert len(calls) == 2
    assert calls[0].headers["webhook-id"] == calls[1].headers["webhook-id"]
    assert calls[1].signature_valid(SECRET)


async def test_a_job_type_webhook_is_recorded_at_start_and_a_job_url_overrides_it(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    with receiving() as receiver:
        registry = Registry()

        @registry.handler("invoice", webhook=receiver.url("/type"))
        def invoice(job: consumers.Job) -> None:
            return None

        async with (
            relay_running(db_url, amqp_url, topology, **FAST),
            consumer_running(db_url, amqp_url, topology, registry),
        ):
            recorded = pg.execute(
                "SELECT url FROM job_type_webhooks WHERE job_type = 'invoice'"
            ).fetchone()
            assert recorded == (receiver.url("/type"),)
            by_type = enqueue(engine, "invoice")
            own = enqueue(engine, "invoice", on_complete_url=receiver.url("/own"))
            # A job of the type that ends without reaching a consumer is called about too.
            later = enqueue(engine, "invoice", run_after=timedelta(hours=1))
            _cancel(engine, later)
            for job_id in (by_type, own, later):
                assert (await _settled(pg, job_id))["state"] == "DELIVERED"
        by_path = {
            path: {r.json["job_id"] for r in receiver.requests(path)} for path in ("/type", "/own")
        }
    assert by_path == {"/type": {str(by_type), str(later)}, "/own": {str(own)}}

    # A consumer whose handler declares none any more removes the type's row.
    plain = Registry()

    @plain.handler("invoice")
    def invoice_again(job: consumers.Job) -> None:
        return None

    async with consumer_running(db_url, amqp_url, topology, plain):
        pass
    assert pg.execute("SELECT count(*) FROM job_type_webhooks").fetchone() == (0,)


async def test_a_url_on_a_private_address_is_not_called_unless_allowed(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    """A URL a producer took from its own user must not reach into the relay's
    network: a host that is not a public address is refused before any request,
    and the call's row says why."""
    with receiving() as receiver:
        job_id = enqueue(engine, "report", on_complete_url=receiver.url("/inside"))
        _cancel(engine, job_id)
        closed = {**FAST, "webhook_allow_hosts": "", "webhook_max_attempts": 1}
        async with relay_running(db_url, amqp_url, topology, **closed):
            call = await _settled(pg, job_id)
        assert receiver.requests("/inside") == []
    assert call["state"] == "GAVE_UP" and call["last_status"] is None
    assert "127.0.0.1 is 127.0.0.1, not a public address" in call["last_error"]
    assert "--webhook-allow-hosts" in call["last_error"]


async def test_without_a_secret_the_relay_makes_no_call(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No secret, no call. Most installations call no URL, so the relay says so
    quietly at start, and warns only while calls are owed."""
    monkeypatch.setattr(relay_service, "_OWED_CHECK_SECONDS", 0.2)
    monkeypatch.setattr(relay_service, "_OWED_WARN_SECONDS", 0.4)
    caplog.set_level(logging.INFO, logger="relay")

    def said(event: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage() == event]

    with receiving() as receiver:
        async with relay_running(db_url, amqp_url, topology, webhook_interval=0.2) as relay:
            target = relay.rounds["sweep"] + 3
            await until(lambda: relay.rounds["sweep"] >= target, "three sweeps", 60)
            assert [r.levelno for r in said("relay.webhooks_off")] == [logging.INFO]
            assert said("relay.webhook_calls_owed") == [], "nothing owed, nothing to warn of"
            job_id = enqueue(engine, "report", on_complete_url=receiver.url("/x"))
            _cancel(engine, job_id)
            # Its other chores run on; the call waits, unsigned calls are never made.
            await until(lambda: said("relay.webhook_calls_owed"), "a warning of the call owed", 60)
            (owed, *_) = said("relay.webhook_calls_owed")
            assert owed.levelno == logging.WARNING and owed.count == 1  # type: ignore[attr-defined]
            assert relay.webhooks is None
        assert receiver.requests("/x") == []
    assert _delivery(pg, job_id)["state"] == "PENDING"


def test_the_signature_is_an_hmac_of_the_timestamp_and_body() -> None:
    header = sign(b"k" * 16, 1700000000, b'{"a":1}')
    timestamp, mac = header.split(",")
    assert timestamp == "t=1700000000"
    expected = hmac.new(b"k" * 16, b'1700000000.{"a":1}', hashlib.sha256).hexdigest()
    assert mac == f"v1={expected}"


# ---------------------------------------------------------------- operating


# A token in a URL's path, as a chat service's incoming hook has: no operator
# surface shows it, only the endpoint.
TOKEN = "T0123-B4567-s3cr3tTok3n"


def _given_up(engine: Engine, pg: psycopg.Connection) -> tuple[uuid.UUID, int]:
    """A job whose call was made once, failed, and was given up (a bound of 1),
    through the relay's own statements."""
    job_id = enqueue(engine, "report", on_complete_url=f"https://down.example/hook/{TOKEN}")
    _cancel(engine, job_id)
    claim = {
        "relay": "relay-a",
        "limit": 1,
        "scan": 10,
        "per_endpoint": 4,
        "in_flight": "{}",
        "resting": [],
        "max_attempts": 1,
        "lease_seconds": 60,
    }
    ((delivery_id, *_),) = pg.execute(WEBHOOK_DELIVERY_CLAIM, claim).fetchall()
    outcome = {
        "delivery_id": delivery_id,
        "relay": "relay-a",
        "attempt": 1,
        "status": 503,
        "error": "HTTP 503",
        "max_attempts": 1,
        "backoff_base": 1,
        "backoff_cap": 1,
        "backoff_jitter": 0,
    }
    recorded = pg.execute(WEBHOOK_DELIVERY_FAILED, outcome).fetchone()
    assert recorded is not None and recorded[0] == "GAVE_UP"
    return job_id, delivery_id


def test_jobctl_lists_a_given_up_call_and_retries_it(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    job_id, delivery_id = _given_up(engine, pg)
    listed = jobctl("webhooks", "list", "--state", "gave_up", "--json", url=db_url, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    (call,) = json.loads(listed.stdout)["webhooks"]
    assert call["delivery_id"] == delivery_id and call["job_id"] == str(job_id)
    assert (call["state"], call["attempts"], call["last_status"]) == ("GAVE_UP", 1, 503)
    assert call["last_error"] == "HTTP 503"
    assert call["endpoint"] == "https://down.example"
    text = jobctl("webhooks", "list", url=db_url, cwd=tmp_path).stdout
    assert "GAVE_UP" in text and "HTTP 503" in text and "https://down.example" in text
    assert TOKEN not in listed.stdout + text

    retried = jobctl("webhooks", "retry", str(delivery_id), url=db_url, cwd=tmp_path)
    assert retried.returncode == 0, retried.stderr
    row = _delivery(pg, job_id)
    assert (row["state"], row["attempts"], row["gave_up_at"]) == ("PENDING", 0, None)
    again = jobctl("webhooks", "retry", str(delivery_id), url=db_url, cwd=tmp_path)
    assert again.returncode == 2 and "only GAVE_UP" in again.stderr
    missing = jobctl("webhooks", "retry", "999999", url=db_url, cwd=tmp_path)
    assert missing.returncode == 1 and "no webhook call" in missing.stderr


async def test_the_api_and_the_metrics_show_a_given_up_call(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    pool: AsyncConnectionPool[psycopg.AsyncConnection],
) -> None:
    job_id, delivery_id = _given_up(engine, pg)
    async with api_client(db_url) as api:
        listed = await api.get("/v1/webhooks", params={"state": "GAVE_UP"})
        assert listed.status_code == 200, listed.text
        assert [c["delivery_id"] for c in listed.json()] == [delivery_id]
        assert listed.json()[0]["endpoint"] == "https://down.example"
        assert TOKEN not in listed.text
        assert (await api.get("/v1/webhooks", params={"state": "LOST"})).status_code == 422
        by_job = await api.get("/v1/webhooks", params={"job_id": str(job_id)})
        assert [c["state"] for c in by_job.json()] == ["GAVE_UP"]

        collector = Collector(pool)
        assert await collector.collect_once()
        text = collector.render()[0].decode()
        assert 'hybrid_jobs_webhook_calls{state="GAVE_UP"} 1.0' in text
        assert 'hybrid_jobs_webhook_calls{state="DELIVERED"} 0.0' in text
        assert 'hybrid_jobs_webhook_failed_attempts{state="GAVE_UP"} 1.0' in text

        retried = await api.post(f"/v1/webhooks/{delivery_id}/retry")
        assert retried.status_code == 200, retried.text
        assert (retried.json()["state"], retried.json()["attempts"]) == ("PENDING", 0)
        assert (await api.post(f"/v1/webhooks/{delivery_id}/retry")).status_code == 422
        assert (await api.post("/v1/webhooks/999999/retry")).status_code == 404
