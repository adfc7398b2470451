"""A concurrency limit of a job type (a handler's ``global_limit``), as a gate: at
most that many leases of the type at once, across every consumer; a job turned down
for it takes nothing from another gate; every end of a lease gives its slot back and
wakes the next; any end of a woken waiter that never ran passes its turn on; and a
job of no limited type pays for none of it. Each test names what it guards."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.async_api import expect
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers.outcome import Outcome
from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.consumers.store import JobStore, finish_params
from hybrid_jobs.jobctl.check import check, violations
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.queries import WORKER_TTL_SECONDS
from tests.support.api import api_client
from tests.support.dashboard import CHROMIUM, chromium, dashboard_served, sign_in
from tests.support.interleave import waits_behind
from tests.support.jobs import enqueue, job
from tests.support.metrics import scrape_once
from tests.support.processes import jobctl

_REGISTRY = Registry()


@_REGISTRY.handler("capped", global_limit=2, max_attempts=3)
async def _capped(job: consumers.Job) -> None:
    return None


@_REGISTRY.handler("capped_rated", global_limit=1, rate_limit="api")
async def _capped_rated(job: consumers.Job) -> None:
    return None


@_REGISTRY.handler("noop")
async def _noop(job: consumers.Job) -> None:
    return None


CLAIM = q.job_claim_many({"concurrency"})


def _params(ids: list[uuid.UUID], worker: str = "w1") -> dict[str, Any]:
    return {
        "job_ids": list(ids),
        "types": json.dumps(_REGISTRY.claim_terms()),
        "free_threads": 0,
        "concurrency": 10,
        "free_slots": 10,
        "worker": worker,
        "lease_seconds": 30,
        "worker_ttl": WORKER_TTL_SECONDS,
        "tenants": [],
        "queues": _REGISTRY.queues(),
    }


def _claim(
    pg: psycopg.Connection, ids: list[uuid.UUID], worker: str = "w1", statement: str = CLAIM
) -> dict[uuid.UUID, str]:
    rows = pg.execute(statement, _params(ids, worker)).fetchall()
    return {row[1]: row[0] for row in rows}


def _record(pg: psycopg.Connection) -> None:
    pg.execute(
        q.CONCURRENCY_LIMIT_RECORD_MANY,
        {"limits": json.dumps(_REGISTRY.limits()), "worker": "w0"},
    )


def _running(pg: psycopg.Connection, job_type: str = "capped") -> int:
    row = pg.execute(
        "SELECT running FROM concurrency_limits WHERE job_type = %s", [job_type]
    ).fetchone()
    assert row is not None
    return int(row[0])


def _pending(pg: psycopg.Connection, job_id: uuid.UUID) -> int:
    row = pg.execute(
        "SELECT count(*) FROM outbox WHERE job_id = %s AND sent_at IS NULL", [job_id]
    ).fetchone()
    assert row is not None
    return int(row[0])


def _sent(pg: psycopg.Connection, ids: list[uuid.UUID]) -> None:
    # as the relay marks them: the wake-ups are on their way
    pg.execute("UPDATE outbox SET sent_at = now() WHERE job_id = ANY(%s)", [ids])


def _waiting_for_the_limit(
    engine: Engine, pg: psycopg.Connection, n: int
) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    """Two holders of the limit of 2, and ``n`` jobs turned down for it while it
    was full: they wait without a wake-up."""
    _record(pg)
    holders = [enqueue(engine, "capped") for _ in range(2)]
    assert set(_claim(pg, holders).values()) == {"claimed"}
    waiting = [enqueue(engine, "capped") for _ in range(n)]
    _sent(pg, waiting)
    assert set(_claim(pg, waiting, "w2").values()) == {"CONCURRENCY_LIMIT"}
    assert [_pending(pg, w) for w in waiting] == [0] * n
    return holders, waiting


def test_a_limit_admits_no_more_than_its_free_slots_across_workers(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _record(pg)
    ids = [enqueue(engine, "capped") for _ in range(5)]
    _sent(pg, ids)
    got = _claim(pg, ids)
    assert sorted(got.values()) == ["CONCURRENCY_LIMIT"] * 3 + ["claimed"] * 2
    assert _running(pg) == 2
    # turned down past this batch's share while the limit had room: their wake-ups
    # came back, and the next claim, another worker's, finds the limit full
    refused = [i for i, s in got.items() if s != "claimed"]
    assert [_pending(pg, i) for i in refused] == [1, 1, 1]
    _sent(pg, refused)
    assert set(_claim(pg, refused, "w2").values()) == {"CONCURRENCY_LIMIT"}
    assert _running(pg) == 2
    # now nothing polls the full limit: no wake-up until a lease of the type ends
    assert [_pending(pg, i) for i in refused] == [0, 0, 0]
    assert pg.execute(
        "SELECT count(*) FROM jobs WHERE job_type = 'capped' AND limit_held"
    ).fetchone() == (2,)
    assert {job(pg, i)["attempt_count"] for i in refused} == {0}


def test_a_type_first_claimed_before_its_consumer_recorded_the_limit_gets_its_row(
    engine: Engine, pg: psycopg.Connection
) -> None:
    first = enqueue(engine, "capped")
    assert _claim(pg, [first]) == {first: "locked"}
    assert pg.execute(
        "SELECT max_running, running FROM concurrency_limits WHERE job_type = 'capped'"
    ).fetchone() == (2, 0)
    assert _claim(pg, [first]) == {first: "claimed"}
    assert _running(pg) == 1


def test_a_job_the_limit_turns_down_takes_no_rate_token_and_no_tenant_slot(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _record(pg)
    with Session(engine) as session, session.begin():
        outbox.set_rate_limit(session, "api", rate=5, per=timedelta(minutes=1), burst=5)
        outbox.set_tenant_limit(session, "acme", max_running=5)
    holder = enqueue(engine, "capped_rated", tenant="acme")
    assert _claim(pg, [holder], statement=q.job_claim_many({"concurrency", "rate"})) == {
        holder: "claimed"
    }

    def tokens() -> float:
        (level,) = pg.execute("SELECT tokens FROM rate_buckets WHERE name = 'api'").fetchone()  # type: ignore[misc]
        return float(level)

    def slots() -> int:
        (n,) = pg.execute("SELECT running FROM tenant_usage WHERE tenant = 'acme'").fetchone()  # type: ignore[misc]
        return int(n)

    before = (tokens(), slots(), _running(pg, "capped_rated"))
    assert before[1:] == (1, 1)
    refused = enqueue(engine, "capped_rated", tenant="acme")
    assert _claim(pg, [refused], statement=q.job_claim_many({"concurrency", "rate"})) == {
        refused: "CONCURRENCY_LIMIT"
    }
    assert tokens() == pytest.approx(before[0], abs=0.01), "a refused job spent a token"
    assert (slots(), _running(pg, "capped_rated")) == (1, 1), "a refused job took a slot"


def test_a_job_another_gate_turns_down_takes_no_slot_of_the_limit(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _record(pg)
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_running=1)
    busy = enqueue(engine, "noop", tenant="acme")
    assert _claim(pg, [busy]) == {busy: "claimed"}
    capped = enqueue(engine, "capped", tenant="acme")
    assert _claim(pg, [capped]) == {capped: "TENANT_CAP"}
    assert _running(pg) == 0
    assert not job(pg, capped)["limit_held"]


@pytest.mark.parametrize("ending", ["succeeded", "failed", "retry", "cancelled", "expired"])
def test_every_end_of_a_lease_gives_the_slot_back_and_wakes_the_next(
    engine: Engine, pg: psycopg.Connection, ending: str
) -> None:
    holders, waiting = _waiting_for_the_limit(engine, pg, 3)
    holder = holders[0]
    generation = job(pg, holder)["lease_generation"]
    if ending == "expired":
        pg.execute(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = %s",
            [holder],
        )
        swept = pg.execute(q.JOB_SWEEP_EXPIRED, {"limit": 100, "default_backoff": 1.0}).fetchall()
        assert [row[0] for row in swept] == [holder]
    else:
        outcome = {
            "succeeded": Outcome.succeeded(),
            "failed": Outcome.failed("BAD_INPUT", "no"),
            "retry": Outcome.retry("RuntimeError", "again", 5.0),
            "cancelled": Outcome.cancelled("asked to"),
        }[ending]
        rows = pg.execute(
            q.JOB_FINISH_MANY, finish_params("w1", [(holder, generation, outcome)])
        ).fetchall()
        assert len(rows) == 1 and rows[0][1] != "LOCKED"
    assert _running(pg) == 1
    assert not job(pg, holder)["limit_held"]
    # one slot freed: one waiter woken, the oldest, and no more
    woken = [w for w in waiting if _pending(pg, w)]
    assert woken == [min(waiting)]
    assert set(_claim(pg, woken, "w2").values()) == {"claimed"}
    assert _running(pg) == 2


def test_a_give_back_at_a_graceful_stop_gives_the_slot_back(
    engine: Engine, pg: psycopg.Connection
) -> None:
    holders, waiting = _waiting_for_the_limit(engine, pg, 1)
    generation = job(pg, holders[0])["lease_generation"]
    rows = pg.execute(
        q.JOB_GIVE_BACK_MANY,
        {
            "jobs": json.dumps([{"job_id": str(holders[0]), "generation": generation}]),
            "worker": "w1",
        },
    ).fetchall()
    assert [row[1] for row in rows] == ["QUEUED"]
    assert _running(pg) == 1
    assert _pending(pg, waiting[0]) == 1


def test_a_woken_waiter_that_ends_before_it_ran_passes_its_turn_on(
    engine: Engine, pg: psycopg.Connection
) -> None:
    holders, waiting = _waiting_for_the_limit(engine, pg, 3)
    generation = job(pg, holders[0])["lease_generation"]
    pg.execute(
        q.JOB_FINISH_MANY, finish_params("w1", [(holders[0], generation, Outcome.succeeded())])
    )
    (first,) = [w for w in waiting if _pending(pg, w)]
    with Session(engine) as session, session.begin():
        outbox.request_cancel(session, first)
    assert job(pg, first)["state"] == "CANCELLED"
    # its turn went on to the next, exactly one
    nexts = [w for w in waiting if w != first and _pending(pg, w)]
    assert len(nexts) == 1
    assert set(_claim(pg, nexts, "w2").values()) == {"claimed"}
    assert _running(pg) == 2


def test_pausing_the_queue_of_the_woken_waiter_passes_its_turn_on(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """A freed slot woke the oldest waiter; its queue is paused before the relay
    sends the wake-up, which the relay then holds until the resume. The slot idled
    while a waiter of a running queue had no wake-up. The pause passes the turn on,
    to as many as the paused queue's woken waiters, and the paused one keeps its
    wake-up for the resume."""
    _record(pg)
    holders = [enqueue(engine, "capped") for _ in range(2)]
    assert set(_claim(pg, holders).values()) == {"claimed"}
    paused = enqueue(engine, "capped", queue="reports")
    runnable = [enqueue(engine, "capped") for _ in range(2)]
    waiting = [paused, *runnable]
    _sent(pg, waiting)
    params = {**_params(waiting, "w2"), "queues": ["default", "reports"]}
    turned_down = {r[1]: r[0] for r in pg.execute(CLAIM, params).fetchall()}
    assert set(turned_down.values()) == {"CONCURRENCY_LIMIT"}
    generation = job(pg, holders[0])["lease_generation"]
    pg.execute(
        q.JOB_FINISH_MANY, finish_params("w1", [(holders[0], generation, Outcome.succeeded())])
    )
    assert [_pending(pg, w) for w in waiting] == [1, 0, 0], "the oldest, of a running queue"
    with Session(engine) as session, session.begin():
        outbox.pause_queue(session, "reports")
    assert [_pending(pg, w) for w in waiting] == [1, 1, 0]
    assert set(_claim(pg, [runnable[0]], "w2").values()) == {"claimed"}
    assert _running(pg) == 2


def test_a_stale_outcome_of_an_expired_holder_gives_back_no_second_slot(
    engine: Engine, pg: psycopg.Connection
) -> None:
    holders, waiting = _waiting_for_the_limit(engine, pg, 1)
    generation = job(pg, holders[0])["lease_generation"]
    pg.execute(
        "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = %s",
        [holders[0]],
    )
    pg.execute(q.JOB_SWEEP_EXPIRED, {"limit": 100, "default_backoff": 0.0})
    assert _running(pg) == 1
    _sent(pg, waiting)
    assert _claim(pg, waiting, "w2") == {waiting[0]: "claimed"}
    assert _running(pg) == 2
    # the frozen holder wakes up and reports: its fence matches nothing
    rows = pg.execute(
        q.JOB_FINISH_MANY, finish_params("w1", [(holders[0], generation, Outcome.succeeded())])
    ).fetchall()
    assert rows == []
    assert _running(pg) == 2


def test_a_raised_limit_wakes_as_many_waiters_as_it_has_new_slots(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _, waiting = _waiting_for_the_limit(engine, pg, 3)
    changed = pg.execute(
        q.CONCURRENCY_LIMIT_RECORD_MANY,
        {"limits": json.dumps([{"job_type": "capped", "global_limit": 4}]), "worker": "w9"},
    ).fetchall()
    assert changed == [("capped",)]
    assert sum(_pending(pg, w) for w in waiting) == 2
    rows = pg.execute(q.CONCURRENCY_LIMIT_LIST, {"limit": 1000}).fetchall()
    assert [(r[0], r[1], r[2], r[3], r[5]) for r in rows] == [
        ("capped", 4, 2, 3, "w9"),
        ("capped_rated", 1, 0, 0, "w0"),
    ]


def test_a_job_of_no_limited_type_pays_for_none_of_it() -> None:
    # the plain claim and the plain outcome keep no SQL of the limit: its table,
    # its terms, its steps
    for statement in (q.JOB_CLAIM_PLAIN_MANY, q.JOB_FINISH_PLAIN_MANY):
        assert "concurrency_limits" not in statement
        assert "global_limit" not in statement
        assert "limit_wake" not in statement and "limit_woken" not in statement
    # and a claim composed for another gate has none of its steps either
    assert "concurrency_limits" not in q.job_claim_many({"key"})
    assert "concurrency_limits" not in q.job_finish_many({"key"})


async def test_the_store_claims_a_limited_type_through_the_gate_and_its_outcome_releases(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    _record(pg)
    plain = enqueue(engine, "noop")
    capped = [enqueue(engine, "capped") for _ in range(3)]
    _sent(pg, [plain, *capped])
    async with AsyncConnectionPool(
        db_url.conninfo, min_size=1, max_size=2, connection_class=AsyncConnection, open=False
    ) as pool:
        store = JobStore(pool, "w1", 30)
        got = await store.claim(
            [plain, *capped],
            _REGISTRY.claim_terms(),
            queues=_REGISTRY.queues(),
            free_threads=0,
            worker_ttl=WORKER_TTL_SECONDS,
        )
        gates = {c.job_id: c.gates for c in got.claimed}
        assert gates[plain] == frozenset()
        assert len(gates) == 3
        assert all(g == frozenset({"concurrency"}) for i, g in gates.items() if i != plain)
        assert sorted(got.missed.values()) == ["CONCURRENCY_LIMIT"]
        assert _running(pg) == 2
        done = [c for c in got.claimed if c.job_id != plain]
        finished = await store.finish(
            [(c.job_id, c.generation, Outcome.succeeded()) for c in done],
            frozenset({"concurrency"}),
        )
        assert set(finished.applied.values()) == {"SUCCEEDED"}
    assert _running(pg) == 0
    # the one past the batch's share got its wake-up back (one, not two)
    (waiter,) = got.missed
    assert _pending(pg, waiter) == 1


def test_explain_names_the_limit_a_waiting_job_waits_for(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _, waiting = _waiting_for_the_limit(engine, pg, 1)
    with Session(engine) as session:
        why = outbox.explain(session, waiting[0])
    assert "CONCURRENCY_LIMIT" in why.codes, why
    assert why.blocker("CONCURRENCY_LIMIT").facts == {  # type: ignore[union-attr]
        "job_type": "capped",
        "running": 2,
        "global_limit": 2,
    }
    assert "concurrency limit" in why.summary


def test_jobctl_limits_shows_each_limit_with_its_running_and_waiting_jobs(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    _waiting_for_the_limit(engine, pg, 3)
    text = jobctl("limits", url=db_url, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "GLOBAL LIMIT" in text.stdout
    (line,) = [x for x in text.stdout.splitlines() if x.startswith("capped ")]
    assert line.split() == ["capped", "2", "2", "3", "w0"]
    shown = json.loads(jobctl("limits", "--json", url=db_url, cwd=tmp_path).stdout)
    assert [
        (c["job_type"], c["global_limit"], c["running"], c["waiting"])
        for c in shown["concurrency_limits"]
    ] == [("capped", 2, 2, 3), ("capped_rated", 1, 0, 0)]


async def test_the_api_and_the_dashboard_show_each_limit_with_its_running_and_waiting_jobs(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    _waiting_for_the_limit(engine, pg, 3)
    with Session(engine) as session, session.begin():
        outbox.set_rate_limit(session, "stripe", rate=5)
    async with api_client(db_url) as client:
        answer = await client.get("/v1/limits")
    assert answer.status_code == 200, answer.text
    shown = answer.json()
    assert [
        (c["job_type"], c["global_limit"], c["running"], c["waiting"], c["updated_by"])
        for c in shown["concurrency_limits"]
    ] == [("capped", 2, 2, 3, "w0"), ("capped_rated", 1, 0, 0, "w0")]
    assert [(r["name"], r["rate"], r["burst"]) for r in shown["rate_limits"]] == [
        ("stripe", 5.0, 5.0)
    ]

    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed")
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base)
        await page.get_by_role("link", name="Keys & limits").click()
        capped = page.locator("[data-testid=concurrency-limit-row][data-job-type=capped]")
        await expect(capped.locator("td").nth(0)).to_have_text("2 / 2")
        await expect(capped.get_by_test_id("limit-waiting")).to_have_text("3")
        await expect(capped).to_contain_text("w0")
        await page.screenshot(path=str(tmp_path / "limits.png"), full_page=True)
        # The type's name opens its jobs.
        await capped.get_by_role("link", name="capped").click()
        await expect(page).to_have_url(f"{served.base}/jobs?job_type=capped")


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3", 10_000_001])
def test_a_global_limit_is_a_bounded_positive_int(bad: Any) -> None:
    registry = Registry()
    with pytest.raises(ValueError, match="global_limit"):
        registry.handler("t", global_limit=bad)


async def test_the_metrics_count_the_jobs_waiting_for_a_concurrency_limit(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    _waiting_for_the_limit(engine, pg, 3)
    scrape = await scrape_once(db_url, "test-concurrency-metrics")
    name = "hybrid_jobs_jobs_waiting_for_concurrency_limit"
    assert scrape.value(name, queue="default") == 3


def test_jobctl_check_finds_a_limits_slot_leaked_or_released_twice(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    _waiting_for_the_limit(engine, pg, 1)
    assert check(db_url.conninfo)["limit_slots_leaked_or_released_twice"] == 0
    pg.execute("UPDATE concurrency_limits SET running = 1 WHERE job_type = 'capped'")
    assert violations(check(db_url.conninfo))["limit_slots_leaked_or_released_twice"] == 1


def test_a_waiter_turned_down_while_a_slot_was_being_given_back_is_woken(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """A claim turns a job down for the full limit, the type's row locked. An end
    of a lease that began meanwhile waits for that lock, then gives its slot back
    and looks for waiters in the jobs as they were when it began: the job was not
    turned down yet, so it was not found, and it waited with no wake-up, the slot
    free, until the orphan walk. The waiters are read as they are once the row is
    locked."""
    _record(pg)
    holders = [enqueue(engine, "capped") for _ in range(2)]
    assert set(_claim(pg, holders).values()) == {"claimed"}
    late = enqueue(engine, "capped")
    _sent(pg, [late])
    generation = job(pg, holders[0])["lease_generation"]

    def turned_down(claimer: psycopg.Connection) -> None:
        assert _claim(claimer, [late], "w2") == {late: "CONCURRENCY_LIMIT"}

    ending = waits_behind(
        db_url,
        pg,
        turned_down,
        q.JOB_FINISH_MANY,
        finish_params("w1", [(holders[0], generation, Outcome.succeeded())]),
    )
    assert [row[1] for row in ending] == ["SUCCEEDED"]
    assert _running(pg) == 1
    assert _pending(pg, late) == 1, "the slot came back: the job turned down for it is woken"


def test_a_job_heavier_than_the_whole_limit_or_cap_says_it_cannot_start(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """A job weighing more than its type's whole limit, or its tenant's whole cap,
    can never start: no end of a lease makes room that is not there. explain said
    the limit was full (0/2 running) and left the rest to be guessed; it says why
    now, and a handler whose own weight is more than its own limit is refused."""
    _record(pg)
    heavy = enqueue(engine, "capped", weight=3)
    _sent(pg, [heavy])
    weighed = q.job_claim_many({"concurrency", "weight"})
    assert _claim(pg, [heavy], statement=weighed) == {heavy: "CONCURRENCY_LIMIT"}
    with Session(engine) as session:
        why = outbox.explain(session, heavy)
    assert "more than job type 'capped''s whole concurrency limit of 2" in why.summary
    assert "cannot start until the limit is raised" in why.summary

    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_running=2)
    over_cap = enqueue(engine, "noop", tenant="acme", weight=3)
    _sent(pg, [over_cap])
    assert _claim(pg, [over_cap], statement=weighed) == {over_cap: "TENANT_CAP"}
    with Session(engine) as session:
        why = outbox.explain(session, over_cap)
    assert "more than tenant 'acme''s whole cap of 2" in why.summary, why.summary

    with pytest.raises(ValueError, match="weight 3 is more than global_limit 2"):
        Registry().handler("t", global_limit=2, weight=3)
