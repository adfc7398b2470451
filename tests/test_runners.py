"""Authorized runners (issue 19 item 5): a dedicated tenant's jobs are claimed only by
consumers started with ``--tenant`` naming it; they wait as NO_AUTHORIZED_RUNNER
while none is live, and start when one appears. Other tenants are unaffected."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.metrics.queries import METRICS_JOBS_NO_AUTHORIZED_RUNNER
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema.queries.fragments import REFUSAL_BACKSTOP_SECONDS
from tests.support.api import api_client
from tests.support.jobs import attempts, enqueue, job, until
from tests.support.processes import ROOT, fleet, jobctl, running

APP = ["--app", "tests.apps.basic"]
# The relay's backstops as often as they go: none may hand a dedicated tenant's job
# to a consumer that does not name it.
EAGER_RELAY = ["--rewake-interval", "0.2"]


def _dedicate(engine: Engine, tenant: str) -> None:
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, tenant, runners="dedicated")


def _explain(engine: Engine, job_id: uuid.UUID) -> outbox.Explanation:
    with Session(engine) as session:
        return outbox.explain(session, job_id)


def _workers_of(pg: psycopg.Connection, job_id: uuid.UUID) -> set[str]:
    return {a["worker"] for a in attempts(pg, job_id)}


def _succeeded(pg: psycopg.Connection, ids: list[uuid.UUID]) -> bool:
    return all(job(pg, i)["state"] == "SUCCEEDED" for i in ids)


def _wakeups(pg: psycopg.Connection, job_id: uuid.UUID) -> int:
    row = pg.execute("SELECT count(*) FROM outbox WHERE job_id = %s", [job_id]).fetchone()
    assert row is not None
    return int(row[0])


def test_a_dedicated_tenant_waits_for_its_own_consumer_and_runs_only_there(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    _dedicate(engine, "acme")
    with fleet(env, APP, relay_args=EAGER_RELAY) as (_, (shared,)):
        shared_id = shared.wait_for_event("consumer.started")["worker"]
        acme = [enqueue(engine, "echo", {"n": n}, tenant="acme") for n in range(5)]
        others = [enqueue(engine, "echo", {"n": n}, tenant="beta") for n in range(5)]
        others += [enqueue(engine, "echo", {"n": n}) for n in range(5)]
        asyncio.run(until(lambda: _succeeded(pg, others), "the other tenants run", 30))
        asyncio.run(
            until(
                lambda: all(job(pg, i)["delay_reason"] == "NO_AUTHORIZED_RUNNER" for i in acme),
                "acme's jobs refused by the consumer that does not name it",
                30,
            )
        )
        time.sleep(1.5)  # the relay's re-waker and orphan walk go round meanwhile
        for i in acme:
            row = job(pg, i)
            assert (row["state"], row["attempt_count"]) == ("QUEUED", 0), row
            assert _wakeups(pg, i) == 0, "parked: no wake-up goes round to the wrong consumer"
        waiting = pg.execute(METRICS_JOBS_NO_AUTHORIZED_RUNNER).fetchall()
        assert waiting == [("default", 5)], "the metrics count them"
        why = _explain(engine, acme[0])
        assert why.codes == ["NO_AUTHORIZED_RUNNER"], why
        assert why.blocker("NO_AUTHORIZED_RUNNER").facts == {  # type: ignore[union-attr]
            "tenant": "acme",
            "handlers_on_queue": 1,
            "parked": True,
        }

        with running("consumer", [*APP, "--tenant", "acme"], env, "consumer.started") as own:
            own_id = own.wait_for_event("consumer.started")["worker"]
            t0 = time.monotonic()
            asyncio.run(until(lambda: _succeeded(pg, acme), "acme's jobs run on its consumer", 30))
            # more of both, with both consumers live: acme's go only to its own
            later = [enqueue(engine, "echo", {"n": n}, tenant="acme") for n in range(20)]
            more = [enqueue(engine, "echo", {"n": n}, tenant="beta") for n in range(20)]
            t1 = time.monotonic()
            asyncio.run(until(lambda: _succeeded(pg, later + more), "all of them run", 30))
            # wake-ups that met the other consumer are brought forward as soon as acme's
            # has room (OUTBOX_WAKE_REFUSED), well before the refusal backstop
            assert time.monotonic() - t1 < REFUSAL_BACKSTOP_SECONDS / 2, "not left to the backstop"
            assert t1 - t0 < REFUSAL_BACKSTOP_SECONDS, "woken when their consumer announced itself"
            assert _explain(engine, later[0]).codes == []
    for i in acme + later:
        assert _workers_of(pg, i) == {own_id}, "only the consumer naming acme took its jobs"
        assert len(attempts(pg, i)) == 1
    assert all(_workers_of(pg, i) <= {own_id, shared_id} for i in others + more)
    assert {w for i in others for w in _workers_of(pg, i)} == {shared_id}


def test_a_consumer_naming_a_tenant_serves_shared_ones_too(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    _dedicate(engine, "acme")
    with fleet(env, [*APP, "--tenant", "acme"], relay_args=EAGER_RELAY) as (_, (own,)):
        own_id = own.wait_for_event("consumer.started")["worker"]
        ids = [enqueue(engine, "echo", {}, tenant=t) for t in ("acme", "beta", None)]
        asyncio.run(until(lambda: _succeeded(pg, ids), "every tenant runs on it", 30))
        tenants = pg.execute(
            "SELECT tenants FROM workers WHERE worker_id = %s", [own_id]
        ).fetchone()
    assert tenants == (["acme"],), "the consumer's row names its tenants"
    assert all(_workers_of(pg, i) == {own_id} for i in ids)


def test_a_tenant_made_shared_again_is_taken_by_any_consumer(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    _dedicate(engine, "acme")
    with (
        running("relay", EAGER_RELAY, env, "relay.started"),
        running("consumer", APP, env, "consumer.started"),
    ):
        waiting = enqueue(engine, "echo", {}, tenant="acme")
        asyncio.run(
            until(lambda: job(pg, waiting)["delay_reason"] == "NO_AUTHORIZED_RUNNER", "refused", 30)
        )
        with Session(engine) as session, session.begin():
            outbox.set_tenant_limit(session, "acme", runners="shared")
        # the relay's orphan walk wakes it once nothing holds it back
        asyncio.run(until(lambda: job(pg, waiting)["state"] == "SUCCEEDED", "it runs", 60))


def test_runners_is_checked(engine: Engine) -> None:
    with Session(engine) as session, pytest.raises(ValueError, match="runners"):
        outbox.set_tenant_limit(session, "acme", runners="mine")


def test_jobctl_sets_and_shows_a_dedicated_tenant(db_url: DatabaseUrl) -> None:
    done = jobctl("tenants", "set", "acme", "--runners", "dedicated", url=db_url, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "dedicated" in done.stdout
    # a limit not given stays as it was
    done = jobctl("tenants", "set", "acme", "--max-running", "3", url=db_url, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    done = jobctl("tenants", "list", "--json", url=db_url, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    (shown,) = json.loads(done.stdout)["tenants"]
    assert (shown["tenant"], shown["runners"], shown["max_running"]) == ("acme", "dedicated", 3)


async def test_the_api_sets_and_shows_a_dedicated_tenant(db_url: DatabaseUrl) -> None:
    async with api_client(db_url) as client:
        put = await client.put("/v1/tenants/acme", json={"runners": "dedicated"})
        assert put.status_code == 201, put.text
        assert put.json()["runners"] == "dedicated"
        bad = await client.put("/v1/tenants/acme", json={"runners": "mine"})
        assert bad.status_code == 422
        listed = (await client.get("/v1/tenants")).json()
        assert [(t["tenant"], t["runners"]) for t in listed["tenants"]] == [("acme", "dedicated")]
        # a PUT replaces all of the limits: left out, runners goes back to shared
        again = await client.put("/v1/tenants/acme", json={"max_running": 2})
        assert again.json()["runners"] == "shared"
