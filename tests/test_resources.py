"""Exclusive resources on real processes: at most one lease of a resource at once
however many consumers contend, a clean end of the lease (success, Permanent)
frees it for the next, and a lease that expires with its consumer killed leaves the
resource UNCERTAIN: the job goes to RETRY_WAIT as usual, nothing of the resource
starts (explain says since when and which job) while other resources run, until
outbox.resolve_resource, after which the waiting jobs run."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.async_api import expect
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.consumers.store import JobStore
from hybrid_jobs.jobctl.check import check
from hybrid_jobs.jobctl.metrics import Collector
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.plumbing.db import make_pool
from hybrid_jobs.relay.maintenance import OrphanWalk, wake_orphans
from hybrid_jobs.schema.queries import JOB_SWEEP_EXPIRED
from hybrid_jobs.schema.topology import Topology
from tests.apps.keys import OVERLAPS, RUNS_TABLE
from tests.support.api import api_client
from tests.support.dashboard import chromium, dashboard_served, sign_in
from tests.support.inproc import both_running
from tests.support.jobs import (
    enqueue,
    enqueue_many,
    job,
    until,
    until_started,
    wait_for_state,
    wait_until_all,
    wakeups,
)
from tests.support.metrics import Scrape
from tests.support.processes import fleet, jobctl, running
from tests.test_rewaker import relay_pool

pytestmark = pytest.mark.timeout(300)

# The `keyed` handler of tests.apps.keys records each run under payload.key: here,
# the job's resource.
APP = ["--app", "tests.apps.keys"]

# OVERLAPS: pairs of runs of one resource whose handler intervals overlap.


def on(resource: str, **payload: Any) -> dict[str, Any]:
    return {"key": resource, **payload}


def holds(pg: psycopg.Connection) -> list[tuple[Any, ...]]:
    return pg.execute(
        "SELECT resource, job_id, uncertain_since IS NOT NULL FROM resource_holds ORDER BY 1"
    ).fetchall()


def test_one_holder_at_a_time_across_consumers_and_job_types(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str], db_url: DatabaseUrl
) -> None:
    """Twelve jobs of one resource, in two queues, on two consumers with room for
    eight each, beside jobs of other resources: never two runs of a resource at
    once, no attempt spent on waiting, and no hold left."""
    pg.execute(RUNS_TABLE)
    hot = [
        NewJob("keyed", on("deploy:prod", seconds=0.1), queue=q, resource="deploy:prod")
        for q in ("default", "other")
        for _ in range(6)
    ]
    others = [
        NewJob("keyed", on(f"deploy:r{i}", seconds=0.2), resource=f"deploy:r{i}")
        for i in range(6)
        for _ in range(2)
    ]
    args = [*APP, "--concurrency", "8", "--queue", "default", "--queue", "other"]
    with fleet(env, args, consumers=2):
        ids = enqueue_many(engine, hot + others)
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(ids), timeout=180))
    assert pg.execute(OVERLAPS).fetchall() == []
    (runs,) = pg.execute("SELECT count(*) FROM key_runs WHERE key = 'deploy:prod'").fetchone()  # type: ignore[misc]
    assert runs == 12
    assert pg.execute("SELECT max(attempt_count) FROM jobs").fetchone() == (1,)
    assert holds(pg) == []
    assert check(db_url.conninfo)["resource_holds_without_their_lease"] == 0


async def test_explain_names_the_holder_and_a_clean_failure_frees_the_resource(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    registry = Registry()
    release = asyncio.Event()

    @registry.handler("deploy", max_attempts=1)
    async def deploy(j: consumers.Job) -> None:
        await release.wait()
        if (j.payload or {}).get("fail"):
            raise consumers.Permanent("target refused the build", code="REFUSED")

    async with both_running(db_url, amqp_url, topology, registry, concurrency=4):
        holder = enqueue(engine, "deploy", {"fail": True}, resource="deploy:prod")
        await wait_for_state(pg, holder, "RUNNING")
        waiting = enqueue(engine, "deploy", {}, resource="deploy:prod")
        # Turned down, and then without a wake-up: on a slow machine the re-waker
        # (1 s grace here) can put the wake-up the claim holds back in the backlog
        # first; sent again, it is turned down again and used up.
        await until(
            lambda: (
                job(pg, waiting)["delay_reason"] == "RESOURCE_BUSY" and wakeups(pg, waiting) == 0
            ),
            "turned down, its wake-up used up",
        )
        with Session(engine) as session:
            why = outbox.explain(session, waiting)
            assert why.codes == ["RESOURCE_BUSY"], why
            facts = why.blocker("RESOURCE_BUSY").facts  # type: ignore[union-attr]
            assert (facts["resource"], facts["held_by"]) == ("deploy:prod", holder)
            assert f"held by job {holder}" in why.summary
            # a live lease's hold is not the operator's to resolve
            with pytest.raises(outbox.NotUncertain, match="live lease"):
                outbox.resolve_resource(session, "deploy:prod", by="alice")
        assert holds(pg) == [("deploy:prod", holder, False)]
        release.set()
        # the holder fails for good, and the one waiting runs: woken by that end
        await wait_for_state(pg, waiting, "SUCCEEDED")
    assert job(pg, holder)["state"] == "FAILED"
    assert job(pg, waiting)["attempt_count"] == 1
    assert holds(pg) == []


def test_an_expired_lease_leaves_the_resource_uncertain_until_it_is_resolved(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str], db_url: DatabaseUrl
) -> None:
    """The holder's consumer is killed with SIGKILL mid-run: its lease expires, the
    job goes to RETRY_WAIT, and the resource stays held, uncertain. Neither its
    retry nor the job waiting behind it starts while a job of another resource
    runs; explain names the job and since when. resolve_resource records who and
    frees it: both then run, one at a time."""
    pg.execute(RUNS_TABLE)
    short = [*APP, "--lease-seconds", "3", "--heartbeat-seconds", "1", "--concurrency", "4"]
    relay = ["--sweep-interval", "0.5", "--rewake-interval", "3"]
    with running("relay", relay, env, "relay.started"):
        with running("consumer", short, env, "consumer.started") as killed:
            head = enqueue(
                engine, "keyed", on("deploy:prod", hang_once=True), resource="deploy:prod"
            )
            asyncio.run(until_started(pg, "key_runs", [head]))
            behind = enqueue(engine, "keyed", on("deploy:prod"), resource="deploy:prod")
            asyncio.run(
                until(lambda: job(pg, behind)["delay_reason"] == "RESOURCE_BUSY", "turned down")
            )
            killed.kill()
        asyncio.run(
            until(lambda: job(pg, head)["last_error_code"] == "LEASE_EXPIRED", "lease swept")
        )
        assert holds(pg) == [("deploy:prod", head, True)]
        assert check(db_url.conninfo)["resource_holds_without_their_lease"] == 0
        with running("consumer", short, env, "consumer.started"):
            # the head's retry comes due and is turned down, for the uncertain resource
            asyncio.run(
                until(
                    lambda: job(pg, head)["delay_reason"] == "RESOURCE_UNCERTAIN",
                    "the retry is turned down",
                )
            )
            elsewhere = enqueue(engine, "keyed", on("deploy:staging"), resource="deploy:staging")
            asyncio.run(wait_for_state(pg, elsewhere, "SUCCEEDED"))
            assert (job(pg, head)["state"], job(pg, behind)["state"]) == ("RETRY_WAIT", "QUEUED")
            (started,) = pg.execute(
                "SELECT count(*) FROM key_runs WHERE key = 'deploy:prod'"
            ).fetchone()  # type: ignore[misc]
            assert started == 1, "only the killed run started"
            # (no wake-up left from its refusal: see the test above)
            asyncio.run(until(lambda: wakeups(pg, behind) == 0, "its wake-up used up"))
            with Session(engine) as session:
                why = outbox.explain(session, behind)
            assert why.codes == ["RESOURCE_UNCERTAIN"], why
            facts = why.blocker("RESOURCE_UNCERTAIN").facts  # type: ignore[union-attr]
            assert (facts["resource"], facts["job"]) == ("deploy:prod", head)
            assert facts["since"] is not None
            assert "uncertain since" in why.summary
            with Session(engine) as session, session.begin():
                listed = outbox.resource_holds(session)
                assert [(h.resource, h.job_id, h.uncertain, h.waiting) for h in listed] == [
                    ("deploy:prod", head, True, 1)
                ]
                resolved = outbox.resolve_resource(
                    session, "deploy:prod", by="alice", outcome="rolled back by hand"
                )
            assert (resolved.job_id, resolved.uncertain_since) == (head, facts["since"])
            asyncio.run(wait_until_all(pg, "SUCCEEDED", 3, timeout=60))
    # the killed run never ended by its own clock; the two after it ran one at a time
    assert pg.execute("SELECT job_id FROM key_runs WHERE ended_at IS NULL").fetchall() == [(head,)]
    finished = OVERLAPS + " WHERE a.ended_at IS NOT NULL AND b.ended_at IS NOT NULL"
    assert pg.execute(finished).fetchall() == []
    assert holds(pg) == []
    rows = pg.execute(
        "SELECT resource, job_id, resolved_by, outcome FROM resource_resolutions"
    ).fetchall()
    assert rows == [("deploy:prod", head, "alice", "rolled back by hand")]


def test_resolving_a_free_resource_is_refused(engine: Engine) -> None:
    with (
        Session(engine) as session,
        session.begin(),
        pytest.raises(outbox.NotUncertain, match="is free"),
    ):
        outbox.resolve_resource(session, "deploy:prod")


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"resource": "r", "key": "k"}, ValueError, "a key or a resource"),
        ({"resource": ""}, ValueError, "resource"),
        ({"resource": 3}, TypeError, "resource"),
    ],
)
def test_bad_resource_arguments_raise_before_writing(
    engine: Engine, pg: psycopg.Connection, kwargs: dict[str, Any], error: type, text: str
) -> None:
    with Session(engine) as session, session.begin(), pytest.raises(error, match=text):
        outbox.enqueue(session, "t", {}, **kwargs)
    assert pg.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_enqueue_many_and_the_async_twin_take_a_resource(
    engine: Engine, pg: psycopg.Connection
) -> None:
    ids = enqueue_many(engine, [NewJob("t", {}, resource="deploy:a")])
    assert job(pg, ids[0])["resource"] == "deploy:a"
    assert "resource" in str(outbox.enqueue_async.__signature__)  # type: ignore[attr-defined]
    assert isinstance(ids[0], uuid.UUID)


def test_jobctl_lists_an_uncertain_resource_and_resolves_it(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    # the hold an expired lease leaves (see the test above for the real thing)
    holder = enqueue(engine, "t", {}, resource="deploy:prod", run_after=timedelta(hours=1))
    pg.execute(
        "INSERT INTO resource_holds (resource, job_id, lease_generation, uncertain_since)"
        " VALUES ('deploy:prod', %s, 1, now())",
        [holder],
    )
    waiting = enqueue(engine, "t", {}, resource="deploy:prod")
    pg.execute("DELETE FROM outbox WHERE job_id = %s", [waiting])
    listed = jobctl("resources", "list", "--json", url=db_url, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    (shown,) = json.loads(listed.stdout)["resources"]
    assert (shown["resource"], shown["job_id"], shown["waiting"]) == (
        "deploy:prod",
        str(holder),
        1,
    )
    assert shown["uncertain_since"] is not None
    text = jobctl("resources", "list", url=db_url, cwd=tmp_path)
    assert "UNCERTAIN since" in text.stdout, text.stdout
    done = jobctl("resources", "resolve", "deploy:prod", "--by", "bob", url=db_url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"left uncertain by job {holder}" in done.stdout
    assert pg.execute("SELECT resolved_by FROM resource_resolutions").fetchall() == [("bob",)]
    # freed, and the job waiting for it woken (it had no wake-up left)
    assert pg.execute("SELECT count(*) FROM resource_holds").fetchone() == (0,)
    assert pg.execute(
        "SELECT count(*) FROM outbox WHERE job_id = %s AND sent_at IS NULL", [waiting]
    ).fetchone() == (1,)
    again = jobctl("resources", "resolve", "deploy:prod", url=db_url, cwd=tmp_path)
    assert again.returncode == 1
    assert "is free" in again.stderr


async def test_the_api_enqueues_with_a_resource_and_the_dashboard_shows_it_uncertain(
    db_url: DatabaseUrl, pg: psycopg.Connection
) -> None:
    async with api_client(db_url) as client:
        sent = await client.post("/v1/jobs", json={"job_type": "deploy", "resource": "deploy:prod"})
        assert sent.status_code == 202, sent.text
        assert sent.json()["resource"] == "deploy:prod"
        both = await client.post(
            "/v1/jobs", json={"job_type": "deploy", "resource": "deploy:prod", "key": "k"}
        )
        assert both.status_code == 422, both.text
    (holder,) = pg.execute("SELECT job_id FROM jobs").fetchone()  # type: ignore[misc]
    pg.execute(
        "INSERT INTO resource_holds (resource, job_id, lease_generation, uncertain_since)"
        " VALUES ('deploy:prod', %s, 1, now())",
        [holder],
    )
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base, then="/keys")
        row = page.locator("[data-testid=resource-row][data-resource='deploy:prod']")
        await expect(row).to_have_attribute("data-uncertain", "true")
        await expect(row).to_contain_text("UNCERTAIN since")
        await page.goto(f"{served.base}/jobs/{holder}")
        await expect(page.get_by_test_id("job-resource")).to_contain_text("deploy:prod")
        blocker = page.locator("[data-testid=blocker][data-code=RESOURCE_UNCERTAIN]")
        await expect(blocker).to_have_count(1)


async def test_a_reconcile_hook_resolves_what_it_can_tell_and_leaves_the_rest(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    """A job of an uncertain resource is turned down; the consumer asks the hook of
    the type whose lease left it so. On deploy:prod the hook can tell (the resource
    is resolved, recorded as the hook's, and the job runs); on deploy:lab it cannot
    (None), and the resource stays uncertain, its job waiting."""
    registry = Registry()
    asked: list[consumers.Uncertain] = []
    ran: list[str] = []

    def look(hold: consumers.Uncertain) -> str | None:
        asked.append(hold)
        return "the target runs build 7" if hold.resource == "deploy:prod" else None

    @registry.handler("deploy", reconcile=look)
    async def deploy(j: consumers.Job) -> None:
        ran.append((j.payload or {})["to"])

    holders = {}
    for target in ("deploy:prod", "deploy:lab"):
        # the job whose lease expired holding it (see the kill -9 test for the real thing)
        holders[target] = enqueue(
            engine, "deploy", {"to": "never"}, resource=target, run_after=timedelta(hours=1)
        )
        pg.execute(
            "INSERT INTO resource_holds (resource, job_id, lease_generation, uncertain_since)"
            " VALUES (%s, %s, 1, now())",
            [target, holders[target]],
        )
    async with both_running(db_url, amqp_url, topology, registry, concurrency=4):
        prod = enqueue(engine, "deploy", {"to": "prod"}, resource="deploy:prod")
        lab = enqueue(engine, "deploy", {"to": "lab"}, resource="deploy:lab")
        await wait_for_state(pg, prod, "SUCCEEDED")
        await until(lambda: len(asked) == 2, "both resources asked about")
        assert job(pg, lab)["delay_reason"] == "RESOURCE_UNCERTAIN"
        await asyncio.sleep(0.5)
        assert job(pg, lab)["state"] == "QUEUED"
    assert ran == ["prod"]
    assert {(h.resource, h.job_id, h.job_type) for h in asked} == {
        ("deploy:prod", holders["deploy:prod"], "deploy"),
        ("deploy:lab", holders["deploy:lab"], "deploy"),
    }
    (by, outcome) = pg.execute(
        "SELECT resolved_by, outcome FROM resource_resolutions WHERE resource = 'deploy:prod'"
    ).fetchone()  # type: ignore[misc]
    assert by.startswith("reconcile (") and outcome == "the target runs build 7"
    assert holds(pg) == [("deploy:lab", holders["deploy:lab"], True)]


async def test_the_orphan_walk_leaves_a_job_waiting_for_its_resource_until_it_frees(
    pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """A job turned down for its resource has no wake-up on purpose: the end of the
    hold (or its resolution) wakes it. The orphan walk wakes it only once the hold
    is gone; while it stands the job would be turned down again, once per lap."""
    busy, uncertain = uuid.uuid4(), uuid.uuid4()
    pg.execute(
        "INSERT INTO jobs (job_id, job_type, resource, delay_reason) VALUES"
        " (%s, 't', 'r1', 'RESOURCE_BUSY'), (%s, 't', 'r2', 'RESOURCE_UNCERTAIN')",
        [busy, uncertain],
    )
    pg.execute(
        "INSERT INTO resource_holds (resource, job_id, lease_generation, uncertain_since)"
        " VALUES ('r1', gen_random_uuid(), 1, NULL), ('r2', gen_random_uuid(), 1, now())"
    )
    # a hold of no live lease that is not uncertain is a leak, and jobctl check says so
    assert check(db_url.conninfo)["resource_holds_without_their_lease"] == 1
    pool = relay_pool(db_url)
    await pool.open()
    try:
        assert await wake_orphans(pool, OrphanWalk(), grace=0, size=100, worker_ttl=60) == []
        pg.execute("DELETE FROM resource_holds")
        found = await wake_orphans(pool, OrphanWalk(), grace=0, size=100, worker_ttl=60)
    finally:
        await pool.close()
    assert sorted(job_id for job_id, _queue in found) == sorted([busy, uncertain])


async def test_the_sweep_of_an_expired_holder_is_counted_uncertain_in_the_metrics(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """The claim's and the sweeper's own statements: a lease of a second runs out,
    the sweep moves the job to RETRY_WAIT and leaves its resource uncertain, and
    hybrid_jobs_resources_uncertain says so until it is resolved."""
    registry = Registry()

    @registry.handler("deploy")
    async def deploy(j: consumers.Job) -> None:
        return None

    held = enqueue(engine, "deploy", {}, resource="deploy:prod")
    pool = make_pool(db_url, "test-resources", 2)
    await pool.open()
    try:
        store = JobStore(pool, "a-worker", lease_seconds=0.2)
        claimed = await store.claim(
            [held], registry.claim_terms(), queues=registry.queues(), free_threads=0, worker_ttl=60
        )
        assert [c.job_id for c in claimed.claimed] == [held]
        collector = Collector(pool)
        assert await collector.collect_once()
        assert Scrape(collector).value("hybrid_jobs_resources_uncertain") == 0
        await asyncio.sleep(0.3)
        swept = pg.execute(JOB_SWEEP_EXPIRED, {"limit": 10, "default_backoff": 5}).fetchall()
        assert [(r[0], r[1]) for r in swept] == [(held, "RETRY_WAIT")]
        assert holds(pg) == [("deploy:prod", held, True)]
        assert await collector.collect_once()
        assert Scrape(collector).value("hybrid_jobs_resources_uncertain") == 1
        with Session(engine) as session, session.begin():
            outbox.resolve_resource(session, "deploy:prod", by="alice")
        assert await collector.collect_once()
        assert Scrape(collector).value("hybrid_jobs_resources_uncertain") == 0
    finally:
        await pool.close()
