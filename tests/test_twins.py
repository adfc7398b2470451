"""Each async twin of the producer API is its sync function: the same parameters,
the same result, the same rows written, the same errors; and the two kinds of job
transaction a handler gets (async and plain) are made and completed alike."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.consumers.settings import ConsumerSettings
from hybrid_jobs.consumers.testing import JobRunner
from hybrid_jobs.consumers.worker import Consumer
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.tables import metadata

# wait_for(_async) take an engine, not a session: each waits in its own way (a
# thread blocks, a coroutine awaits), so they are not twins of one body.
TWINS = sorted(
    name for name in outbox.__all__ if name.endswith("_async") and name != "wait_for_async"
)
Setup = Callable[[Session, psycopg.Connection], tuple[tuple[Any, ...], dict[str, Any]]]


def _failed_job(session: Session, pg: psycopg.Connection, queue: str = "mail") -> uuid.UUID:
    job_id = outbox.enqueue(session, "send", {"to": "a@example.com"}, queue=queue)
    session.commit()
    pg.execute(
        "UPDATE jobs SET state = 'FAILED', attempt_count = 1, max_attempts = 1,"
        " started_at = now(), finished_at = now(), last_error_code = 'Boom',"
        " last_error_message = 'Boom: no' WHERE job_id = %s",
        [job_id],
    )
    return job_id


def _a_schedule(session: Session, paused: bool = False) -> None:
    outbox.schedule(session, "nightly", "report", {"n": 1}, every=timedelta(hours=1))
    if paused:
        outbox.pause_schedule(session, "nightly")
    session.commit()


@dataclass
class Scenario:
    """A representative call: ``setup`` writes what it needs (through the sync API,
    committed) and returns the call's arguments; ``view`` is what of the result must
    agree (by default all of it, ids and instants aside)."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    setup: Setup | None = None
    view: Callable[[Any], Any] | None = None


def _job_setup(queue: str = "mail") -> Setup:
    def setup(s: Session, pg: psycopg.Connection) -> tuple[tuple[Any, ...], dict[str, Any]]:
        job_id = outbox.enqueue(s, "send", {"to": "a@example.com"}, queue=queue)
        s.commit()
        return (job_id,), {}

    return setup


def _failed_setup(s: Session, pg: psycopg.Connection) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (_failed_job(s, pg),), {"by": "alice"}


def _paused_queue(s: Session, pg: psycopg.Connection) -> tuple[tuple[Any, ...], dict[str, Any]]:
    outbox.pause_queue(s, "mail", by="bob")
    s.commit()
    return ("mail",), {"by": "alice"}


def _used_queue(s: Session, pg: psycopg.Connection) -> tuple[tuple[Any, ...], dict[str, Any]]:
    _job_setup()(s, pg)
    return ("mail",), {}


def _paused_queues(s: Session, pg: psycopg.Connection) -> tuple[tuple[Any, ...], dict[str, Any]]:
    _paused_queue(s, pg)
    return (), {}


def _schedule_setup(paused: bool = False) -> Setup:
    def setup(s: Session, pg: psycopg.Connection) -> tuple[tuple[Any, ...], dict[str, Any]]:
        _a_schedule(s, paused)
        return ("nightly",), {}

    return setup


def _concurrency_limited(
    s: Session, pg: psycopg.Connection
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    # as a consumer records its handler's global_limit at start-up
    pg.execute(
        "INSERT INTO concurrency_limits (job_type, max_running, updated_by)"
        " VALUES ('send', 3, 'w1')"
    )
    return (), {}


def _queue_limited(s: Session, pg: psycopg.Connection) -> tuple[tuple[Any, ...], dict[str, Any]]:
    outbox.set_queue_limit(s, "reports", 3, by="ops")
    s.commit()
    return (), {}


def _limited(s: Session, pg: psycopg.Connection) -> tuple[tuple[Any, ...], dict[str, Any]]:
    outbox.set_tenant_limit(s, "acme", max_running=3, weight=2.0, max_queued=100)
    s.commit()
    return (), {}


def _awaiting(s: Session, pg: psycopg.Connection) -> tuple[tuple[Any, ...], dict[str, Any]]:
    job_id = outbox.enqueue(s, "deploy", {"to": "prod"}, needs_approval=True)
    s.commit()
    return (job_id,), {"by": "alice"}


def _rate_limited(s: Session, pg: psycopg.Connection) -> tuple[tuple[Any, ...], dict[str, Any]]:
    outbox.set_rate_limit(s, "stripe", rate=100, burst=5)
    outbox.set_rate_limit(s, "sms:*", rate=1, per=timedelta(minutes=1))
    s.commit()
    return (), {}


def _retry_many(s: Session, pg: psycopg.Connection) -> tuple[tuple[Any, ...], dict[str, Any]]:
    for queue in ("mail", "mail", "other"):
        _failed_job(s, pg, queue)
    return (), {"queue": "mail", "by": "alice", "limit": 10}


def _uncertain(s: Session, pg: psycopg.Connection) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A resource whose holder's lease expired: held, uncertain since now."""
    job_id = outbox.enqueue(s, "deploy", {"to": "prod"}, resource="deploy:prod")
    s.commit()
    pg.execute(
        "INSERT INTO resource_holds (resource, job_id, lease_generation, uncertain_since)"
        " VALUES ('deploy:prod', %s, 1, now())",
        [job_id],
    )
    return ("deploy:prod",), {"by": "alice", "outcome": "looked: not deployed"}


def _held(s: Session, pg: psycopg.Connection) -> tuple[tuple[Any, ...], dict[str, Any]]:
    _uncertain(s, pg)
    return (), {}


def _stored_input(
    s: Session, pg: psycopg.Connection, kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    ref = outbox.store_input(s, {"scan": "x" * 100}, sensitive=True)
    outbox.enqueue(s, "ocr", payload_ref=ref)
    s.commit()
    return (ref,), kwargs


SCENARIOS: dict[str, Scenario] = {
    "enqueue": Scenario(
        ("send", {"to": "a@example.com"}),
        {"queue": "mail", "dedup_key": "k1", "priority": 3, "tenant": "acme", "max_attempts": 2},
    ),
    "enqueue_many": Scenario(
        (
            [
                outbox.NewJob("send", {"n": 1}),
                outbox.NewJob("send", {"n": 2}, dedup_key="same"),
                outbox.NewJob("send", {"n": 3}, dedup_key="same"),
            ],
        ),
    ),
    "explain": Scenario(
        setup=_job_setup(),
        view=lambda e: (e.state, e.queue, e.job_type, e.codes, e.attempt),
    ),
    "request_cancel": Scenario(setup=_job_setup()),
    "job_type_policy": Scenario(("send",)),
    "update_job": Scenario(
        setup=lambda s, pg: (
            _job_setup()(s, pg)[0],
            {"payload": {"to": "b@example.com"}, "priority": 9, "max_attempts": 4},
        ),
        view=lambda run_after: run_after is not None,
    ),
    "approve": Scenario(setup=_awaiting),
    "reject": Scenario(setup=_awaiting),
    "pause_queue": Scenario(("mail",), {"by": "alice"}),
    "resume_queue": Scenario(setup=_paused_queue),
    "queue_in_use": Scenario(setup=_used_queue),
    "paused_queues": Scenario(setup=_paused_queues),
    "retry_job": Scenario(setup=_failed_setup),
    "retry_jobs": Scenario(setup=_retry_many),
    "schedule": Scenario(
        ("nightly", "report", {"n": 1}),
        {"cron": "0 3 * * *", "timezone": "Europe/Paris", "queue": "mail", "tenant": "acme"},
    ),
    "unschedule": Scenario(setup=_schedule_setup()),
    "pause_schedule": Scenario(setup=_schedule_setup()),
    "resume_schedule": Scenario(setup=_schedule_setup(paused=True)),
    "trigger_schedule": Scenario(setup=_schedule_setup()),
    "set_tenant_limit": Scenario(("acme",), {"max_running": 3, "weight": 2.5, "max_queued": 9}),
    "tenant_limits": Scenario(setup=_limited),
    "set_rate_limit": Scenario(("stripe",), {"rate": 100, "per": timedelta(seconds=1)}),
    "rate_limits": Scenario(setup=_rate_limited),
    "concurrency_limits": Scenario(setup=_concurrency_limited),
    "set_queue_limit": Scenario(("reports", 4), {"by": "ops"}),
    "queue_limits": Scenario(setup=_queue_limited),
    "remove_queue_limit": Scenario(
        setup=lambda s, pg: (_queue_limited(s, pg)[0] + ("reports",), {})
    ),
    "remove_rate_limit": Scenario(setup=lambda s, pg: (_rate_limited(s, pg)[0] + ("sms:*",), {})),
    "resolve_resource": Scenario(setup=_uncertain, view=lambda r: r.resource),
    "resource_holds": Scenario(
        setup=_held, view=lambda holds: [(h.resource, h.uncertain_since is not None) for h in holds]
    ),
    "store_input": Scenario(({"scan": "x" * 100},), {"sensitive": True}),
    "stored_input": Scenario(
        setup=lambda s, pg: _stored_input(s, pg, {}),
        view=lambda i: (i.size_bytes, i.sensitive, i.redacted, i.jobs, i.unfinished),
    ),
    "redact_input": Scenario(
        setup=lambda s, pg: _stored_input(s, pg, {"reason": "erasure request", "by": "alice"}),
        view=lambda i: (i.redacted, i.redacted_by, i.redaction_reason, i.size_bytes),
    ),
}


# ------------------------------------------------------------------ parameters


def test_every_public_producer_function_has_an_async_twin_and_a_scenario() -> None:
    taking_a_session = {
        name
        for name in outbox.__all__
        if inspect.isfunction(f := getattr(outbox, name))
        and not name.endswith("_async")
        and next(iter(inspect.signature(f).parameters.values())).annotation == "Session"
    }
    assert {t.removesuffix("_async") for t in TWINS} == taking_a_session
    assert set(SCENARIOS) == taking_a_session, "each pair has a representative call below"


@pytest.mark.parametrize("name", TWINS)
def test_a_twin_takes_what_its_sync_function_takes(name: str) -> None:
    twin, sync = getattr(outbox, name), getattr(outbox, name.removesuffix("_async"))
    assert inspect.iscoroutinefunction(twin)
    (session, *params), (sync_session, *sync_params) = (
        list(inspect.signature(f).parameters.values()) for f in (twin, sync)
    )
    assert (session.name, session.annotation) == ("session", "AsyncSession")
    assert sync_session.annotation == "Session"
    assert [(p.name, p.kind, p.default, p.annotation) for p in params] == [
        (p.name, p.kind, p.default, p.annotation) for p in sync_params
    ]
    assert inspect.signature(twin).return_annotation == inspect.signature(sync).return_annotation
    # help() on the twin says what it does, in the sync function's words.
    assert (inspect.getdoc(sync) or "-") in (inspect.getdoc(twin) or "")
    assert twin.__module__ == sync.__module__


# ------------------------------------------------------------------ behaviour


def _emptied(url: DatabaseUrl) -> DatabaseUrl:
    """The database as migrated (where nothing is written): each half of a pair
    starts from it."""
    tables = ", ".join(f'"{t.name}"' for t in metadata.sorted_tables)
    with psycopg.connect(url.conninfo, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {tables} RESTART IDENTITY")  # type: ignore[arg-type]
    return url


def _plain(value: Any) -> Any:
    """``value`` with what differs between two databases by nature (random ids,
    instants) replaced by what it is; ids keep their identity within ``value``."""
    ids: dict[uuid.UUID, str] = {}

    def walk(v: Any) -> Any:
        if isinstance(v, uuid.UUID):
            return ids.setdefault(v, f"<id {len(ids)}>")
        if isinstance(v, datetime):
            return "<instant>"
        if isinstance(v, enum.Enum):
            return v.value
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return (type(v).__name__, walk(dataclasses.asdict(v)))
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x) for x in v]
        return v

    return walk(value)


def _written(url: DatabaseUrl) -> dict[str, list[str]]:
    """Every table's rows, plain, in a stable order."""
    found: dict[str, list[str]] = {}
    with psycopg.connect(url.conninfo) as conn:
        for table in metadata.sorted_tables:
            rows = conn.execute(f'SELECT * FROM "{table.name}"').fetchall()  # type: ignore[arg-type]
            found[table.name] = sorted(repr(_plain(list(row))) for row in rows)
    return found


def _prepared(url: DatabaseUrl, scenario: Scenario) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if scenario.setup is None:
        return scenario.args, scenario.kwargs
    engine = create_engine(url.sqlalchemy)
    try:
        with psycopg.connect(url.conninfo, autocommit=True) as pg, Session(engine) as session:
            return scenario.setup(session, pg)
    finally:
        engine.dispose()


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "returned", call()
    except Exception as exc:
        return "raised", (type(exc).__name__, str(exc))


Seen = tuple[tuple[str, Any], dict[str, list[str]]]


async def _both(name: str, url: DatabaseUrl, scenario: Scenario) -> tuple[Seen, Seen]:
    """What the sync function returns (or raises) and writes, then the twin's, each
    from the database as migrated."""
    sync, twin = getattr(outbox, name), getattr(outbox, f"{name}_async")
    view = scenario.view or (lambda r: r)

    args, kwargs = _prepared(url, scenario)
    engine = create_engine(url.sqlalchemy)
    with Session(engine) as session, session.begin():
        kind, value = _outcome(lambda: sync(session, *args, **kwargs))
    engine.dispose()
    by_sync = ((kind, _plain(view(value) if kind == "returned" else value)), _written(url))

    args, kwargs = _prepared(_emptied(url), scenario)
    async_engine = create_async_engine(url.sqlalchemy)
    async with AsyncSession(async_engine) as a_session, a_session.begin():
        try:
            kind, value = "returned", await twin(a_session, *args, **kwargs)
        except Exception as exc:
            kind, value = "raised", (type(exc).__name__, str(exc))
    await async_engine.dispose()
    by_twin = ((kind, _plain(view(value) if kind == "returned" else value)), _written(url))
    return by_sync, by_twin


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_a_twin_returns_and_writes_what_its_sync_function_does(
    name: str, db_url: DatabaseUrl
) -> None:
    (sync_result, sync_rows), (async_result, async_rows) = await _both(
        name, db_url, SCENARIOS[name]
    )
    assert sync_result[0] == "returned", sync_result
    assert async_result == sync_result
    assert async_rows == sync_rows
    assert sync_result[1] or any(sync_rows.values()), "the scenario shows something"


@pytest.mark.parametrize(
    ("name", "scenario"),
    [
        ("enqueue", Scenario(("", {}))),
        ("enqueue", Scenario(("send", {"x": float("nan")}))),
        ("enqueue", Scenario(("send", {}), {"queue": "not a queue!"})),
        ("retry_jobs", Scenario(kwargs={"limit": 0})),
        ("set_tenant_limit", Scenario(("acme",), {"weight": -1})),
        ("schedule", Scenario(("nightly", "report"), {"cron": "0 3 * * *", "every": timedelta(1)})),
        ("explain", Scenario(("not a uuid",))),
        ("explain", Scenario((uuid.uuid4(),))),
    ],
)
async def test_a_twin_refuses_what_its_sync_function_refuses(
    name: str, scenario: Scenario, db_url: DatabaseUrl
) -> None:
    (sync_result, sync_rows), (async_result, async_rows) = await _both(name, db_url, scenario)
    assert sync_result[0] == "raised", sync_result
    assert async_result == sync_result
    assert async_rows == sync_rows


# ------------------------------------------------------------------ a job's transaction

SETTINGS = (
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "transaction_isolation",
    "synchronous_commit",
)
SHOW = "SELECT " + ", ".join(f"current_setting('{s}')" for s in SETTINGS)
handlers = Registry()
seen: dict[str, dict[str, Any]] = {}


@handlers.handler("async_side")
async def async_side(job: consumers.Job) -> None:
    async with job.connection() as conn:
        seen["async"] = {"connection": await (await conn.execute(SHOW)).fetchone()}
    async with job.transaction() as tx:
        seen["async"]["transaction"] = await (await tx.execute(SHOW)).fetchone()
        seen["async"]["once"] = [await tx.once("side:async"), await tx.once("side:async")]
        await tx.execute("INSERT INTO sides VALUES (%s)", [job.payload["n"]])
        tx.set_result({"n": job.payload["n"], "why": float("nan")})


@handlers.handler("plain_side")
def plain_side(job: consumers.Job) -> None:
    with job.connection() as conn:
        seen["plain"] = {"connection": conn.execute(SHOW).fetchone()}
    with job.transaction() as tx:
        seen["plain"]["transaction"] = tx.execute(SHOW).fetchone()
        seen["plain"]["once"] = [tx.once("side:plain"), tx.once("side:plain")]
        tx.execute("INSERT INTO sides VALUES (%s)", [job.payload["n"]])
        tx.set_result({"n": job.payload["n"], "why": float("nan")})


async def test_a_plain_handlers_transaction_is_an_async_ones(
    db_url: DatabaseUrl, pg: psycopg.Connection
) -> None:
    """Connected alike (the test runner gave async handlers the daemon's own timeouts
    and plain ones none), the same writes, result and record."""
    pg.execute("CREATE TABLE sides (n int PRIMARY KEY)")
    engine = create_engine(db_url.sqlalchemy)
    with Session(engine) as session, session.begin():
        ids = {
            kind: outbox.enqueue(session, f"{kind}_side", {"n": n})
            for n, kind in enumerate(("async", "plain"))
        }
    engine.dispose()
    seen.clear()
    async with JobRunner(db_url, handlers) as runner:
        ran = await runner.run_until_idle()
    assert sorted(r.state for r in ran) == ["SUCCEEDED", "SUCCEEDED"], ran
    assert seen["plain"] == seen["async"]
    assert seen["async"]["once"] == [True, False]
    rows = {
        kind: pg.execute(
            "SELECT j.state, j.result, j.attempt_count, a.outcome, a.error_code"
            " FROM jobs AS j JOIN job_attempts AS a USING (job_id) WHERE j.job_id = %s",
            [job_id],
        ).fetchall()
        for kind, job_id in ids.items()
    }
    assert rows["plain"] == rows["async"]
    assert pg.execute("SELECT count(*) FROM sides").fetchone() == (2,)


def test_a_consumers_plain_handlers_wait_for_a_connection_as_async_ones_do(
    db_url: DatabaseUrl, amqp_url: AmqpUrl
) -> None:
    """The two pools of handler connections are made alike (a plain handler used to
    wait 30 s for a free connection where an async one gave up after 5)."""
    consumer = Consumer(ConsumerSettings(db_url, amqp_url, queues=("default",)), Registry())
    pools = consumer.handlers.pool, consumer.handlers.sync()
    try:

        def made(pool: Any) -> dict[str, Any]:
            kwargs = {k: v for k, v in pool.kwargs.items() if k != "application_name"}
            return {"timeout": pool.timeout, "sizes": (pool.min_size, pool.max_size), **kwargs}

        assert made(pools[1]) == made(pools[0])
    finally:
        consumer.handlers.close_sync()
