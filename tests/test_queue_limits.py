"""A concurrency limit of a queue (``consumer --queue-limit QUEUE=N``), as a gate: at
most that many leases of the queue's jobs at once, whatever their types, across
every consumer; a job turned down for it takes nothing from another gate, and one
another gate turns down takes none of its slots; a job under its type's limit too
holds both and gives both back; every end of a lease gives its slot back and wakes
the next; any end of a woken waiter that never ran passes its turn on; and a job of
a queue without a limit pays for none of it. Each test names what it guards."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
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
from hybrid_jobs.consumers.cli import parse_queue_limits
from hybrid_jobs.consumers.outcome import Outcome
from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.consumers.settings import ConsumerSettings
from hybrid_jobs.consumers.store import JobStore, finish_params
from hybrid_jobs.jobctl.check import check, violations
from hybrid_jobs.plumbing.config import AmqpUrl, ConfigError, DatabaseUrl
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.queries import WORKER_TTL_SECONDS
from tests.support.api import api_client
from tests.support.dashboard import CHROMIUM, chromium, dashboard_served, sign_in
from tests.support.interleave import waits_behind
from tests.support.jobs import enqueue, job
from tests.support.metrics import scrape_once
from tests.support.processes import BIN, jobctl, jobctl_env
from tests.support.statements import record_statements

QUEUE = "reports"

_REGISTRY = Registry()


@_REGISTRY.handler("report", queue=QUEUE, max_attempts=3)
async def _report(job: consumers.Job) -> None:
    return None


@_REGISTRY.handler("chart", queue=QUEUE)
async def _chart(job: consumers.Job) -> None:
    return None


@_REGISTRY.handler("report_capped", queue=QUEUE, global_limit=1)
async def _report_capped(job: consumers.Job) -> None:
    return None


@_REGISTRY.handler("report_rated", queue=QUEUE, rate_limit="api")
async def _report_rated(job: consumers.Job) -> None:
    return None


@_REGISTRY.handler("report_heavy", queue=QUEUE, weight=2)
async def _report_heavy(job: consumers.Job) -> None:
    return None


@_REGISTRY.handler("noop")
async def _noop(job: consumers.Job) -> None:
    return None


CLAIM = q.job_claim_many({"queue_limit"})
BOTH = q.job_claim_many({"queue_limit", "concurrency"})


def _enq(engine: Engine, job_type: str, **kw: Any) -> uuid.UUID:
    return enqueue(engine, job_type, queue=QUEUE, **kw)


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


def _record(pg: psycopg.Connection, limit: int = 2, worker: str = "w0") -> list[Any]:
    given = json.dumps([{"queue": QUEUE, "max_running": limit}])
    return pg.execute(q.QUEUE_LIMIT_RECORD_MANY, {"limits": given, "worker": worker}).fetchall()


def _running(pg: psycopg.Connection, queue: str = QUEUE) -> int:
    row = pg.execute("SELECT running FROM queue_limits WHERE queue = %s", [queue]).fetchone()
    assert row is not None
    return int(row[0])


def _type_running(pg: psycopg.Connection, job_type: str) -> int:
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


def _finish(pg: psycopg.Connection, job_id: uuid.UUID, outcome: Outcome, gates: Any = None) -> Any:
    generation = job(pg, job_id)["lease_generation"]
    statement = q.JOB_FINISH_MANY if gates is None else q.job_finish_many(gates)
    return pg.execute(statement, finish_params("w1", [(job_id, generation, outcome)])).fetchall()


def _waiting_for_the_limit(
    engine: Engine, pg: psycopg.Connection, n: int
) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    """Two holders of the queue's limit of 2 (of two types), and ``n`` jobs turned
    down for it while it was full: they wait without a wake-up."""
    _record(pg)
    holders = [_enq(engine, "report"), _enq(engine, "chart")]
    assert set(_claim(pg, holders).values()) == {"claimed"}
    waiting = [_enq(engine, "report" if i % 2 else "chart") for i in range(n)]
    _sent(pg, waiting)
    assert set(_claim(pg, waiting, "w2").values()) == {"QUEUE_CONCURRENCY_LIMIT"}
    assert [_pending(pg, w) for w in waiting] == [0] * n
    return holders, waiting


def test_a_queue_limit_admits_no_more_than_its_free_slots_across_workers(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _record(pg)
    ids = [_enq(engine, "report" if i % 2 else "chart") for i in range(5)]
    other = enqueue(engine, "noop")
    _sent(pg, [*ids, other])
    got = _claim(pg, [*ids, other])
    assert got.pop(other) == "claimed", "another queue's job is not limited by it"
    assert sorted(got.values()) == ["QUEUE_CONCURRENCY_LIMIT"] * 3 + ["claimed"] * 2
    assert _running(pg) == 2
    # turned down past this batch's share while the limit had room: their wake-ups
    # came back, and the next claim, another worker's, finds the limit full
    refused = [i for i, s in got.items() if s != "claimed"]
    assert [_pending(pg, i) for i in refused] == [1, 1, 1]
    _sent(pg, refused)
    assert set(_claim(pg, refused, "w2").values()) == {"QUEUE_CONCURRENCY_LIMIT"}
    assert _running(pg) == 2
    # now nothing polls the full limit: no wake-up until a lease of the queue ends
    assert [_pending(pg, i) for i in refused] == [0, 0, 0]
    assert pg.execute("SELECT count(*) FROM jobs WHERE queue_limit_held").fetchone() == (2,)
    assert {job(pg, i)["attempt_count"] for i in refused} == {0}


def test_a_claim_composed_without_the_queue_limit_leaves_a_limited_queues_job(
    engine: Engine, pg: psycopg.Connection
) -> None:
    # A consumer that read the job's gates before the queue was limited must not
    # start it past the limit: the plain claim and every claim composed without
    # the gate read the mark on the queue's row, and leave the job untouched.
    _record(pg, 1)
    first = _enq(engine, "report")
    assert _claim(pg, [first], statement=q.JOB_CLAIM_PLAIN_MANY) == {first: "full"}
    assert _claim(pg, [first], statement=q.job_claim_many({"key"})) == {first: "full"}
    assert job(pg, first)["state"] == "QUEUED"
    assert _claim(pg, [first]) == {first: "claimed"}
    assert _running(pg) == 1


def test_a_job_the_queue_limit_turns_down_takes_no_token_tenant_slot_or_key(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _record(pg, 1)
    with Session(engine) as session, session.begin():
        outbox.set_rate_limit(session, "api", rate=5, per=timedelta(minutes=1), burst=5)
        outbox.set_tenant_limit(session, "acme", max_running=5)
    every = q.job_claim_many({"queue_limit", "rate", "key"})
    holder = _enq(engine, "report_rated", tenant="acme", key="account:1", key_limit=5)
    assert _claim(pg, [holder], statement=every) == {holder: "claimed"}

    def taken() -> tuple[float, int, int]:
        (tokens,) = pg.execute("SELECT tokens FROM rate_buckets WHERE name = 'api'").fetchone()  # type: ignore[misc]
        (slots,) = pg.execute("SELECT running FROM tenant_usage WHERE tenant = 'acme'").fetchone()  # type: ignore[misc]
        (leases,) = pg.execute("SELECT running FROM key_usage WHERE key = 'account:1'").fetchone()  # type: ignore[misc]
        return round(float(tokens), 1), int(slots), int(leases)

    before = taken()
    assert before[1:] == (1, 1)
    refused = _enq(engine, "report_rated", tenant="acme", key="account:1", key_limit=5)
    assert _claim(pg, [refused], statement=every) == {refused: "QUEUE_CONCURRENCY_LIMIT"}
    assert taken() == before, "a job the queue's limit turned down took from another gate"
    assert _running(pg) == 1
    assert not job(pg, refused)["queue_limit_held"]


def test_a_job_another_gate_turns_down_takes_no_slot_of_the_queue_limit(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _record(pg)
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_running=1)
    busy = enqueue(engine, "noop", tenant="acme")
    assert _claim(pg, [busy]) == {busy: "claimed"}
    limited = _enq(engine, "report", tenant="acme")
    assert _claim(pg, [limited]) == {limited: "TENANT_CAP"}
    assert _running(pg) == 0
    assert not job(pg, limited)["queue_limit_held"]


def test_a_job_under_its_types_limit_and_its_queues_holds_both_and_gives_both_back(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _record(pg, 2)
    pg.execute(
        q.CONCURRENCY_LIMIT_RECORD_MANY,
        {"limits": json.dumps(_REGISTRY.limits()), "worker": "w0"},
    )
    capped = [_enq(engine, "report_capped") for _ in range(2)]
    _sent(pg, capped)
    # the type's limit of 1 turns the second down: it takes no slot of the queue's
    got = _claim(pg, capped, statement=BOTH)
    assert got == {capped[0]: "claimed", capped[1]: "CONCURRENCY_LIMIT"}
    assert (_running(pg), _type_running(pg, "report_capped")) == (1, 1)
    assert job(pg, capped[0])["limit_held"] and job(pg, capped[0])["queue_limit_held"]
    # the queue's limit turns a job down: it takes no slot of its type's limit
    other = _enq(engine, "report")
    assert _claim(pg, [other], statement=BOTH) == {other: "claimed"}
    assert _running(pg) == 2
    _finish(pg, capped[0], Outcome.succeeded())
    assert (_running(pg), _type_running(pg, "report_capped")) == (1, 0)
    # the freed slots woke the waiter; the queue has one left, the type one: it runs
    assert _pending(pg, capped[1]) == 1
    _sent(pg, [capped[1]])
    _finish(pg, other, Outcome.succeeded())
    late = _enq(engine, "report")
    assert _claim(pg, [late], statement=BOTH) == {late: "claimed"}
    assert _running(pg) == 1
    assert _claim(pg, [capped[1]], statement=BOTH) == {capped[1]: "claimed"}
    assert (_running(pg), _type_running(pg, "report_capped")) == (2, 1)
    refused = _enq(engine, "report_capped")
    assert _claim(pg, [refused], statement=BOTH) == {refused: "CONCURRENCY_LIMIT"}
    assert (_running(pg), _type_running(pg, "report_capped")) == (2, 1)


@pytest.mark.parametrize("ending", ["succeeded", "failed", "retry", "cancelled", "expired"])
def test_every_end_of_a_lease_gives_the_queue_slot_back_and_wakes_the_next(
    engine: Engine, pg: psycopg.Connection, ending: str
) -> None:
    holders, waiting = _waiting_for_the_limit(engine, pg, 3)
    holder = holders[0]
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
        rows = _finish(pg, holder, outcome, {"queue_limit"})
        assert len(rows) == 1 and rows[0][1] not in ("LOCKED", "full")
    assert _running(pg) == 1
    assert not job(pg, holder)["queue_limit_held"]
    # one slot freed: one waiter woken, the oldest, and no more
    woken = [w for w in waiting if _pending(pg, w)]
    assert woken == [min(waiting)]
    assert set(_claim(pg, woken, "w2").values()) == {"claimed"}
    assert _running(pg) == 2


def test_an_end_composed_without_the_queue_limit_leaves_a_lease_that_holds_it(
    engine: Engine, pg: psycopg.Connection
) -> None:
    holders, _ = _waiting_for_the_limit(engine, pg, 1)
    assert _finish(pg, holders[0], Outcome.succeeded(), ()) == [(holders[0], "full")]
    assert _running(pg) == 2


def test_a_give_back_at_a_graceful_stop_gives_the_queue_slot_back(
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
    assert not job(pg, holders[0])["queue_limit_held"]
    assert _pending(pg, waiting[0]) == 1


def test_a_heavy_waiter_is_woken_only_once_its_weight_is_free(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _record(pg, 3)
    weighed = q.job_claim_many({"queue_limit", "weight"})
    holders = [_enq(engine, "report") for _ in range(3)]
    assert set(_claim(pg, holders, statement=weighed).values()) == {"claimed"}
    heavy = _enq(engine, "report", weight=2)
    _sent(pg, [heavy])
    assert _claim(pg, [heavy], statement=weighed) == {heavy: "QUEUE_CONCURRENCY_LIMIT"}
    _finish(pg, holders[0], Outcome.succeeded())
    assert _pending(pg, heavy) == 0, "one slot free: the job needs two"
    _finish(pg, holders[1], Outcome.succeeded())
    assert _pending(pg, heavy) == 1
    _sent(pg, [heavy])
    assert _claim(pg, [heavy], statement=weighed) == {heavy: "claimed"}
    assert _running(pg) == 3
    _finish(pg, heavy, Outcome.succeeded())
    assert _running(pg) == 1, "a heavy lease gives back its whole weight"


def test_a_woken_waiter_that_ends_before_it_ran_passes_its_turn_on(
    engine: Engine, pg: psycopg.Connection
) -> None:
    holders, waiting = _waiting_for_the_limit(engine, pg, 3)
    _finish(pg, holders[0], Outcome.succeeded())
    (first,) = [w for w in waiting if _pending(pg, w)]
    with Session(engine) as session, session.begin():
        outbox.request_cancel(session, first)
    assert job(pg, first)["state"] == "CANCELLED"
    # its turn went on to the next, exactly one
    nexts = [w for w in waiting if w != first and _pending(pg, w)]
    assert len(nexts) == 1
    assert set(_claim(pg, nexts, "w2").values()) == {"claimed"}
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
    rows = pg.execute(
        q.JOB_FINISH_MANY, finish_params("w1", [(holders[0], generation, Outcome.succeeded())])
    ).fetchall()
    assert rows == []
    assert _running(pg) == 2


def test_a_raised_limit_wakes_as_many_waiters_as_it_has_new_slots_and_a_removed_one_all(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _, waiting = _waiting_for_the_limit(engine, pg, 4)
    assert _record(pg, 3, "w9") == [(QUEUE,)]
    assert _record(pg, 3, "w8") == [], "the same limit again changes nothing"
    assert sum(_pending(pg, w) for w in waiting) == 1
    rows = pg.execute(q.QUEUE_LIMIT_LIST, {"limit": 1000}).fetchall()
    assert [(r[0], r[1], r[2], r[3], r[5]) for r in rows] == [(QUEUE, 3, 2, 4, "w9")]
    with Session(engine) as session, session.begin():
        assert outbox.remove_queue_limit(session, QUEUE)
        assert not outbox.remove_queue_limit(session, "default")
    assert [_pending(pg, w) for w in waiting] == [1] * 4
    assert pg.execute("SELECT limited FROM queues WHERE queue = %s", [QUEUE]).fetchone() == (False,)
    # no limit: the plain claim takes them
    _sent(pg, waiting)
    assert set(_claim(pg, waiting, statement=q.JOB_CLAIM_PLAIN_MANY).values()) == {"claimed"}


def test_a_job_of_a_queue_without_a_limit_pays_for_none_of_it() -> None:
    # The plain claim and the plain outcome keep no SQL of the limit: not its table,
    # not its steps. (The plain claim's one term is in its probe of the queue's row,
    # which it reads for a pause anyway.)
    for statement in (q.JOB_CLAIM_PLAIN_MANY, q.JOB_FINISH_PLAIN_MANY):
        assert "queue_limits" not in statement
        assert "queue_limit_level" not in statement
        assert "queue_limit_woken" not in statement
    # one read of the queue's row for the jobs it takes; the other names the gates of
    # the jobs it leaves to a composed claim
    taking, answer = q.JOB_CLAIM_PLAIN_MANY.split("-- 5.")
    assert taking.count("FROM queues AS q") == 1 and "q.limited" in answer
    # and a statement composed for another gate has none of its steps either
    for statement in (q.job_claim_many({"key"}), q.job_finish_many({"key", "concurrency"})):
        assert "queue_limits" not in statement
    assert "queue_limits" in CLAIM and "queue_limit_woken" in q.job_finish_many({"queue_limit"})
    # A composed claim reads the queue's row once per job, for its pause and its limit
    # alike, composed with the limit or not: a job of another gate (a key, a rate, its
    # type's limit) whose queue has none reads it no more than it did for the pause.
    # (Its limit asked in a subquery of its own, in the unfit column, read it again.)
    for gates in ({"key"}, {"rate"}, {"concurrency"}, {"key", "queue_limit"}, {"queue_limit"}):
        locked = q.job_claim_many(gates).split("), ranked AS (")[0]
        assert len(re.findall(r"\bqueues AS q\b", locked)) == 1, gates


async def test_the_store_claims_a_limited_queues_jobs_through_the_gate_and_releases_them(
    engine: Engine,
    pg: psycopg.Connection,
    pool: AsyncConnectionPool[AsyncConnection],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran = record_statements(monkeypatch)
    _record(pg)
    plain = enqueue(engine, "noop")
    limited = [_enq(engine, "report") for _ in range(3)]
    _sent(pg, [plain, *limited])
    store = JobStore(pool, "w1", 30)
    got = await store.claim(
        [plain, *limited],
        _REGISTRY.claim_terms(),
        queues=_REGISTRY.queues(),
        free_threads=0,
        worker_ttl=WORKER_TTL_SECONDS,
    )
    assert ran == [q.JOB_CLAIM_PLAIN_MANY, q.job_claim_many({"queue_limit"})]
    gates = {c.job_id: c.gates for c in got.claimed}
    assert gates[plain] == frozenset()
    assert len(gates) == 3
    assert all(g == frozenset({"queue_limit"}) for i, g in gates.items() if i != plain)
    assert sorted(got.missed.values()) == ["QUEUE_CONCURRENCY_LIMIT"]
    assert _running(pg) == 2
    done = [c for c in got.claimed if c.job_id != plain]
    finished = await store.finish(
        [(c.job_id, c.generation, Outcome.succeeded()) for c in done], frozenset({"queue_limit"})
    )
    assert set(finished.applied.values()) == {"SUCCEEDED"}
    assert _running(pg) == 0
    (waiter,) = got.missed
    assert _pending(pg, waiter) == 1
    # the next batch goes to the queue limit's claim, as the one before held its
    # jobs; once a batch holds none, a plain job runs the plain statement alone
    expected = [[q.job_claim_many({"queue_limit"})], [q.JOB_CLAIM_PLAIN_MANY]]
    for statements in expected:
        ran.clear()
        again = await store.claim(
            [enqueue(engine, "noop")],
            _REGISTRY.claim_terms(),
            queues=_REGISTRY.queues(),
            free_threads=0,
            worker_ttl=WORKER_TTL_SECONDS,
        )
        assert len(again.claimed) == 1
        assert ran == statements


def test_explain_names_the_queue_limit_a_waiting_job_waits_for(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _, waiting = _waiting_for_the_limit(engine, pg, 1)
    with Session(engine) as session:
        why = outbox.explain(session, waiting[0])
    assert "QUEUE_CONCURRENCY_LIMIT" in why.codes, why
    assert why.blocker("QUEUE_CONCURRENCY_LIMIT").facts == {  # type: ignore[union-attr]
        "queue": QUEUE,
        "running": 2,
        "queue_limit": 2,
    }
    assert f"queue '{QUEUE}' is at its concurrency limit (2/2" in why.summary


def test_jobctl_limits_shows_sets_and_removes_a_queues_limit(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    _waiting_for_the_limit(engine, pg, 3)
    text = jobctl("limits", url=db_url, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "QUEUE LIMIT" in text.stdout
    (line,) = [x for x in text.stdout.splitlines() if x.startswith(f"{QUEUE} ")]
    assert line.split() == [QUEUE, "2", "2", "3", "w0"]
    shown = jobctl(
        "limits", "--set-queue", f"{QUEUE}=3", "--by", "ops", "--json", url=db_url, cwd=tmp_path
    )
    assert shown.returncode == 0, shown.stderr
    assert [
        (c["queue"], c["limit"], c["running"], c["updated_by"])
        for c in json.loads(shown.stdout)["queue_limits"]
    ] == [(QUEUE, 3, 2, "ops")]
    removed = jobctl("limits", "--remove-queue", QUEUE, "--json", url=db_url, cwd=tmp_path)
    assert json.loads(removed.stdout)["queue_limits"] == []
    bad = jobctl("limits", "--set-queue", f"{QUEUE}=0", url=db_url, cwd=tmp_path)
    assert bad.returncode != 0
    both = jobctl(
        "limits", "--set-queue", f"{QUEUE}=3", "--remove-queue", QUEUE, url=db_url, cwd=tmp_path
    )
    assert both.returncode != 0 and "both name" in both.stderr


async def test_the_api_and_the_dashboard_show_set_and_remove_a_queues_limit(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    _, waiting = _waiting_for_the_limit(engine, pg, 3)
    async with api_client(db_url) as client:
        shown = (await client.get("/v1/limits")).json()["queue_limits"]
        assert [(c["queue"], c["limit"], c["running"], c["waiting"]) for c in shown] == [
            (QUEUE, 2, 2, 3)
        ]
        # Raised by one: the oldest waiter is woken for the slot, and the API names
        # who set it.
        raised = await client.put(f"/v1/queues/{QUEUE}/limit", json={"limit": 3})
        assert raised.status_code == 200, raised.text
        assert raised.json()["limit"] == 3
        assert raised.json()["updated_by"].startswith("api")
        assert [_pending(pg, w) for w in waiting] == [1, 0, 0]
        for bad in ({"limit": 0}, {"limit": 1.5}, {"limit": 3, "extra": 1}, {}):
            refused = await client.put(f"/v1/queues/{QUEUE}/limit", json=bad)
            assert refused.status_code == 422, (bad, refused.text)
        created = await client.put("/v1/queues/mail/limit", json={"limit": 5})
        assert created.status_code == 201, created.text
        # Removed: every waiter is woken, and a second removal finds none.
        assert (await client.delete(f"/v1/queues/{QUEUE}/limit")).status_code == 204
        assert [_pending(pg, w) for w in waiting] == [1, 1, 1]
        assert (await client.delete(f"/v1/queues/{QUEUE}/limit")).status_code == 404
        assert (await client.delete("/v1/queues/mail/limit")).status_code == 204
        unauthorised = await client.put(
            "/v1/queues/mail/limit", json={"limit": 5}, headers={"Authorization": ""}
        )
        assert unauthorised.status_code == 401
    assert _queue_limits(pg) == []

    # Recorded again (a consumer starting with --queue-limit): the leases that held
    # its slots before the removal still count.
    _record(pg)
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed")
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base)
        await page.get_by_role("link", name="Keys & limits").click()
        row = page.locator(f"[data-testid=queue-limit-row][data-queue={QUEUE}]")
        await expect(row.locator("td").nth(0)).to_have_text("2 / 2")
        await expect(row.get_by_test_id("limit-waiting")).to_have_text("3")
        await expect(row).to_contain_text("w0")
        await page.screenshot(path=str(tmp_path / "queue-limits.png"), full_page=True)
        await row.get_by_role("link", name=QUEUE).click()
        await expect(page).to_have_url(f"{served.base}/jobs?queue={QUEUE}")


def _queue_limits(pg: psycopg.Connection) -> list[tuple[str, int]]:
    """The queues with a limit, as the list shows them (a removed one's row is kept,
    without a limit, for the leases still holding its slots)."""
    rows = pg.execute(
        "SELECT queue, max_running FROM queue_limits WHERE max_running IS NOT NULL"
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


async def test_the_metrics_count_the_jobs_waiting_for_a_queue_limit(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    _waiting_for_the_limit(engine, pg, 3)
    scrape = await scrape_once(db_url, "test-queue-limit-metrics")
    name = "hybrid_jobs_jobs_waiting_for_queue_concurrency_limit"
    assert scrape.value(name, queue=QUEUE) == 3


def test_jobctl_check_finds_a_queue_limits_slot_leaked_or_released_twice(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    _waiting_for_the_limit(engine, pg, 1)
    name = "queue_limit_slots_leaked_or_released_twice"
    assert check(db_url.conninfo)[name] == 0
    pg.execute("UPDATE queue_limits SET running = 1 WHERE queue = %s", [QUEUE])
    assert violations(check(db_url.conninfo))[name] == 1


def test_a_waiter_turned_down_while_a_queue_slot_was_being_given_back_is_woken(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """A claim turns a job down for the full queue limit, the queue's row locked.
    An end of a lease that began meanwhile waits for that lock, then gives its slot
    back: read in its own snapshot, taken before it waited, the job was not turned
    down yet and would wait with no wake-up and the slot free. The waiters are read
    as they are once the row is locked."""
    _record(pg)
    holders = [_enq(engine, "report") for _ in range(2)]
    assert set(_claim(pg, holders).values()) == {"claimed"}
    late = _enq(engine, "chart")
    _sent(pg, [late])
    generation = job(pg, holders[0])["lease_generation"]

    def turned_down(claimer: psycopg.Connection) -> None:
        assert _claim(claimer, [late], "w2") == {late: "QUEUE_CONCURRENCY_LIMIT"}

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


def test_the_relays_orphan_walk_leaves_a_waiter_of_a_full_queue_limit(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _, waiting = _waiting_for_the_limit(engine, pg, 1)
    params = {"after": str(uuid.UUID(int=0)), "slice": 100, "grace_seconds": 0, "worker_ttl": 60}
    assert _pending(pg, waiting[0]) == 0
    rows = pg.execute(q.JOB_WAKE_ORPHANS, params).fetchall()
    assert [r for r in rows if r[0] == "woken"] == [], "a full limit is not polled"
    # once the limit has room (its count drifted, or it was raised), the walk wakes it
    pg.execute("UPDATE queue_limits SET running = 1")
    rows = pg.execute(q.JOB_WAKE_ORPHANS, params).fetchall()
    assert [r[1] for r in rows if r[0] == "woken"] == [waiting[0]]


def test_a_consumers_queue_limits_are_parsed_and_checked() -> None:
    assert parse_queue_limits(("reports=4", "a.b=1")) == (("reports", 4), ("a.b", 1))
    for bad in ("reports", "reports=x", "=3"):
        with pytest.raises(ConfigError, match="--queue-limit"):
            parse_queue_limits((bad,))
    url = DatabaseUrl.parse("postgresql://x@127.0.0.1/db")
    amqp = AmqpUrl.parse("amqp://guest:guest@127.0.0.1/")
    ConsumerSettings(url, amqp, ("reports",), queue_limits=(("reports", 4),))
    for limits, match in (
        ((("other", 4),), "does not serve it"),
        ((("reports", 0),), "from 1 to"),
        ((("reports", 2), ("reports", 3)), "twice"),
    ):
        with pytest.raises(ConfigError, match=match):
            ConsumerSettings(url, amqp, ("reports",), queue_limits=limits)


def test_a_queue_waiter_its_types_limit_turns_down_passes_the_queues_turn_on(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """A freed slot of the queue woke its oldest waiter; its type's limit, full
    meanwhile, turns it down, and it waits for that with no wake-up. The queue's
    slot stayed free while its next waiter, of another type, slept."""
    _record(pg, 2)
    pg.execute(
        q.CONCURRENCY_LIMIT_RECORD_MANY,
        {"limits": json.dumps(_REGISTRY.limits()), "worker": "w0"},
    )
    holders = [_enq(engine, "report"), _enq(engine, "chart")]
    assert set(_claim(pg, holders, statement=BOTH).values()) == {"claimed"}
    first, other = _enq(engine, "report_capped"), _enq(engine, "chart")
    _sent(pg, [first, other])
    assert set(_claim(pg, [first, other], statement=BOTH).values()) == {"QUEUE_CONCURRENCY_LIMIT"}
    _finish(pg, holders[0], Outcome.succeeded())
    assert [_pending(pg, first), _pending(pg, other)] == [1, 0]
    # before it is claimed, a job of its type takes the type's one slot
    pg.execute("UPDATE queue_limits SET max_running = 3")
    taker = _enq(engine, "report_capped")
    assert _claim(pg, [taker], statement=BOTH) == {taker: "claimed"}
    _sent(pg, [first])
    assert _claim(pg, [first], statement=BOTH) == {first: "CONCURRENCY_LIMIT"}
    assert _running(pg) == 2, "one slot of the queue free"
    assert _pending(pg, other) == 1, "the queue's turn went on to the next that can run"
    _sent(pg, [other])
    assert _claim(pg, [other], statement=BOTH) == {other: "claimed"}


def test_a_types_waiter_its_queues_limit_turns_down_passes_the_types_turn_on(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _record(pg, 2)
    pg.execute(
        q.CONCURRENCY_LIMIT_RECORD_MANY,
        {"limits": json.dumps(_REGISTRY.limits()), "worker": "w0"},
    )
    holder = _enq(engine, "report_capped")
    assert _claim(pg, [holder], statement=BOTH) == {holder: "claimed"}
    first, second = _enq(engine, "report_capped"), _enq(engine, "report_capped")
    _sent(pg, [first, second])
    assert set(_claim(pg, [first, second], statement=BOTH).values()) == {"CONCURRENCY_LIMIT"}
    busy = _enq(engine, "report")
    assert _claim(pg, [busy], statement=BOTH) == {busy: "claimed"}
    _finish(pg, holder, Outcome.succeeded())
    assert [_pending(pg, first), _pending(pg, second)] == [1, 0]
    # the queue's freed slot goes to another job first
    late = _enq(engine, "chart")
    assert _claim(pg, [late], statement=BOTH) == {late: "claimed"}
    _sent(pg, [first])
    assert _claim(pg, [first], statement=BOTH) == {first: "QUEUE_CONCURRENCY_LIMIT"}
    assert _type_running(pg, "report_capped") == 0
    assert _pending(pg, second) == 1, "the type's turn went on to its next job"


def test_a_limit_removed_and_set_again_counts_the_leases_still_holding_its_slots(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """Removed, the limit's row stays and its leases give their slots back there:
    set again, it counts them. (Deleted and written anew at 0, it let their ends
    take from the new count, and the queue ran over its limit.)"""
    _record(pg)
    holders = [_enq(engine, "report"), _enq(engine, "chart")]
    assert set(_claim(pg, holders).values()) == {"claimed"}
    with Session(engine) as session, session.begin():
        assert outbox.remove_queue_limit(session, QUEUE)
    assert pg.execute("SELECT limited FROM queues WHERE queue = %s", [QUEUE]).fetchone() == (False,)
    assert pg.execute(q.QUEUE_LIMIT_LIST, {"limit": 10}).fetchall() == [], "no limit listed"
    # no limit: a job of the queue is claimed through no slot of it
    free = _enq(engine, "report")
    _sent(pg, [free])
    assert _claim(pg, [free]) == {free: "claimed"}
    assert not job(pg, free)["queue_limit_held"]
    # an old lease ends: it gives its slot back to the kept row
    assert _finish(pg, holders[0], Outcome.succeeded(), {"queue_limit"})[0][1] == "SUCCEEDED"
    assert _running(pg) == 1
    # set again: the lease still holding a slot counts, so one more, not two, runs
    assert _record(pg, 2, "w9") == [(QUEUE,)]
    assert _running(pg) == 1
    more = [_enq(engine, "report"), _enq(engine, "chart")]
    _sent(pg, more)
    assert sorted(_claim(pg, more, "w2").values()) == ["QUEUE_CONCURRENCY_LIMIT", "claimed"]
    assert _running(pg) == 2
    _finish(pg, holders[1], Outcome.succeeded(), {"queue_limit"})
    assert _running(pg) == 1
    assert pg.execute("SELECT count(*) FROM jobs WHERE queue_limit_held").fetchone() == (1,)
    assert check(db_url.conninfo)["queue_limit_slots_leaked_or_released_twice"] == 0


def _while_a_claim_turns_one_down(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    claim: str,
    statement: str,
    params: dict[str, Any],
    reason: str,
    job_type: str,
) -> uuid.UUID:
    """A claim turns a job down for a full limit, the limit's row locked, and
    ``statement`` (a raise, a removal) runs meanwhile: it waits for the row, and
    must wake the job, turned down by then, though not in its statement's snapshot.
    Returns the job."""
    late = _enq(engine, job_type)
    _sent(pg, [late])
    with psycopg.connect(db_url.conninfo, autocommit=True) as claimer:
        claimer.execute("BEGIN")
        assert _claim(claimer, [late], "w2", claim) == {late: reason}
        done: list[Any] = []
        with psycopg.connect(db_url.conninfo, autocommit=True) as writer:
            writer_pid = writer.info.backend_pid
            worker = threading.Thread(
                target=lambda: done.extend(writer.execute(statement, params).fetchall())
            )
            worker.start()
            deadline = time.monotonic() + 30
            while not pg.execute(
                "SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted", [writer_pid]
            ).fetchone():
                assert time.monotonic() < deadline, "the statement never waited"
                time.sleep(0.02)
            claimer.execute("COMMIT")
            worker.join(30)
            assert not worker.is_alive()
    assert done, "it changed the limit"
    return late


@pytest.mark.parametrize("change", ["raise", "remove"])
def test_a_queue_limit_raised_or_removed_wakes_a_job_turned_down_while_it_waited(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, change: str
) -> None:
    _record(pg)
    holders = [_enq(engine, "report"), _enq(engine, "chart")]
    assert set(_claim(pg, holders).values()) == {"claimed"}
    if change == "raise":
        given = json.dumps([{"queue": QUEUE, "max_running": 3}])
        statement, params = q.QUEUE_LIMIT_RECORD_MANY, {"limits": given, "worker": "w9"}
    else:
        statement, params = q.QUEUE_LIMIT_REMOVE, {"queue": QUEUE}
    late = _while_a_claim_turns_one_down(
        engine, pg, db_url, CLAIM, statement, params, "QUEUE_CONCURRENCY_LIMIT", "report"
    )
    assert _pending(pg, late) == 1, "the job turned down for the limit is woken"


def test_a_types_limit_raised_wakes_a_job_turned_down_while_it_waited(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    def record(n: int) -> tuple[str, dict[str, Any]]:
        given = json.dumps([{"job_type": "report_capped", "global_limit": n}])
        return q.CONCURRENCY_LIMIT_RECORD_MANY, {"limits": given, "worker": "w0"}

    pg.execute(*record(1))
    capped = q.job_claim_many({"concurrency"})
    holder = _enq(engine, "report_capped")
    assert _claim(pg, [holder], statement=capped) == {holder: "claimed"}
    late = _while_a_claim_turns_one_down(
        engine, pg, db_url, capped, *record(2), "CONCURRENCY_LIMIT", "report_capped"
    )
    assert _pending(pg, late) == 1, "the job turned down for the limit is woken"


@pytest.mark.parametrize(
    "args",
    [
        ("--set-queue", "beta=3", "--set-queue", "alpha=3"),
        ("--set-queue", "beta=3", "--remove-queue", "alpha"),
    ],
)
def test_jobctl_changes_queue_limits_in_queue_order_whatever_order_they_are_typed(
    pg: psycopg.Connection, db_url: DatabaseUrl, tmp_path: Path, args: tuple[str, ...]
) -> None:
    """Claims and ends of leases lock the queues' rows in queue order: a change of
    several that locked them as typed (beta, then alpha) held beta while it waited
    for alpha, and a claim holding alpha and waiting for beta deadlocked with it."""
    given = json.dumps([{"queue": "alpha", "max_running": 2}, {"queue": "beta", "max_running": 2}])
    pg.execute(q.QUEUE_LIMIT_RECORD_MANY, {"limits": given, "worker": "w0"})
    with psycopg.connect(db_url.conninfo, autocommit=True) as claimer:
        claimer.execute("BEGIN")
        # as a claim of an alpha job holds it
        claimer.execute("SELECT 1 FROM queue_limits WHERE queue = 'alpha' FOR NO KEY UPDATE")
        change = subprocess.Popen(
            [str(BIN / "jobctl"), "limits", *args],
            cwd=tmp_path,
            env=jobctl_env(db_url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while not pg.execute(
                "SELECT 1 FROM pg_locks WHERE NOT granted AND pid <> %s",
                [claimer.info.backend_pid],
            ).fetchone():
                assert change.poll() is None, change.communicate()
                assert time.monotonic() < deadline, "the change never waited for alpha"
                time.sleep(0.02)
            # the claim goes on to beta: the change waiting for alpha holds nothing there
            claimer.execute(
                "SELECT 1 FROM queue_limits WHERE queue = 'beta' FOR NO KEY UPDATE NOWAIT"
            )
            claimer.execute("COMMIT")
            _, err = change.communicate(timeout=60)
        finally:
            if change.poll() is None:
                change.kill()
                change.wait()
    assert change.returncode == 0, err
    rows = pg.execute("SELECT queue, max_running FROM queue_limits ORDER BY queue").fetchall()
    assert rows[1] == ("beta", 3)
    assert rows[0] == ("alpha", None if "--remove-queue" in args else 3)


def test_a_types_turn_passed_on_goes_to_a_waiter_whose_queue_is_not_paused(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """A type's waiter its queue's limit turns down passes the type's turn on: to
    the next one of a queue that runs, as the end of a lease picks it, not to an
    older one of a paused queue, which would hold the turn and the slot free while
    paused."""
    _record(pg, 2)
    pg.execute(
        q.CONCURRENCY_LIMIT_RECORD_MANY,
        {"limits": json.dumps(_REGISTRY.limits()), "worker": "w0"},
    )
    holder = _enq(engine, "report_capped")
    assert _claim(pg, [holder], statement=BOTH) == {holder: "claimed"}
    first = _enq(engine, "report_capped")
    paused = enqueue(engine, "report_capped", queue="default")
    third = _enq(engine, "report_capped")
    waiting = [first, paused, third]
    _sent(pg, waiting)
    assert set(_claim(pg, waiting, statement=BOTH).values()) == {"CONCURRENCY_LIMIT"}
    pg.execute(q.QUEUE_PAUSE, {"queue": "default", "by": "ops"})
    busy = _enq(engine, "report")
    assert _claim(pg, [busy], statement=BOTH) == {busy: "claimed"}
    _finish(pg, holder, Outcome.succeeded())
    assert [_pending(pg, w) for w in waiting] == [1, 0, 0]
    late = _enq(engine, "chart")
    assert _claim(pg, [late], statement=BOTH) == {late: "claimed"}
    _sent(pg, [first])
    assert _claim(pg, [first], statement=BOTH) == {first: "QUEUE_CONCURRENCY_LIMIT"}
    assert [_pending(pg, paused), _pending(pg, third)] == [0, 1]


def test_a_heavy_waiter_never_claimed_is_not_woken_for_fewer_slots_than_it_weighs(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """A job enqueued without a weight, of a handler that weighs 2, turned down for
    the full limit: its weight is fixed on it then, so one freed slot wakes the
    lighter job behind it, not it (turned down again, the slot idle)."""
    _record(pg)
    weighed = q.job_claim_many({"queue_limit", "weight"})
    holders = [_enq(engine, "report"), _enq(engine, "chart")]
    assert set(_claim(pg, holders).values()) == {"claimed"}
    heavy, light = _enq(engine, "report_heavy"), _enq(engine, "report")
    _sent(pg, [heavy, light])
    assert set(_claim(pg, [heavy, light], "w2", weighed).values()) == {"QUEUE_CONCURRENCY_LIMIT"}
    assert job(pg, heavy)["weight"] == 2
    assert job(pg, light)["weight"] is None, "a job of no weight stays plain"
    _finish(pg, holders[0], Outcome.succeeded(), {"queue_limit"})
    assert [_pending(pg, heavy), _pending(pg, light)] == [0, 1]
    _sent(pg, [light])
    assert _claim(pg, [light], "w2", weighed) == {light: "claimed"}


def test_the_relays_orphan_walk_leaves_a_heavy_waiter_while_its_weight_is_not_free(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """One slot free of the queue's limit: a waiter weighing 2 is not woken on every
    pass of the walk, to be turned down again; once two are free, it is."""
    _record(pg, 3)
    holders = [_enq(engine, "report"), _enq(engine, "chart")]
    assert set(_claim(pg, holders).values()) == {"claimed"}
    heavy = _enq(engine, "report", weight=2)
    _sent(pg, [heavy])
    assert _claim(pg, [heavy], "w2", q.job_claim_many({"queue_limit", "weight"})) == {
        heavy: "QUEUE_CONCURRENCY_LIMIT"
    }
    params = {"after": str(uuid.UUID(int=0)), "slice": 100, "grace_seconds": 0, "worker_ttl": 60}
    rows = pg.execute(q.JOB_WAKE_ORPHANS, params).fetchall()
    assert [r for r in rows if r[0] == "woken"] == [], "1 slot free, it weighs 2"
    pg.execute("UPDATE queue_limits SET running = 1")
    rows = pg.execute(q.JOB_WAKE_ORPHANS, params).fetchall()
    assert [r[1] for r in rows if r[0] == "woken"] == [heavy]
