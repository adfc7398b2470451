"""Dependencies (issue 19 items 1 and 2): a job enqueued ``after=`` others waits,
never woken or claimed, until every parent has SUCCEEDED, and is woken by the
statement that finished the last one; it reads their results with
``job.parent_results()``. Real relay and consumer processes."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import DatabaseUrl
from tests.apps.deps import RUNS_TABLE
from tests.support.api import api_client
from tests.support.jobs import enqueue, job
from tests.support.processes import running

APP = ["--app", "tests.apps.deps"]
EAGER_RELAY = ["--rewake-interval", "0.2"]


def _runs(pg: psycopg.Connection, once: bool = True) -> dict[uuid.UUID, dict[str, Any]]:
    cur = pg.execute(
        "SELECT job_id, name, worker, started_at, ended_at, parents"
        " FROM dep_runs ORDER BY started_at"
    )
    names = [c.name for c in cur.description or []]
    rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    by_id: dict[uuid.UUID, dict[str, Any]] = {}
    for row in rows:
        assert not once or row["job_id"] not in by_id, f"job {row['name']} ran twice"
        by_id[row["job_id"]] = row
    return by_id


def _outbox_rows(pg: psycopg.Connection, job_id: uuid.UUID) -> int:
    row = pg.execute("SELECT count(*) FROM outbox WHERE job_id = %s", [job_id]).fetchone()
    assert row is not None
    return int(row[0])


def _ended(run: dict[str, Any]) -> datetime:
    assert run["ended_at"] is not None
    return run["ended_at"]  # type: ignore[no-any-return]


def _diamond(session: Session, fail_b: bool = False, **child: Any) -> dict[str, uuid.UUID]:
    """A -> B, A -> C, B + C -> D, D -> E, in the caller's one transaction."""
    a = outbox.enqueue(session, "step", {"name": "A", "seconds": 0.3})
    b = outbox.enqueue(session, "step", {"name": "B", "seconds": 0.5, "fail": fail_b}, after=[a])
    c = outbox.enqueue(session, "step", {"name": "C", "seconds": 0.5}, after=[a])
    d = outbox.enqueue(session, "step", {"name": "D"}, after=[b, c], **child)
    e = outbox.enqueue(session, "step", {"name": "E"}, after=[d])
    return {"A": a, "B": b, "C": c, "D": d, "E": e}


def test_a_diamond_runs_in_order_on_two_consumers_and_d_sees_b_and_c(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    pg.execute(RUNS_TABLE)
    with Session(engine) as session, session.begin():
        ids = _diamond(session)
    d = job(pg, ids["D"])
    assert (d["state"], d["parents_pending"], d["delay_reason"]) == ("QUEUED", 2, "DEPENDENCY")
    assert _outbox_rows(pg, ids["D"]) == 0, "no wake-up while a parent is pending"
    with Session(engine) as session:
        why = outbox.explain(session, ids["D"])
    assert why.codes == ["DEPENDENCY"]
    facts = why.blocker("DEPENDENCY")
    assert facts is not None
    assert [p["job_id"] for p in facts.facts["waiting_for"]] == [ids["B"], ids["C"]]
    assert facts.facts["pending"] == 2
    with (
        running("relay", EAGER_RELAY, env, "relay.started"),
        running("consumer", APP, env, "consumer.started"),
        running("consumer", APP, env, "consumer.started"),
    ):
        assert outbox.wait_for(engine, ids["E"], timeout=30).state == "SUCCEEDED"
    runs = _runs(pg)
    a, b, c, dr, e = (runs[ids[n]] for n in "ABCDE")
    assert b["started_at"] >= _ended(a) and c["started_at"] >= _ended(a)
    # B and C ran in parallel (0.5 s each), woken by the same end of A
    assert b["started_at"] < _ended(c) and c["started_at"] < _ended(b)
    assert dr["started_at"] >= max(_ended(b), _ended(c))
    assert e["started_at"] >= _ended(dr)
    assert dr["parents"] == [[str(ids["B"]), {"name": "B"}], [str(ids["C"]), {"name": "C"}]]
    assert a["parents"] == []
    assert job(pg, ids["D"])["delay_reason"] is None


def test_a_failing_parent_cancels_its_dependants_transitively(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    pg.execute(RUNS_TABLE)
    with Session(engine) as session, session.begin():
        ids = _diamond(session, fail_b=True)
    with (
        running("relay", EAGER_RELAY, env, "relay.started"),
        running("consumer", APP, env, "consumer.started"),
    ):
        assert outbox.wait_for(engine, ids["E"], timeout=30).state == "CANCELLED"
        assert outbox.wait_for(engine, ids["C"], timeout=30).state == "SUCCEEDED"
    for name in "DE":
        row = job(pg, ids[name])
        assert (row["state"], row["last_error_code"]) == ("CANCELLED", "PARENT_FAILED")
        assert row["attempt_count"] == 0
    assert job(pg, ids["B"])["state"] == "FAILED"
    assert set(_runs(pg)) == {ids["A"], ids["B"], ids["C"]}, "D and E never ran"


def test_under_run_a_failed_parent_counts_as_done(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    pg.execute(RUNS_TABLE)
    with Session(engine) as session, session.begin():
        ids = _diamond(session, fail_b=True, on_parent_failure="run")
    with (
        running("relay", EAGER_RELAY, env, "relay.started"),
        running("consumer", APP, env, "consumer.started"),
    ):
        assert outbox.wait_for(engine, ids["E"], timeout=30).state == "SUCCEEDED"
    runs = _runs(pg)
    assert runs[ids["D"]]["started_at"] >= max(_ended(runs[ids["B"]]), _ended(runs[ids["C"]]))
    # B failed: it is there, with no result
    assert runs[ids["D"]]["parents"] == [[str(ids["B"]), None], [str(ids["C"]), {"name": "C"}]]


def test_a_callback_after_a_thousand_jobs_runs_once_when_the_last_ends(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    pg.execute(RUNS_TABLE)
    with Session(engine) as session, session.begin():
        group = outbox.enqueue_many(session, [NewJob("step", {"name": "g"}) for _ in range(1000)])
        callback = outbox.enqueue(session, "sync_step", {"name": "callback"}, after=group)
    assert job(pg, callback)["parents_pending"] == 1000
    with (
        running("relay", [], env, "relay.started"),
        running("consumer", [*APP, "--concurrency", "20"], env, "consumer.started"),
        running("consumer", [*APP, "--concurrency", "20"], env, "consumer.started"),
    ):
        done = outbox.wait_for(engine, callback, timeout=120)
    assert done.state == "SUCCEEDED"
    runs = _runs(pg)
    assert len(runs) == 1001, "every job once, the callback once"
    last = max(_ended(runs[g]) for g in group)
    assert runs[callback]["started_at"] >= last
    assert [uuid.UUID(k) for k, _ in runs[callback]["parents"]] == group
    assert job(pg, callback)["parents_pending"] == 0


def test_a_replayed_parent_that_succeeds_releases_its_dependants(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    pg.execute(RUNS_TABLE)
    with Session(engine) as session, session.begin():
        parent = outbox.enqueue(session, "step", {"name": "P", "fail": True})
        child = outbox.enqueue(session, "step", {"name": "child"}, after=[parent])
    with (
        running("relay", EAGER_RELAY, env, "relay.started"),
        running("consumer", APP, env, "consumer.started"),
    ):
        assert outbox.wait_for(engine, child, timeout=30).state == "CANCELLED"
        # The child replayed first waits for its parent again: never due, no wake-up.
        with Session(engine) as session, session.begin():
            assert outbox.retry_job(session, child) == "QUEUED"
        row = job(pg, child)
        assert (row["state"], row["parents_pending"], row["delay_reason"]) == (
            "QUEUED",
            1,
            "DEPENDENCY",
        )
        assert _outbox_rows(pg, child) == 0
        pg.execute('UPDATE jobs SET payload = \'{"name": "P"}\' WHERE job_id = %s', [parent])
        with Session(engine) as session, session.begin():
            assert outbox.retry_job(session, parent) == "QUEUED"
        assert outbox.wait_for(engine, child, timeout=30).state == "SUCCEEDED"
    runs = _runs(pg, once=False)  # the parent ran twice: failed, then replayed
    assert runs[child]["parents"] == [[str(parent), {"name": "P"}]]
    assert runs[child]["started_at"] >= _ended(runs[parent])


def test_enqueue_refuses_what_could_never_be_waited_for(
    engine: Engine, pg: psycopg.Connection
) -> None:
    real = enqueue(engine, "step", {"name": "real"})
    unknown = uuid.uuid4()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"after": [unknown]}, f"after names job {unknown}, which does not exist"),
        ({"after": [real, str(real)]}, "more than once"),
        ({"after": [uuid.uuid4() for _ in range(1001)]}, "at most 1000"),
        ({"after": ["nope"]}, "not a job id"),
        ({"after": [real], "on_parent_failure": "maybe"}, "on_parent_failure"),
        ({"after": [real], "needs_approval": True}, "needs_approval"),
    ]
    for kw, message in cases:
        with (
            pytest.raises(ValueError, match=message),
            Session(engine) as session,
            session.begin(),
        ):
            outbox.enqueue(session, "step", {}, **kw)
    pg.execute("UPDATE jobs SET state = 'FAILED', finished_at = now() WHERE job_id = %s", [real])
    with (
        pytest.raises(ValueError, match="ended FAILED"),
        Session(engine) as session,
        session.begin(),
    ):
        outbox.enqueue(session, "step", {}, after=[real])
    # under "run" it is accepted, settled at once, and due now
    runs = enqueue(engine, "step", {}, after=[real], on_parent_failure="run")
    row = job(pg, runs)
    assert (row["parents_pending"], row["delay_reason"]) == (0, None)
    assert _outbox_rows(pg, runs) == 1
    count = pg.execute("SELECT count(*) FROM jobs").fetchone()
    assert count is not None and count[0] == 2, "nothing refused was written"


async def test_the_async_twins_take_after(db_url: DatabaseUrl, pg: psycopg.Connection) -> None:
    async_engine = create_async_engine(db_url.sqlalchemy)
    try:
        async with AsyncSession(async_engine) as session, session.begin():
            parent = await outbox.enqueue_async(session, "step", {"name": "p"})
            (child,) = await outbox.enqueue_many_async(
                session, [NewJob("step", {}, after=[parent], on_parent_failure="run")]
            )
    finally:
        await async_engine.dispose()
    row = job(pg, child)
    assert (row["parents_pending"], row["on_parent_failure"]) == (1, "run")
    assert job(pg, parent)["has_dependants"] is True


async def test_the_api_takes_after_and_on_parent_failure(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection
) -> None:
    parent = enqueue(engine, "step", {"name": "p"})
    async with api_client(db_url) as client:
        made = await client.post(
            "/v1/jobs",
            json={"job_type": "step", "after": [str(parent)], "on_parent_failure": "run"},
        )
        unknown = await client.post(
            "/v1/jobs", json={"job_type": "step", "after": [str(uuid.uuid4())]}
        )
        bad = await client.post(
            "/v1/jobs", json={"job_type": "step", "after": [], "on_parent_failure": "maybe"}
        )
    assert made.status_code == 202, made.text
    child = uuid.UUID(made.json()["id"])
    row = job(pg, child)
    assert (row["parents_pending"], row["on_parent_failure"]) == (1, "run")
    codes = [b["code"] for b in made.json()["why"]["blockers"]]
    assert codes == ["DEPENDENCY"]
    assert unknown.status_code == 422 and "does not exist" in unknown.text
    assert bad.status_code == 422


def _end(conn: psycopg.Connection, job_id: uuid.UUID, state: str) -> None:
    conn.execute(
        "UPDATE jobs SET state = %s, finished_at = now() WHERE job_id = %s", [state, job_id]
    )


def test_the_last_two_parents_ending_at_once_wake_the_child_once(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    first = enqueue(engine, "step", {})
    second = enqueue(engine, "step", {})
    child = enqueue(engine, "step", {}, after=[first, second])
    pg.execute("DELETE FROM outbox")
    with psycopg.connect(db_url.conninfo) as one, psycopg.connect(db_url.conninfo) as two:
        _end(one, first, "SUCCEEDED")
        racer = threading.Thread(target=_end, args=(two, second, "SUCCEEDED"))
        racer.start()  # waits for the child's row, which `one` counted down
        time.sleep(0.3)
        assert racer.is_alive(), "the second count-down waits for the first's commit"
        one.commit()
        racer.join(10)
        two.commit()
    row = job(pg, child)
    assert (row["parents_pending"], row["delay_reason"]) == (0, None)
    assert row["run_after"] < datetime.now(UTC)
    assert _outbox_rows(pg, child) == 1, "woken exactly once"


def test_a_cancelled_job_counts_as_done_for_its_run_dependants(
    engine: Engine, pg: psycopg.Connection
) -> None:
    a = enqueue(engine, "step", {})
    b = enqueue(engine, "step", {}, after=[a])
    c = enqueue(engine, "step", {}, after=[b])
    d = enqueue(engine, "step", {}, after=[b, c], on_parent_failure="run")
    e = enqueue(engine, "step", {}, after=[d])
    with Session(engine) as session, session.begin():
        assert outbox.request_cancel(session, a) == "CANCELLED"
    for cancelled in (b, c):
        row = job(pg, cancelled)
        assert (row["state"], row["last_error_code"]) == ("CANCELLED", "PARENT_FAILED")
    row = job(pg, d)
    assert (row["state"], row["parents_pending"]) == ("QUEUED", 0), "b and c count as done"
    assert _outbox_rows(pg, d) == 1
    assert job(pg, e)["parents_pending"] == 1


def test_one_statement_ending_many_parents_counts_their_child_down_once(
    engine: Engine, db_url: DatabaseUrl
) -> None:
    """An outcome of 50 parents of one callback writes the callback's row once, not
    50 times (versions a statement cannot prune: its page filled and each write
    went to every index of jobs, 3-5x a plain outcome). The count is exact, and a
    statement that ends nothing anybody waits for reads no edge."""
    with Session(engine) as session, session.begin():
        parents = outbox.enqueue_many(session, [NewJob("step", {}) for _ in range(60)])
        child = outbox.enqueue(session, "step", {}, after=parents)
    with psycopg.connect(db_url.conninfo) as conn:
        ended = conn.execute(
            "UPDATE jobs SET state = 'SUCCEEDED', finished_at = now() WHERE job_id = ANY(%s)",
            [parents[:50]],
        )
        assert ended.rowcount == 50
        writes = conn.execute(
            "SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'jobs'"
        ).fetchone()
        assert writes == (51,), "the 50 parents and their child once"
        row = conn.execute(
            "SELECT parents_pending, delay_reason FROM jobs WHERE job_id = %s", [child]
        ).fetchone()
        assert row == (10, "DEPENDENCY")
        conn.execute("UPDATE jobs SET state = 'SUCCEEDED' WHERE job_id = ANY(%s)", [parents[50:]])
        conn.commit()
    with psycopg.connect(db_url.conninfo) as pg:
        row = job(pg, child)
        assert (row["parents_pending"], row["delay_reason"]) == (0, None)
        assert _outbox_rows(pg, child) == 1, "woken exactly once"
        left = pg.execute(
            "SELECT count(*) FROM job_dependencies WHERE done AND NOT counted"
        ).fetchone()
        assert left == (0,)
