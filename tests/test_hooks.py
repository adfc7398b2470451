"""Hooks around enqueue and execution: enqueue hooks see each job inside the
producer's transaction and may change it; run hooks wrap every attempt, in order,
seeing the handler's outcome without changing it; a hook that raises stops nothing
but its own call, and says so in the log. The end-to-end case carries a request id
from the producer's context to the handler's through the job's meta, in real relay
and consumer processes (tests/apps/hooks.py)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers.hooks import CallNext
from hybrid_jobs.consumers.testing import JobRunner
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import DatabaseUrl
from tests.support.jobs import enqueue, enqueue_many, job, wait_for_state
from tests.support.processes import fleet

REQUEST_ID: ContextVar[str | None] = ContextVar("REQUEST_ID", default=None)


def stamp_request_id(session: Session, new: NewJob) -> NewJob | None:
    """The producer's half of the request id: from its context into the job's meta."""
    request_id = REQUEST_ID.get()
    if request_id is None:
        return None
    return replace(new, meta={**(new.meta or {}), "request_id": request_id})


@pytest.fixture
def enqueue_hooks() -> Iterator[Callable[[outbox.hooks.EnqueueHook], None]]:
    """Adds enqueue hooks for the test, and removes them after it (and the request
    id the test set)."""
    added: list[outbox.hooks.EnqueueHook] = []
    token = REQUEST_ID.set(None)

    def add(hook: outbox.hooks.EnqueueHook) -> None:
        added.append(outbox.hooks.add(hook))

    yield add
    for hook in added:
        outbox.hooks.remove(hook)
    REQUEST_ID.reset(token)


@pytest.fixture
def run_hooks() -> Iterator[Callable[[consumers.hooks.RunHook], None]]:
    """Adds run hooks in this process for the test, and removes them after it."""
    added: list[consumers.hooks.RunHook] = []

    def add(hook: consumers.hooks.RunHook) -> None:
        added.append(consumers.hooks.add(hook))

    yield add
    for hook in added:
        consumers.hooks.remove(hook)


def _meta_hook(name: str) -> outbox.hooks.EnqueueHook:
    def hook(session: Session, new: NewJob) -> NewJob:
        meta = dict(new.meta or {})
        meta["hooks"] = [*meta.get("hooks", []), name]
        return replace(new, meta=meta)

    hook.__qualname__ = f"meta_hook_{name}"
    return hook


def _failures(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == event]


# ------------------------------------------------------------------ enqueue hooks


def test_an_enqueue_hook_changes_the_job_before_it_is_written(
    engine: Engine, pg: psycopg.Connection, enqueue_hooks: Callable[..., None]
) -> None:
    def tag_it(session: Session, new: NewJob) -> NewJob:
        return replace(new, tags=[*new.tags, "hooked"], priority=7)

    enqueue_hooks(tag_it)
    job_id = enqueue(engine, "noop", tags=["mine"])
    row = job(pg, job_id)
    assert sorted(row["tags"]) == ["hooked", "mine"]
    assert row["priority"] == 7


def test_an_enqueue_hook_writes_in_the_producers_transaction_and_rolls_back_with_it(
    engine: Engine, pg: psycopg.Connection, enqueue_hooks: Callable[..., None]
) -> None:
    pg.execute("CREATE TABLE enqueue_audit (job_type text, request_id text)")

    def audit(session: Session, new: NewJob) -> None:
        session.execute(
            text("INSERT INTO enqueue_audit VALUES (:job_type, :request_id)"),
            {"job_type": new.job_type, "request_id": REQUEST_ID.get()},
        )

    enqueue_hooks(audit)

    class Abandoned(Exception):
        pass

    REQUEST_ID.set("rolled-back")
    with pytest.raises(Abandoned), Session(engine) as session, session.begin():
        outbox.enqueue(session, "noop", {})
        assert session.execute(text("SELECT count(*) FROM enqueue_audit")).scalar() == 1
        raise Abandoned
    assert pg.execute("SELECT count(*) FROM enqueue_audit").fetchone() == (0,)
    assert pg.execute("SELECT count(*) FROM jobs").fetchone() == (0,)

    REQUEST_ID.set("committed")
    job_id = enqueue(engine, "noop")
    assert pg.execute("SELECT * FROM enqueue_audit").fetchall() == [("noop", "committed")]
    assert job(pg, job_id)["state"] == "QUEUED"


def test_enqueue_hooks_run_in_the_order_they_were_added_on_every_job_of_a_batch(
    engine: Engine, pg: psycopg.Connection, enqueue_hooks: Callable[..., None]
) -> None:
    for name in ("first", "second", "third"):
        enqueue_hooks(_meta_hook(name))
    ids = enqueue_many(engine, [NewJob("noop", {}), NewJob("noop", {}, meta={"hooks": ["own"]})])
    assert job(pg, ids[0])["meta"] == {"hooks": ["first", "second", "third"]}
    assert job(pg, ids[1])["meta"] == {"hooks": ["own", "first", "second", "third"]}


async def test_the_async_enqueues_and_a_handlers_own_enqueue_run_the_hooks(
    async_engine: AsyncEngine,
    engine: Engine,
    pg: psycopg.Connection,
    enqueue_hooks: Callable[..., None],
) -> None:
    enqueue_hooks(stamp_request_id)
    registry = consumers.Registry()

    @registry.handler("typed")
    def typed(job: consumers.Job, *, order: int) -> None:
        pass

    REQUEST_ID.set("req-async")
    async with AsyncSession(async_engine) as session, session.begin():
        one = await outbox.enqueue_async(session, "noop", {})
        [two] = await outbox.enqueue_many_async(session, [NewJob("noop", {})])
        three = await typed.enqueue_async(session, order=1)
    with Session(engine) as sync_session, sync_session.begin():
        four = typed.enqueue(sync_session, order=2)
    for job_id in (one, two, three, four):
        assert job(pg, job_id)["meta"] == {"request_id": "req-async"}


def test_a_raising_enqueue_hook_stops_nothing_but_its_own_call_and_is_logged(
    engine: Engine,
    pg: psycopg.Connection,
    enqueue_hooks: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(session: Session, new: NewJob) -> NewJob:
        raise RuntimeError("the hook is broken")

    def wrong(session: Session, new: NewJob) -> Any:
        return {"not": "a job"}

    enqueue_hooks(_meta_hook("before"))
    enqueue_hooks(broken)
    enqueue_hooks(wrong)
    enqueue_hooks(_meta_hook("after"))
    job_id = enqueue(engine, "noop", {"kept": True}, tags=["mine"])
    row = job(pg, job_id)
    assert (row["payload"], row["tags"], row["state"]) == ({"kept": True}, ["mine"], "QUEUED")
    assert row["meta"] == {"hooks": ["before", "after"]}, "the others ran as if it were absent"
    failed = _failures(caplog, "outbox.hook_failed")
    assert [r.hook for r in failed] == [  # type: ignore[attr-defined]
        f"{__name__}.{broken.__qualname__}",
        f"{__name__}.{wrong.__qualname__}",
    ]
    assert all(r.job_type == "noop" for r in failed)  # type: ignore[attr-defined]
    assert failed[0].exc_info is not None and "the hook is broken" in str(failed[0].exc_info[1])


def test_an_enqueue_hook_whose_own_statement_failed_raises_its_error(
    engine: Engine, pg: psycopg.Connection, enqueue_hooks: Callable[..., None]
) -> None:
    def bad_sql(session: Session, new: NewJob) -> None:
        session.execute(text("INSERT INTO no_such_table VALUES (1)"))

    enqueue_hooks(bad_sql)
    with pytest.raises(Exception, match="no_such_table"):
        enqueue(engine, "noop")
    assert pg.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


# ------------------------------------------------------------------ run hooks


def test_a_run_hook_is_an_async_function() -> None:
    def plain(job: consumers.Job, call_next: CallNext) -> Any:
        return None

    with pytest.raises(TypeError, match="async function of"):
        consumers.hooks.add(plain)
    assert plain not in consumers.hooks.registered()


async def test_a_run_hook_sees_a_run_past_the_time_limit_as_a_timeout_error(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    run_hooks: Callable[..., None],
) -> None:
    registry = consumers.Registry()

    @registry.handler("too_slow", timeout=0.2)
    async def too_slow(job: consumers.Job) -> None:
        await asyncio.sleep(60)

    seen: list[str] = []

    async def watch(job: consumers.Job, call_next: CallNext) -> Any:
        try:
            return await call_next()
        except TimeoutError as exc:
            seen.append(f"TimeoutError: {exc}")
            raise

    run_hooks(watch)
    job_id = enqueue(engine, "too_slow")
    async with JobRunner(db_url, registry) as runner:
        [ran] = await runner.run_due()
    assert seen == ["TimeoutError: "]
    assert (ran.job_id, ran.state, ran.error_code) == (job_id, "RETRY_WAIT", "TIMEOUT")


async def test_a_run_hook_that_never_calls_call_next_is_skipped_and_logged(
    engine: Engine,
    db_url: DatabaseUrl,
    run_hooks: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = consumers.Registry()

    @registry.handler("counted")
    async def counted(job: consumers.Job) -> str:
        return "ran"

    async def forgetful(job: consumers.Job, call_next: CallNext) -> Any:
        return "never called it"

    run_hooks(forgetful)
    job_id = enqueue(engine, "counted")
    async with JobRunner(db_url, registry) as runner:
        [ran] = await runner.run_due()
    assert (ran.job_id, ran.state) == (job_id, "SUCCEEDED")
    [failed] = _failures(caplog, "consumer.hook_failed")
    assert failed.hook == f"{__name__}.{forgetful.__qualname__}"  # type: ignore[attr-defined]
    assert failed.job_id == str(job_id)  # type: ignore[attr-defined]


def _seen(events: list[dict[str, Any]], job_id: uuid.UUID) -> list[tuple[str, str]]:
    return [
        (e["hook"], e["way"])
        for e in events
        if e.get("event") == "hooks.seen" and e["job_id"] == str(job_id)
    ]


def _outer_out(events: list[dict[str, Any]], job_id: uuid.UUID) -> dict[str, Any]:
    return next(
        e
        for e in events
        if e.get("event") == "hooks.seen"
        and e["job_id"] == str(job_id)
        and e["way"] == "out"
        and e["hook"] == "outer"
    )


def test_run_hooks_wrap_plain_and_async_handlers_in_a_real_consumer_carrying_the_request_id(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
    enqueue_hooks: Callable[..., None],
) -> None:
    enqueue_hooks(stamp_request_id)
    jobs: dict[str, uuid.UUID] = {}
    for name, job_type, payload, meta in [
        ("plain", "hooked_plain", {}, None),
        ("async", "hooked_async", {}, None),
        ("plain_fails", "hooked_plain", {"fail": True}, None),
        ("swallowed", "hooked_async", {"fail": True}, {"swallow": True}),
        ("broken_before", "hooked_async", {}, {"break": "before"}),
        ("broken_after", "hooked_plain", {"fail": True}, {"break": "after"}),
    ]:
        REQUEST_ID.set(f"req-{name}")
        jobs[name] = enqueue(engine, job_type, payload, meta=meta)
    REQUEST_ID.set(None)

    with fleet(env, ["--app", "tests.apps.hooks"]) as (relay, (consumer,)):
        rows = {
            name: asyncio.run(wait_for_state(pg, job_id, "SUCCEEDED", "FAILED", timeout=60))
            for name, job_id in jobs.items()
        }
        assert consumer.stop() == 0
        assert relay.stop() == 0
    events = consumer.events()

    # The request id went from the producer's context into meta, and from there, by
    # a run hook, into the context both kinds of handler read.
    for name, kind in [("plain", "plain"), ("async", "async"), ("broken_before", "async")]:
        assert rows[name]["state"] == "SUCCEEDED", rows[name]
        assert rows[name]["result"]["kind"] == kind
        assert rows[name]["result"]["request_id"] == f"req-{name}"
        assert rows[name]["result"]["meta"]["request_id"] == f"req-{name}"
    # A failure is the handler's, whatever a hook swallowed or raised around it.
    for name in ("plain_fails", "swallowed", "broken_after"):
        assert (rows[name]["state"], rows[name]["last_error_code"]) == ("FAILED", "HANDLER_FAILED")

    # In the order they were added on the way in, in reverse on the way out, seeing
    # the handler's outcome.
    in_order = [("outer", "in"), ("request_id", "in"), ("request_id", "out"), ("outer", "out")]
    for name, job_id in jobs.items():
        assert _seen(events, job_id) == in_order, name
    assert _outer_out(events, jobs["async"])["value"] == rows["async"]["result"]
    assert _outer_out(events, jobs["plain"])["value"] == rows["plain"]["result"]
    assert _outer_out(events, jobs["plain_fails"])["error"] == "Permanent"

    failed = [e for e in events if e.get("event") == "consumer.hook_failed"]
    assert sorted((e["job_id"], e["when"]) for e in failed) == sorted(
        [
            (str(jobs["broken_before"]), "before the handler"),
            (str(jobs["broken_after"]), "after the handler"),
        ]
    )
    assert {e["hook"] for e in failed} == {"tests.apps.hooks.breaks"}
