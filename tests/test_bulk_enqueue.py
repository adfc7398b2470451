"""A large batch of plain jobs goes by COPY (outbox.bulk): it writes the rows the
statement writes, refuses what the statement refuses, before anything is kept, and
leaves the caller's transaction going, on a sync and on an async session; the relay
hears of it at commit, and a consumer runs it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy.exc
from sqlalchemy import Engine, event, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.outbox import Backpressure, NewJob, bulk
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.queries import JOB_COPY_NOW
from hybrid_jobs.schema.topology import Topology
from tests.support.inproc import both_running
from tests.support.jobs import wait_for_state
from tests.test_enqueue import BAD

SIZE = bulk.COPY_FROM + 100
AT = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)


def _job(i: int, tagged: bool = True) -> NewJob:
    """Jobs with every field a plain job may set, each in turn: spans and instants,
    tenants, keys, resources, weights, meta and payloads of each JSON kind."""
    kind = i % 8
    if kind == 0:
        return NewJob(
            "t",
            {"i": i, "nested": [1, {"a": None}], "text": "é\n\t\\"},
            tags=["b:1", "a", "b:1"] if tagged else (),
        )
    if kind == 1:
        return NewJob("t", None, queue="other", tenant=f"ten{i % 3}", priority=i % 5 - 2)
    if kind == 2:
        return NewJob("t", [i], run_after=timedelta(seconds=i), expires=timedelta(hours=1))
    if kind == 3:
        return NewJob("t", "s", run_after=AT + timedelta(seconds=i), expires=AT + timedelta(days=1))
    if kind == 4:
        return NewJob("t", {"k": i}, rate_limit="api", key=f"k{i % 10}", key_limit=2)
    if kind == 5:
        return NewJob("u", {}, resource=f"r{i % 4}", weight=3, meta={"m": i}, max_attempts=4)
    if kind == 6:
        return NewJob("t", 1.5, key=f"x{i}")
    # spans long enough to cross a change of summer time, both ways
    return NewJob("t", True, run_after=timedelta(days=200), expires=timedelta(days=-1 + 400))


# Each job's row, with its start and deadline as offsets from its enqueue's now where
# it was given a span (or nothing), and the wake-up's, against the job's start.
_ROWS = """
SELECT to_jsonb(j) - 'job_id' - 'created_at' - 'updated_at' - 'run_after' - 'expires_at',
       CASE WHEN (%(spans)s::boolean[])[n] THEN j.run_after - j.created_at END,
       CASE WHEN NOT (%(spans)s::boolean[])[n] THEN j.run_after END,
       CASE WHEN (%(spans)s::boolean[])[n] THEN j.expires_at - j.created_at END,
       CASE WHEN NOT (%(spans)s::boolean[])[n] THEN j.expires_at END,
       o.queue, o.tenant, o.priority, o.available_at = j.run_after, o.sent_at,
       (SELECT array_agg(t.tag ORDER BY t.tag) FROM job_tags AS t WHERE t.job_id = j.job_id)
FROM unnest(%(ids)s::uuid[]) WITH ORDINALITY AS i(job_id, n)
JOIN jobs AS j USING (job_id)
LEFT JOIN outbox AS o USING (job_id)
ORDER BY n
"""


def _stored(pg: psycopg.Connection, ids: list[Any], jobs: list[NewJob]) -> list[tuple]:
    spans = [not isinstance(job.run_after, datetime) for job in jobs]
    return pg.execute(_ROWS, {"ids": ids, "spans": spans}).fetchall()


@pytest.fixture
def copy_statements(engine: Engine) -> Iterator[list[str]]:
    """The statements SQLAlchemy ran (a COPY's own go through the driver)."""
    seen: list[str] = []

    def note(*args: Any) -> None:
        seen.append(args[2])

    event.listen(engine, "before_cursor_execute", note)
    yield seen
    event.remove(engine, "before_cursor_execute", note)


# A session in a zone with summer time: a span is elapsed time, whatever the wall
# clock does meanwhile (200 days from December cross March's change).
# A batch with tags goes by the COPY with their column, one without by the one without.
@pytest.mark.parametrize(
    ("zone", "tagged"), [("UTC", True), ("UTC", False), ("America/New_York", True)]
)
def test_a_large_plain_batch_writes_by_copy_what_the_statement_writes(
    engine: Engine,
    pg: psycopg.Connection,
    copy_statements: list[str],
    monkeypatch: pytest.MonkeyPatch,
    zone: str,
    tagged: bool,
) -> None:
    jobs = [_job(i, tagged) for i in range(SIZE)]
    with Session(engine) as session, session.begin():
        session.execute(text(f"SET LOCAL TIME ZONE '{zone}'"))
        copied = outbox.enqueue_many(session, jobs)
    assert JOB_COPY_NOW in copy_statements, "the batch did not go by COPY"
    assert not any("INSERT INTO jobs" in s for s in copy_statements)
    monkeypatch.setattr(bulk, "COPY_FROM", SIZE + 1)
    copy_statements.clear()
    with Session(engine) as session, session.begin():
        session.execute(text(f"SET LOCAL TIME ZONE '{zone}'"))
        inserted = outbox.enqueue_many(session, jobs)
    assert any("INSERT INTO jobs" in s for s in copy_statements)
    assert len(set(copied) | set(inserted)) == 2 * SIZE
    assert copied == sorted(copied), "ids in the batch's order, which is creation order"
    by_copy, by_statement = _stored(pg, copied, jobs), _stored(pg, inserted, jobs)
    assert len(by_copy) == SIZE
    for n, (one, other) in enumerate(zip(by_copy, by_statement, strict=True)):
        assert one == other, f"job {n}: {jobs[n]}"
    first = by_copy[1]
    assert first[0]["tenant"] == "ten1" and first[0]["payload"] is None
    assert first[5:] == ("other", "ten1", -1, True, None, None)
    assert by_copy[2][1] == timedelta(seconds=2) and by_copy[2][3] == timedelta(hours=1)
    assert by_copy[3][2] == AT + timedelta(seconds=3) and by_copy[3][4] == AT + timedelta(days=1)
    tags = ["b:1", "a"] if tagged else []
    assert by_copy[0][5:] == ("default", "", 0, True, None, sorted(tags) or None)
    assert by_copy[0][0]["tags"] == tags
    assert by_copy[7][1] == timedelta(days=200), "elapsed time, not the wall clock's"


BAD_IN_BULK = [case for case in BAD if "dedup_key" not in getattr(case, "values", case)[0]]


@pytest.mark.parametrize(("override", "error", "message"), BAD_IN_BULK)
def test_a_refused_job_late_in_a_copied_batch_writes_nothing_and_the_transaction_goes_on(
    engine: Engine, pg: psycopg.Connection, override: dict, error: type, message: str
) -> None:
    """Refused at its turn in the COPY, after rows before it went to the server:
    the savepoint takes them back, and the caller's own writes and later enqueues
    commit."""
    args = {"job_type": "t", "payload": {}} | override
    bad = NewJob(args.pop("job_type"), args.pop("payload"), **args)
    jobs = [NewJob("t", {"i": i, "pad": "x" * 100}) for i in range(2000)]
    jobs[1990] = bad
    assert bulk.copyable(jobs)
    with Session(engine) as session, session.begin():
        session.execute(text("CREATE TABLE orders (id int PRIMARY KEY)"))
        session.execute(text("INSERT INTO orders VALUES (1)"))
        with pytest.raises(error, match=message):
            outbox.enqueue_many(session, jobs)
        after = outbox.enqueue_many(session, [NewJob("t", {"i": i}) for i in range(SIZE)])
    assert pg.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
    assert pg.execute("SELECT count(*) FROM jobs").fetchone()[0] == SIZE
    assert pg.execute("SELECT count(*) FROM outbox").fetchone()[0] == SIZE
    assert sorted(r[0] for r in pg.execute("SELECT job_id FROM jobs")) == after


def test_a_refused_copied_batch_gives_back_the_enqueue_rate_it_took(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """The tenant's enqueue tokens are taken before the first row and given back
    with the rows when a job after them is refused."""
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "metered", max_enqueue_rate=10_000)
    jobs = [NewJob("t", {"i": i}, tenant="metered") for i in range(SIZE)]
    jobs[-1] = NewJob("t", float("nan"), tenant="metered")
    with (
        Session(engine) as session,
        session.begin(),
        pytest.raises(ValueError, match="not valid JSON"),
    ):
        outbox.enqueue_many(session, jobs)
    assert pg.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    tokens = pg.execute("SELECT enqueue_tokens FROM tenant_limits WHERE tenant = 'metered'")
    assert tokens.fetchone()[0] is None, "the refused batch kept the tokens it took"


def test_a_copied_batch_says_first_what_the_statement_says_first(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused job before backpressure, and the batch's first refused job before
    a later one's refused tenant, on both paths."""
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "full", max_queued=0)
    over = [NewJob("t", {}, tenant="full") for _ in range(SIZE)]
    over[-1] = NewJob("t", {}, tenant="full", priority=10**6)
    bad_first = [NewJob("t", {}) for _ in range(SIZE)]
    bad_first[0] = NewJob("t", {}, priority=10**6)
    bad_first[-1] = NewJob("t", {}, tenant="not a name")
    for copy_from in (bulk.COPY_FROM, SIZE + 1):
        monkeypatch.setattr(bulk, "COPY_FROM", copy_from)
        for jobs in (over, bad_first):
            with (
                Session(engine) as session,
                session.begin(),
                pytest.raises(ValueError, match="priority must fit"),
            ):
                outbox.enqueue_many(session, jobs)
    with Session(engine) as session, session.begin(), pytest.raises(Backpressure):
        outbox.enqueue_many(session, over[:-1])


def test_a_servers_refusal_of_a_copy_is_sqlalchemys_error(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """An error of the server's in the COPY comes as SQLAlchemy's, as a statement's
    does, naming the COPY that failed: an IntegrityError for a constraint, an
    OperationalError for a timeout."""
    pg.execute("ALTER TABLE jobs ADD CONSTRAINT no_forbidden CHECK (job_type <> 'forbidden')")
    pg.execute("ALTER TABLE outbox ADD CONSTRAINT no_closed CHECK (queue <> 'closed')")
    for bad, constraint, table in (
        (NewJob("forbidden", {}), "no_forbidden", "jobs"),
        (NewJob("t", {}, queue="closed"), "no_closed", "outbox"),
    ):
        jobs = [*[NewJob("t", {}) for _ in range(SIZE - 1)], bad]
        with Session(engine) as session, session.begin():
            with pytest.raises(sqlalchemy.exc.IntegrityError, match=constraint) as refused:
                outbox.enqueue_many(session, jobs)
            assert refused.value.statement.startswith(f"COPY {table} ")
            session.rollback()
    with Session(engine) as session, session.begin():
        session.execute(text("SET LOCAL statement_timeout = 1"))
        with pytest.raises(sqlalchemy.exc.OperationalError, match="statement timeout"):
            outbox.enqueue_many(session, [NewJob("t", {}) for _ in range(50_000)])
        session.rollback()
    assert pg.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0


def test_an_autocommit_session_writes_a_large_batch_by_the_statement(
    engine: Engine, pg: psycopg.Connection, copy_statements: list[str]
) -> None:
    """Its statements commit one by one: the two COPYs could not commit together."""
    with Session(engine.execution_options(isolation_level="AUTOCOMMIT")) as session:
        ids = outbox.enqueue_many(session, [NewJob("t", {}) for _ in range(SIZE)])
    assert JOB_COPY_NOW not in copy_statements
    assert pg.execute("SELECT count(*) FROM outbox").fetchone()[0] == len(ids) == SIZE


def test_backpressure_refuses_a_copied_batch_before_writing(
    engine: Engine, pg: psycopg.Connection
) -> None:
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "busy", max_queued=SIZE - 1)
    jobs = [NewJob("t", {"i": i}, tenant="busy" if i == 7 else None) for i in range(SIZE)]
    with Session(engine) as session, session.begin():
        outbox.enqueue_many(session, jobs[: SIZE // 2])  # one job of busy: under its limit
    with pytest.raises(Backpressure), Session(engine) as session, session.begin():
        outbox.enqueue_many(session, [NewJob("t", {}, tenant="busy")] * SIZE)
    assert pg.execute("SELECT count(*) FROM jobs").fetchone()[0] == SIZE // 2


async def test_an_async_session_copies_and_takes_back_a_refused_batch(
    async_engine: AsyncEngine, pg: psycopg.Connection
) -> None:
    jobs = [_job(i) for i in range(SIZE)]
    async with AsyncSession(async_engine) as session, session.begin():
        ids = await outbox.enqueue_many_async(session, jobs)
        refused = [NewJob("t", {"i": i}) for i in range(SIZE)]
        refused[-1] = NewJob("t", {"nul": "a\x00b"})
        with pytest.raises(ValueError, match="NUL character"):
            await outbox.enqueue_many_async(session, refused)
        one = await outbox.enqueue_async(session, "t", {})
    stored = _stored(pg, ids, jobs)
    assert len(stored) == SIZE and all(row[5] is not None for row in stored)
    assert pg.execute("SELECT count(*) FROM jobs").fetchone()[0] == SIZE + 1
    assert pg.execute("SELECT count(*) FROM jobs WHERE job_id = %s", [one]).fetchone()[0] == 1


def test_a_copied_batch_notifies_the_relay_at_commit(engine: Engine, db_url: DatabaseUrl) -> None:
    with psycopg.connect(db_url.conninfo, autocommit=True) as listener:
        listener.execute('LISTEN "public.outbox"')
        with Session(engine) as session:
            outbox.enqueue_many(session, [NewJob("t", {"i": i}) for i in range(SIZE)])
            assert list(listener.notifies(timeout=0.3)) == []
            session.commit()
        notes = list(listener.notifies(timeout=2, stop_after=1))
    assert [n.channel for n in notes] == ["public.outbox"]


async def test_a_copied_batch_runs(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    with Session(engine) as session, session.begin():
        ids = outbox.enqueue_many(session, [NewJob("bulk", {"i": i}) for i in range(SIZE)])
    registry = Registry()
    seen: list[int] = []

    @registry.handler("bulk")
    async def run(job: consumers.Job) -> None:
        seen.append(job.payload["i"])

    async with both_running(db_url, amqp_url, topology, registry):
        await wait_for_state(pg, ids[-1], "SUCCEEDED", timeout=30)
        for job_id in ids:
            await wait_for_state(pg, job_id, "SUCCEEDED", timeout=30)
    assert sorted(seen) == list(range(SIZE))


def test_a_connection_killed_mid_copy_commits_nothing_and_the_pool_recovers(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """The session's backend terminated while the COPY streams (from the checks of
    job 1,500, through its json_default): SQLAlchemy's error, with the connection
    invalidated, nothing of the batch kept, and the next session enqueues."""
    killed: list[int] = []

    def kill_then_encode(value: object) -> object:
        if not killed:
            killed.append(backend)
            pg.execute("SELECT pg_terminate_backend(%s)", [backend])
        return str(value)

    jobs = [NewJob("t", {"i": i}) for i in range(2000)]
    jobs[1500] = NewJob("t", {"at": AT}, json_default=kill_then_encode)
    with Session(engine) as session:
        backend = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with pytest.raises(sqlalchemy.exc.DBAPIError) as lost:
            outbox.enqueue_many(session, jobs)
        assert lost.value.connection_invalidated
        session.rollback()
    assert killed == [backend]
    assert pg.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    with Session(engine) as session, session.begin():
        ids = outbox.enqueue_many(session, [NewJob("t", {}) for _ in range(SIZE)])
    assert pg.execute("SELECT count(*) FROM outbox").fetchone()[0] == len(ids) == SIZE
