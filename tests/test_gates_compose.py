"""Where the gates meet: a job is admitted only if every gate it uses admits it, and
a job one gate turns down takes nothing from another (check all, then take all).
Each test names the defect it guards against."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from harness.claim import claim_params
from hybrid_jobs import outbox
from hybrid_jobs.consumers import store as store_module
from hybrid_jobs.consumers.outcome import Outcome
from hybrid_jobs.consumers.store import JobStore, finish_params
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.gates import GATES, HELD_GATES
from tests.support.jobs import enqueue, job, versions
from tests.support.statements import record_statements


def _claim(pg: psycopg.Connection, ids: list[uuid.UUID], worker: str = "w1") -> dict[Any, str]:
    rows = pg.execute(q.JOB_CLAIM_MANY, claim_params(ids, worker)).fetchall()
    return {row[1]: row[0] for row in rows}


def _tokens(pg: psycopg.Connection, name: str) -> float:
    row = pg.execute("SELECT tokens FROM rate_buckets WHERE name = %s", [name]).fetchone()
    assert row is not None
    return float(row[0])


def _limit(engine: Engine, name: str, **kw: Any) -> None:
    with Session(engine) as session, session.begin():
        outbox.set_rate_limit(session, name, **kw)


def test_a_job_another_gate_turns_down_spends_no_rate_token(
    engine: Engine, pg: psycopg.Connection
) -> None:
    # 3 a minute. Jobs under that limit are turned down for a busy resource, a
    # tenant at its cap and a busy key: the bucket keeps its three tokens (it went
    # 2, 1, 0 when the token was taken before the other gates looked), and the
    # first job whose gates all admit it then takes one.
    _limit(engine, "api", rate=3, per=timedelta(minutes=1), burst=3)
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_running=1)
    holders = [
        enqueue(engine, "noop", resource="deploy:prod"),
        enqueue(engine, "noop", tenant="acme"),
        enqueue(engine, "noop", key="account:1"),
    ]
    assert set(_claim(pg, holders).values()) == {"claimed"}
    refused = {
        enqueue(engine, "noop", rate_limit="api", resource="deploy:prod"): "RESOURCE_BUSY",
        enqueue(engine, "noop", rate_limit="api", tenant="acme"): "TENANT_CAP",
        enqueue(engine, "noop", rate_limit="api", key="account:1"): "KEY_BUSY",
    }
    for job_id, why in refused.items():
        assert _claim(pg, [job_id]) == {job_id: why}
        assert _tokens(pg, "api") == 3, f"a job refused {why} spent a token"
        assert job(pg, job_id)["attempt_count"] == 0
    free = enqueue(engine, "noop", rate_limit="api")
    assert _claim(pg, [free]) == {free: "claimed"}
    assert 2 <= _tokens(pg, "api") < 2.01


def test_one_batch_gives_an_untaken_token_to_no_job_past_the_bucket(
    engine: Engine, pg: psycopg.Connection
) -> None:
    # Burst 2, in one batch: the two first in line have a token to have; one of them
    # is turned down for its busy key, so one token is taken and one stays. The job
    # third in line got none in this claim and is RATE_LIMITED, due at once (a token
    # is there), not after a refill.
    _limit(engine, "api", rate=1, per=timedelta(hours=1), burst=2)
    holder = enqueue(engine, "noop", key="account:1")
    assert _claim(pg, [holder]) == {holder: "claimed"}
    keyed = enqueue(engine, "noop", rate_limit="api", key="account:1", priority=9)
    first = enqueue(engine, "noop", rate_limit="api", priority=5)
    third = enqueue(engine, "noop", rate_limit="api")
    pg.execute("UPDATE outbox SET sent_at = now()")  # as the relay does when it wakes them
    assert _claim(pg, [keyed, first, third]) == {
        keyed: "KEY_BUSY",
        first: "claimed",
        third: "RATE_LIMITED",
    }
    assert 1 <= _tokens(pg, "api") < 1.01
    (wait,) = pg.execute(
        "SELECT extract(epoch FROM available_at - now()) FROM outbox"
        " WHERE job_id = %s AND sent_at IS NULL",
        [third],
    ).fetchone()
    assert wait <= 0.01


def _finish(pg: psycopg.Connection, job_id: uuid.UUID, outcome: Outcome) -> None:
    generation = job(pg, job_id)["lease_generation"]
    params = finish_params("w1", [(job_id, generation, outcome)])
    assert pg.execute(q.JOB_FINISH_MANY, params).fetchall() == [(job_id, outcome_state(outcome))]


def outcome_state(outcome: Outcome) -> str:
    return {"succeeded": "SUCCEEDED", "failed": "FAILED"}[outcome.kind]


def _pending(pg: psycopg.Connection, job_id: uuid.UUID) -> int:
    row = pg.execute(
        "SELECT count(*) FROM outbox WHERE job_id = %s AND sent_at IS NULL", [job_id]
    ).fetchone()
    assert row is not None
    return int(row[0])


def _sent(pg: psycopg.Connection) -> None:
    pg.execute("UPDATE outbox SET sent_at = now() WHERE sent_at IS NULL")  # as the relay does


def test_an_ordered_head_cancelled_by_its_parents_failure_wakes_the_next_in_order(
    engine: Engine, pg: psycopg.Connection
) -> None:
    # The head of an ordered key waits for its parent; the next of the key waits
    # behind it (KEY_ORDER, no wake-up of its own). The parent fails, which cancels
    # the head (PARENT_FAILED): the next must be woken then, not by the orphan walk.
    parent = enqueue(engine, "noop")
    assert _claim(pg, [parent]) == {parent: "claimed"}
    head = enqueue(engine, "noop", key="acct", ordered=True, after=[parent])
    following = enqueue(engine, "noop", key="acct", ordered=True)
    _sent(pg)
    assert _claim(pg, [following]) == {following: "KEY_ORDER"}
    assert _pending(pg, following) == 0
    _finish(pg, parent, Outcome.failed("BOOM", "the parent failed"))
    assert (job(pg, head)["state"], job(pg, head)["last_error_code"]) == (
        "CANCELLED",
        "PARENT_FAILED",
    )
    assert _pending(pg, following) == 1
    _sent(pg)
    assert _claim(pg, [following]) == {following: "claimed"}


def test_a_woken_resource_waiter_cancelled_before_it_ran_wakes_the_next(
    engine: Engine, pg: psycopg.Connection
) -> None:
    # The holder's end wakes the oldest waiter of its resource, and only it. That
    # waiter is cancelled before it runs: the next waiter must be woken then.
    holder = enqueue(engine, "noop", resource="deploy:prod")
    assert _claim(pg, [holder]) == {holder: "claimed"}
    first = enqueue(engine, "noop", resource="deploy:prod")
    second = enqueue(engine, "noop", resource="deploy:prod")
    _sent(pg)
    assert _claim(pg, [first, second]) == {first: "RESOURCE_BUSY", second: "RESOURCE_BUSY"}
    _finish(pg, holder, Outcome.succeeded())
    assert (_pending(pg, first), _pending(pg, second)) == (1, 0)
    with Session(engine) as session, session.begin():
        assert outbox.request_cancel(session, first) == "CANCELLED"
    assert _pending(pg, second) == 1
    _sent(pg)
    assert _claim(pg, [second]) == {second: "claimed"}


def test_a_hand_off_reads_the_wake_up_as_it_is_now_not_as_its_snapshot_had_it(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    # The end of the key's lease (E) takes its snapshot while the waiter's wake-up is
    # unsent, then waits for the holder's row. Meanwhile the relay sends that
    # wake-up, and a claim turns the waiter down (the key still held) and deletes
    # it. E then frees the key: it must wake the waiter, whose wake-up its snapshot
    # still shows pending.
    holder = enqueue(engine, "noop", key="acct")
    assert _claim(pg, [holder]) == {holder: "claimed"}
    waiter = enqueue(engine, "noop", key="acct")
    generation = job(pg, holder)["lease_generation"]
    params = finish_params("w1", [(holder, generation, Outcome.succeeded())])
    with psycopg.connect(db_url.conninfo) as blocker, psycopg.connect(db_url.conninfo) as ender:
        blocker.execute("SELECT 1 FROM jobs WHERE job_id = %s FOR SHARE", [holder])
        (ender_pid,) = ender.execute("SELECT pg_backend_pid()").fetchone() or (0,)
        with ThreadPoolExecutor(1) as pool:
            ended = pool.submit(lambda: ender.execute(q.JOB_FINISH_MANY_IN_TX, params).fetchall())
            deadline = time.monotonic() + 10
            while pg.execute(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                [ender_pid],
            ).fetchone() != (True,):
                assert time.monotonic() < deadline, "the end of the lease never waited"
                time.sleep(0.01)
            _sent(pg)
            assert _claim(pg, [waiter]) == {waiter: "KEY_BUSY"}
            assert _pending(pg, waiter) == 0
            blocker.rollback()
            assert ended.result(timeout=10) == [(holder, "SUCCEEDED")]
            ender.commit()
    assert _pending(pg, waiter) == 1
    _sent(pg)
    assert _claim(pg, [waiter]) == {waiter: "claimed"}


# What each gate's steps touch that no other gate's do.
_OWN = {
    "key": ("key_usage", "key_behind AS (\n    --"),
    "rate": ("rate_buckets", "rate_limits"),
    "resource": ("resource_holds",),
    "deadline": ("expired_ended", "expires_at <= now()"),
    "queue_limit": ("queue_limits", "queue_limit_level"),
}


def test_a_claim_composed_of_some_gates_has_no_other_gates_sql_and_runs(
    pg: psycopg.Connection,
) -> None:
    for used in [c for n in range(len(GATES) + 1) for c in itertools.combinations(GATES, n)]:
        statement = q.job_claim_many(used)
        for gate, marks in _OWN.items():
            for mark in marks:
                assert (mark in statement) == (gate in used), (used, gate, mark)
        rows = pg.execute(statement, claim_params([uuid.uuid4()], "w1")).fetchall()
        assert [row[0] for row in rows] == ["missing"], used


def test_a_job_using_a_gate_its_claim_leaves_out_is_left_as_it_was(
    engine: Engine, pg: psycopg.Connection
) -> None:
    # A claim composed without one of the gates a job uses (its gates were read
    # before the claim, or guessed from the batch before) must neither start the job
    # nor turn it down: it answers 'full' with the gates the job uses, for the claim
    # composed of them.
    _limit(engine, "api", rate=1, per=timedelta(hours=1), burst=5)
    jobs = {
        "key": enqueue(engine, "noop", key="account:1"),
        "rate": enqueue(engine, "noop", rate_limit="api"),
        "resource": enqueue(engine, "noop", resource="deploy:prod"),
        "deadline": enqueue(engine, "noop", expires=timedelta(hours=1)),
        "queue_limit": enqueue(engine, "noop", queue="limited"),
    }
    with Session(engine) as session, session.begin():
        outbox.set_queue_limit(session, "limited", 5)
    before = versions(pg, list(jobs.values()))
    for gate, job_id in jobs.items():
        others = [g for g in GATES if g != gate]
        params = {**claim_params([job_id], "w1"), "queues": ["default", "limited"]}
        rows = pg.execute(q.job_claim_many(others), params).fetchall()
        assert [(row[0], row[-1]) for row in rows] == [("full", [gate])], gate
    assert versions(pg, list(jobs.values())) == before


async def test_the_store_runs_the_claim_of_the_gates_its_jobs_use(
    engine: Engine,
    pg: psycopg.Connection,
    pool: AsyncConnectionPool[AsyncConnection],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran = record_statements(monkeypatch)
    store = JobStore(pool, "w1", lease_seconds=30)
    terms = json.loads(claim_params([], "w1")["types"])
    plain = enqueue(engine, "noop")
    keyed = enqueue(engine, "noop", key="account:1")
    found = await store.claim(
        [plain, keyed], terms, queues=["default"], free_threads=0, worker_ttl=60
    )
    assert {c.job_id for c in found.claimed} == {plain, keyed}
    assert ran == [q.JOB_CLAIM_PLAIN_MANY, q.job_claim_many(["key"])]
    assert found.claimed[[c.job_id for c in found.claimed].index(keyed)].gates == {"key"}
    # the batch after one with keyed jobs goes straight to the key's claim, which
    # takes a plain job too: a stream of keyed jobs pays one statement a batch
    ran.clear()
    found = await store.claim(
        [enqueue(engine, "noop"), enqueue(engine, "noop", key="account:2")],
        terms,
        queues=["default"],
        free_threads=0,
        worker_ttl=60,
    )
    assert len(found.claimed) == 2
    assert ran == [q.job_claim_many(["key"])]
    # a batch with no gated job sends the next to the plain claim again
    ran.clear()
    found = await store.claim(
        [enqueue(engine, "noop")], terms, queues=["default"], free_threads=0, worker_ttl=60
    )
    assert ran == [q.job_claim_many(["key"])]
    assert [c.gates for c in found.claimed] == [frozenset()]
    ran.clear()
    found = await store.claim(
        [enqueue(engine, "noop")], terms, queues=["default"], free_threads=0, worker_ttl=60
    )
    assert len(found.claimed) == 1
    assert ran == [q.JOB_CLAIM_PLAIN_MANY], "a plain job runs no gate's statement"


async def test_a_batch_unlike_the_one_before_goes_on_to_the_claim_of_its_gates(
    engine: Engine,
    pool: AsyncConnectionPool[AsyncConnection],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The claim a batch goes to first is composed of the gates of the batch before;
    # a job that uses another gate is neither claimed nor turned down there, but
    # answered 'full' and claimed, in the same call, by the claim composed of both.
    ran = record_statements(monkeypatch)
    store = JobStore(pool, "w1", lease_seconds=30)
    terms = json.loads(claim_params([], "w1")["types"])
    first = await store.claim(
        [enqueue(engine, "noop", key="account:1")],
        terms,
        queues=["default"],
        free_threads=0,
        worker_ttl=60,
    )
    assert len(first.claimed) == 1
    ran.clear()
    resource = enqueue(engine, "noop", resource="deploy:prod")
    keyed = enqueue(engine, "noop", key="account:2")
    found = await store.claim(
        [resource, keyed], terms, queues=["default"], free_threads=0, worker_ttl=60
    )
    assert {c.job_id: c.gates for c in found.claimed} == {
        resource: {"resource"},
        keyed: {"key"},
    }
    assert found.missed == {}
    assert ran == [q.job_claim_many(["key"]), q.job_claim_many(["key", "resource"])]
    assert store.expected_gates == {"key", "resource"}


_HELD_OWN = {
    "key": ("key_usage", "key_woken"),
    "resource": ("resource_holds", "resource_woken"),
    "queue_limit": ("queue_limits", "queue_limit_woken"),
}


def test_an_end_of_a_lease_composed_of_some_gates_has_no_other_gates_sql(
    engine: Engine, pg: psycopg.Connection
) -> None:
    # A job pays at its end only for what its lease holds: a keyed lease's outcome
    # runs no resource's step, a plain one's neither. A lease holding a gate its
    # statement leaves out is not ended by it ('full': nothing written).
    for used in [c for n in range(3) for c in itertools.combinations(sorted(HELD_GATES), n)]:
        statement = q.job_finish_many(used)
        for gate, marks in _HELD_OWN.items():
            for mark in marks:
                assert (mark in statement) == (gate in used), (used, gate, mark)
    assert q.job_finish_many(()) == q.JOB_FINISH_PLAIN_MANY
    assert q.job_finish_many(HELD_GATES) == q.JOB_FINISH_MANY
    assert q.job_finish_many(HELD_GATES, in_tx=True) == q.JOB_FINISH_MANY_IN_TX
    held = {
        "key": enqueue(engine, "noop", key="account:1"),
        "resource": enqueue(engine, "noop", resource="deploy:prod"),
    }
    for job_id in held.values():
        assert _claim(pg, [job_id]) == {job_id: "claimed"}
    before = versions(pg, list(held.values()))
    for gate, job_id in held.items():
        others = [g for g in HELD_GATES if g != gate]
        rows = pg.execute(
            q.job_finish_many(others), finish_params("w1", [(job_id, 1, Outcome.succeeded())])
        ).fetchall()
        assert rows == [(job_id, "full")], gate
    assert versions(pg, list(held.values())) == before


async def test_the_store_ends_each_lease_by_the_statement_of_what_it_holds(
    engine: Engine,
    pg: psycopg.Connection,
    pool: AsyncConnectionPool[AsyncConnection],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[str] = []
    real_finish_on = store_module.finish_on

    async def recording(conn: AsyncConnection, worker: str, batch: Any, statement: str) -> Any:
        ran.append(statement)
        return await real_finish_on(conn, worker, batch, statement)

    monkeypatch.setattr(store_module, "finish_on", recording)
    store = JobStore(pool, "w1", lease_seconds=30)
    terms = json.loads(claim_params([], "w1")["types"])
    keyed, next_keyed = (enqueue(engine, "noop", key="account:1") for _ in range(2))
    held, next_held = (enqueue(engine, "noop", resource="deploy:prod") for _ in range(2))
    plain = enqueue(engine, "noop")
    found = await store.claim(
        [keyed, held, plain], terms, queues=["default"], free_threads=0, worker_ttl=60
    )
    gates = {c.job_id: c.gates for c in found.claimed}
    assert gates == {keyed: {"key"}, held: {"resource"}, plain: frozenset()}
    for job_id in (keyed, held, plain):
        ran.clear()
        done = await store.finish([(job_id, 1, Outcome.succeeded())], gates[job_id])
        assert done.applied == {job_id: "SUCCEEDED"}
        assert ran == [q.job_finish_many(gates[job_id])], "one statement, of what it holds"
    # and what each held was released, its next woken
    assert pg.execute("SELECT count(*) FROM key_usage").fetchone() == (0,)
    assert pg.execute("SELECT count(*) FROM resource_holds").fetchone() == (0,)
    woken = {r[0] for r in pg.execute("SELECT job_id FROM outbox WHERE sent_at IS NULL")}
    assert {next_keyed, next_held} <= woken
    # A lease whose gates are not known (recovered by held_by_me) finds out: the
    # plain statement leaves it, the whole one ends it.
    found = await store.claim([next_held], terms, queues=["default"], free_threads=0, worker_ttl=60)
    assert [c.job_id for c in found.claimed] == [next_held]
    ran.clear()
    done = await store.finish([(next_held, 1, Outcome.succeeded())], None)
    assert done.applied == {next_held: "SUCCEEDED"}
    assert ran == [q.JOB_FINISH_PLAIN_MANY, q.JOB_FINISH_MANY]
    assert pg.execute("SELECT count(*) FROM resource_holds").fetchone() == (0,)


# The queues of a consumer that serves the paused queue too.
BOTH = ["default", "reports"]


def _claim_in(pg: psycopg.Connection, ids: list[uuid.UUID], queues: list[str]) -> dict[Any, str]:
    params = {**claim_params(ids, "w1"), "queues": queues}
    return {row[1]: row[0] for row in pg.execute(q.JOB_CLAIM_MANY, params).fetchall()}


def _pause(engine: Engine, queue: str, paused: bool) -> None:
    with Session(engine) as session, session.begin():
        if paused:
            outbox.pause_queue(session, queue)
        else:
            outbox.resume_queue(session, queue)


def _held(engine: Engine, pg: psycopg.Connection, gate: str) -> tuple[dict[str, str], Any]:
    """The key or resource of ``gate`` (as enqueue's keyword), and a job that holds it."""
    use = {"key": "acct"} if gate == "key" else {"resource": "deploy:prod"}
    holder = enqueue(engine, "noop", **use)
    assert _claim(pg, [holder]) == {holder: "claimed"}
    return use, holder


@pytest.mark.parametrize("gate", ["key", "resource"])
def test_a_freed_gate_passes_over_a_waiter_of_a_paused_queue_to_one_that_can_run(
    engine: Engine, pg: psycopg.Connection, gate: str
) -> None:
    # Two waiters of one key (or resource), the older in a queue that is paused
    # meanwhile. The holder's end must wake the one that can run, not the paused
    # one, whose wake-up the relay holds back until the queue resumes: the other
    # waited for the orphan walk. Once none but the paused one is left, it is woken
    # (and its wake-up waits for the resume).
    use = {"key": "acct"} if gate == "key" else {"resource": "deploy:prod"}
    busy = "KEY_BUSY" if gate == "key" else "RESOURCE_BUSY"
    holder = enqueue(engine, "noop", **use)
    assert _claim(pg, [holder]) == {holder: "claimed"}
    paused = enqueue(engine, "noop", queue="reports", **use)
    runnable = enqueue(engine, "noop", **use)
    _sent(pg)
    assert _claim_in(pg, [paused, runnable], BOTH) == {paused: busy, runnable: busy}
    _pause(engine, "reports", True)
    _finish(pg, holder, Outcome.succeeded())
    assert (_pending(pg, paused), _pending(pg, runnable)) == (0, 1)
    _sent(pg)
    assert _claim_in(pg, [runnable], BOTH) == {runnable: "claimed"}
    _finish(pg, runnable, Outcome.succeeded())
    assert _pending(pg, paused) == 1, "the last waiter is woken, paused or not"
    _pause(engine, "reports", False)
    _sent(pg)
    assert _claim_in(pg, [paused], BOTH) == {paused: "claimed"}


def test_an_ordered_key_keeps_its_order_across_a_paused_queue(
    engine: Engine, pg: psycopg.Connection
) -> None:
    # In order, the next is the next whatever its queue: a paused head holds the key's
    # later jobs back (they could not run before it), and is woken for its resume.
    holder = enqueue(engine, "noop", key="acct", ordered=True)
    assert _claim(pg, [holder]) == {holder: "claimed"}
    head = enqueue(engine, "noop", queue="reports", key="acct", ordered=True)
    later = enqueue(engine, "noop", key="acct", ordered=True)
    _sent(pg)
    assert _claim_in(pg, [head, later], BOTH) == {head: "KEY_ORDER", later: "KEY_ORDER"}
    _pause(engine, "reports", True)
    _finish(pg, holder, Outcome.succeeded())
    assert (_pending(pg, head), _pending(pg, later)) == (1, 0)
    _pause(engine, "reports", False)
    _sent(pg)
    assert _claim_in(pg, [head, later], BOTH) == {head: "claimed", later: "KEY_ORDER"}


@pytest.mark.parametrize("gate", ["key", "resource"])
def test_a_woken_waiter_that_ends_before_it_ran_passes_over_a_paused_queue(
    engine: Engine, pg: psycopg.Connection, gate: str
) -> None:
    # The freed key or resource woke a job of a running queue; it is cancelled before
    # it runs. The turn passes (jobs_hand_on) to the next job that can run, not to the
    # older one of a paused queue.
    use, holder = _held(engine, pg, gate)
    paused = enqueue(engine, "noop", queue="reports", **use)
    woken, runnable = (enqueue(engine, "noop", **use) for _ in range(2))
    _sent(pg)
    assert set(_claim_in(pg, [paused, woken, runnable], BOTH).values()) <= {
        "KEY_BUSY",
        "RESOURCE_BUSY",
    }
    _pause(engine, "reports", True)
    _finish(pg, holder, Outcome.succeeded())
    assert [_pending(pg, j) for j in (paused, woken, runnable)] == [0, 1, 0]
    with Session(engine) as session, session.begin():
        assert outbox.request_cancel(session, woken) == "CANCELLED"
    assert [_pending(pg, j) for j in (paused, runnable)] == [0, 1]


@pytest.mark.parametrize("gate", ["key", "resource"])
def test_pausing_the_queue_of_the_woken_waiter_passes_its_turn_on(
    engine: Engine, pg: psycopg.Connection, gate: str
) -> None:
    # The freed key or resource woke the older waiter, whose queue ran then; its
    # queue is paused before the relay sends the wake-up. The relay holds it until
    # the resume, and the key or resource idled while a job of a running queue
    # waited for it with no wake-up (found by the gates model test). The pause
    # passes the turn on; the paused job keeps its wake-up for the resume.
    use, holder = _held(engine, pg, gate)
    paused = enqueue(engine, "noop", queue="reports", **use)
    runnable = enqueue(engine, "noop", **use)
    _sent(pg)
    assert set(_claim_in(pg, [paused, runnable], BOTH).values()) <= {"KEY_BUSY", "RESOURCE_BUSY"}
    _finish(pg, holder, Outcome.succeeded())
    assert (_pending(pg, paused), _pending(pg, runnable)) == (1, 0)
    _pause(engine, "reports", True)
    assert (_pending(pg, paused), _pending(pg, runnable)) == (1, 1)
    _sent(pg)
    assert _claim_in(pg, [runnable], BOTH) == {runnable: "claimed"}
    # pausing it again, or a queue whose jobs hold no turn, wakes nobody more
    _pause(engine, "reports", True)
    _pause(engine, "default", True)
    assert pg.execute("SELECT count(*) FROM outbox WHERE sent_at IS NULL").fetchone() == (0,)


def test_pausing_a_queue_leaves_an_ordered_keys_turn_with_the_next_in_order(
    engine: Engine, pg: psycopg.Connection
) -> None:
    holder = enqueue(engine, "noop", key="acct", ordered=True)
    assert _claim(pg, [holder]) == {holder: "claimed"}
    head = enqueue(engine, "noop", queue="reports", key="acct", ordered=True)
    later = enqueue(engine, "noop", key="acct", ordered=True)
    _sent(pg)
    assert _claim_in(pg, [head, later], BOTH) == {head: "KEY_ORDER", later: "KEY_ORDER"}
    _finish(pg, holder, Outcome.succeeded())
    _pause(engine, "reports", True)
    assert (_pending(pg, head), _pending(pg, later)) == (1, 0)


@pytest.mark.parametrize("gate", ["key", "resource"])
def test_a_woken_waiter_moved_later_by_an_edit_passes_the_turn_on(
    engine: Engine, pg: psycopg.Connection, gate: str
) -> None:
    # The freed key or resource woke one waiter; the other was turned down and has no
    # wake-up. An operator moves the woken one an hour later: nothing ended, so the
    # hand-on trigger does not fire, and the other waited for the orphan walk.
    use, holder = _held(engine, pg, gate)
    woken, other = (enqueue(engine, "noop", **use) for _ in range(2))
    _sent(pg)
    assert set(_claim(pg, [woken, other]).values()) <= {"KEY_BUSY", "RESOURCE_BUSY"}
    _finish(pg, holder, Outcome.succeeded())
    assert [_pending(pg, j) for j in (woken, other)] == [1, 0]
    with Session(engine) as session, session.begin():
        outbox.update_job(session, woken, run_after=timedelta(hours=1))
    assert [_pending(pg, j) for j in (woken, other)] == [1, 1]
    assert job(pg, woken)["delay_reason"] is None, "it waits for its new start now"
    _sent(pg)
    assert _claim(pg, [other]) == {other: "claimed"}
