"""The producer API against real PostgreSQL: what commits, what rolls back, dedup,
and every argument it refuses."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.inproc import both_running
from tests.support.jobs import wait_for_state


def _rows(pg: psycopg.Connection, table: str) -> int:
    return pg.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_committed_enqueue_writes_job_and_wakeup(engine: Engine, pg: psycopg.Connection) -> None:
    with Session(engine) as session, session.begin():
        session.execute(text("CREATE TABLE orders (id int PRIMARY KEY)"))
        session.execute(text("INSERT INTO orders VALUES (1)"))
        job_id = outbox.enqueue(session, "send_receipt", {"order_id": 1}, queue="mail", priority=3)

    job = pg.execute(
        "SELECT job_type, queue, state, payload, priority, attempt_count, max_attempts,"
        " lease_generation, run_after <= now() FROM jobs WHERE job_id = %s",
        [job_id],
    ).fetchone()
    assert job == ("send_receipt", "mail", "QUEUED", {"order_id": 1}, 3, 0, None, 0, True)
    wake = pg.execute("SELECT queue, sent_at FROM outbox WHERE job_id = %s", [job_id]).fetchall()
    assert wake == [("mail", None)]
    assert pg.execute("SELECT count(*) FROM orders").fetchone()[0] == 1


def test_rolled_back_enqueue_leaves_nothing(engine: Engine, pg: psycopg.Connection) -> None:
    with Session(engine) as session, session.begin():
        outbox.enqueue(session, "send_receipt", {"order_id": 1})
        session.rollback()
    with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
        outbox.enqueue(session, "send_receipt", {"order_id": 2})
        raise RuntimeError("the business transaction fails")
    assert _rows(pg, "jobs") == 0
    assert _rows(pg, "outbox") == 0


def test_enqueue_never_commits(engine: Engine, pg: psycopg.Connection) -> None:
    session = Session(engine)
    outbox.enqueue(session, "t", {})
    assert _rows(pg, "jobs") == 0, "visible before the caller committed"
    session.close()  # closes without commit: rolled back
    assert _rows(pg, "jobs") == 0


def test_commit_notifies_the_relay_only_on_commit(
    engine: Engine, db_url, pg: psycopg.Connection
) -> None:
    listener = psycopg.connect(db_url.conninfo, autocommit=True)
    listener.execute('LISTEN "public.outbox"')
    with Session(engine) as session:
        outbox.enqueue(session, "t", {})
        assert list(listener.notifies(timeout=0.3)) == []
        session.commit()
    notes = list(listener.notifies(timeout=2, stop_after=1))
    assert [n.channel for n in notes] == ["public.outbox"]
    listener.close()


def test_dedup_key_returns_existing_job(engine: Engine, pg: psycopg.Connection) -> None:
    with Session(engine) as session, session.begin():
        first = outbox.enqueue(session, "invoice", {"n": 1}, dedup_key="acct-1@2026-03")
    with Session(engine) as session, session.begin():
        again = outbox.enqueue(session, "invoice", {"n": 2}, dedup_key="acct-1@2026-03")
        other_type = outbox.enqueue(session, "report", {"n": 3}, dedup_key="acct-1@2026-03")
    assert again == first
    assert other_type != first
    assert _rows(pg, "jobs") == 2
    assert _rows(pg, "outbox") == 2, "a deduplicated enqueue must not add a wake-up"
    payload = pg.execute("SELECT payload FROM jobs WHERE job_id = %s", [first]).fetchone()[0]
    assert payload == {"n": 1}


def test_dedup_race_between_two_transactions(engine: Engine, pg: psycopg.Connection) -> None:
    """Two transactions insert the same key; the second waits for the first and then
    returns the first's id, for both outcomes of the first."""
    for first_commits in (True, False):
        key = f"race-{first_commits}"
        first = Session(engine)
        first_id = outbox.enqueue(first, "race", {"who": "first"}, dedup_key=key)
        result: dict[str, object] = {}

        def second(key: str = key, result: dict[str, object] = result) -> None:
            with Session(engine) as s, s.begin():
                result["id"] = outbox.enqueue(s, "race", {"who": "second"}, dedup_key=key)

        t = threading.Thread(target=second)
        t.start()
        t.join(0.5)
        assert t.is_alive(), "the second insert should wait for the first transaction"
        if first_commits:
            first.commit()
        else:
            first.rollback()
        first.close()
        t.join(10)
        rows = pg.execute(
            "SELECT job_id, payload->>'who' FROM jobs WHERE dedup_key = %s", [key]
        ).fetchall()
        assert len(rows) == 1
        if first_commits:
            assert result["id"] == first_id
            assert rows[0][1] == "first"
        else:
            assert result["id"] == rows[0][0]
            assert rows[0][1] == "second"


def test_enqueue_many_one_statement_per_table_in_order(
    engine: Engine, pg: psycopg.Connection
) -> None:
    with Session(engine) as session, session.begin():
        existing = outbox.enqueue(session, "t", {"i": -1}, dedup_key="dup")
    jobs = [NewJob("t", {"i": i}) for i in range(1000)]
    jobs[10] = NewJob("t", {"i": 10}, dedup_key="dup")  # already exists
    jobs[20] = NewJob("t", {"i": 20}, dedup_key="fresh")
    jobs[30] = NewJob("t", {"i": 30}, dedup_key="fresh")  # same batch, same key
    with Session(engine) as session, session.begin():
        statements: list[str] = []
        conn = session.connection()
        from sqlalchemy import event

        event.listen(conn, "before_cursor_execute", lambda *a: statements.append(a[2]))
        ids = outbox.enqueue_many(session, jobs)
    assert len(statements) == 2, "one insert for both tables, one dedup lookup"
    assert ids[10] == existing
    assert ids[30] == ids[20]
    assert len(set(ids)) == 1000 - 1  # ids[30] repeats ids[20]
    payloads = dict(pg.execute("SELECT job_id, (payload->>'i')::int FROM jobs").fetchall())
    for i, job_id in enumerate(ids):
        if i not in (10, 30):
            assert payloads[job_id] == i
    assert _rows(pg, "outbox") == 1 + 998


def test_enqueue_many_empty(engine: Engine) -> None:
    with Session(engine) as session:
        assert outbox.enqueue_many(session, []) == []


def test_run_after_and_max_attempts(engine: Engine, pg: psycopg.Connection) -> None:
    at = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    with Session(engine) as session, session.begin():
        delayed = outbox.enqueue(session, "t", {}, run_after=timedelta(minutes=10), max_attempts=2)
        fixed = outbox.enqueue(session, "t", {}, run_after=at)
    row = pg.execute(
        "SELECT run_after - now() BETWEEN interval '9 min' AND interval '11 min', max_attempts"
        " FROM jobs WHERE job_id = %s",
        [delayed],
    ).fetchone()
    assert row == (True, 2)
    available = pg.execute(
        "SELECT j.run_after, o.available_at FROM jobs j JOIN outbox o USING (job_id)"
        " WHERE job_id = %s",
        [fixed],
    ).fetchone()
    assert available == (at, at), "the wake-up is due when the job is"


ODD = {
    "sql": "'; DROP TABLE jobs; -- %s %(x)s $1 \\x00",
    "unicode": "héllo 世界 🎉 \u200b \u202e RTL \ufeff",
    "nested": [1, 2.5, None, True, {"k": ["v"]}],
    "big": 2**70,
    "empty": "",
    'quote"key': "back\\slash",
}


def test_payload_round_trips_verbatim(engine: Engine, pg: psycopg.Connection) -> None:
    with Session(engine) as session, session.begin():
        job_id = outbox.enqueue(session, "t", ODD)
    assert pg.execute("SELECT payload FROM jobs WHERE job_id = %s", [job_id]).fetchone()[0] == ODD
    assert pg.execute("SELECT count(*) FROM jobs").fetchone()[0] == 1


async def test_async_session(async_engine: AsyncEngine, pg: psycopg.Connection) -> None:
    async with AsyncSession(async_engine) as session, session.begin():
        a = await outbox.enqueue_async(session, "t", {"a": 1}, dedup_key="k")
        b = await outbox.enqueue_async(session, "t", {"a": 2}, dedup_key="k")
        many = await outbox.enqueue_many_async(session, [NewJob("t", {"i": i}) for i in range(3)])
    assert a == b
    assert len(many) == 3
    async with AsyncSession(async_engine) as session, session.begin():
        await outbox.enqueue_async(session, "t", {})
        await session.rollback()
    assert _rows(pg, "jobs") == 4
    assert _rows(pg, "outbox") == 4


BAD = [
    ({"job_type": ""}, ValueError, "job_type must not be empty"),
    ({"job_type": "x" * 201}, ValueError, "job_type is 201 characters"),
    ({"job_type": 5}, TypeError, "job_type must be a str"),
    ({"queue": ""}, ValueError, "queue must not be empty"),
    ({"queue": "q" * 101}, ValueError, "queue is 101 characters"),
    ({"queue": "has space"}, ValueError, "queue must be 1-100 characters"),
    ({"queue": ".hidden"}, ValueError, "start with a letter or digit"),
    ({"payload": {"x": object()}}, TypeError, "not JSON-serialisable"),
    ({"payload": {1, 2}}, TypeError, "not JSON-serialisable"),
    ({"payload": float("nan")}, ValueError, "not valid JSON"),
    ({"payload": "x" * (256 * 1024)}, ValueError, "the limit is 262144"),
    ({"payload": {"nul": "a\x00b"}}, ValueError, "NUL character"),
    ({"payload": "\ud800"}, ValueError, "lone surrogate"),
    ({"max_attempts": 0}, ValueError, "max_attempts must be between 1"),
    ({"max_attempts": -3}, ValueError, "max_attempts must be between 1"),
    ({"max_attempts": 2.0}, TypeError, "max_attempts must be an int"),
    ({"max_attempts": True}, TypeError, "max_attempts must be an int"),
    ({"run_after": datetime(2030, 1, 1)}, ValueError, "timezone-aware"),
    ({"run_after": "tomorrow"}, TypeError, "run_after must be a datetime or a timedelta"),
    ({"priority": 40000}, ValueError, "priority must fit"),
    ({"priority": "high"}, TypeError, "priority must be an int"),
    ({"dedup_key": ""}, ValueError, "dedup_key must not be empty"),
    ({"dedup_key": 7}, TypeError, "dedup_key must be a str"),
    ({"dedup_key": "k" * 501}, ValueError, "dedup_key is 501 characters"),
    # A job that would expire before it could start: never run, only cancelled.
    pytest.param(
        {
            "run_after": datetime(2030, 1, 2, tzinfo=UTC),
            "expires": datetime(2030, 1, 1, tzinfo=UTC),
        },
        ValueError,
        r"run_after \(2030-01-02T00:00:00\+00:00\) is not before expires \(2030-01-01T00:00",
        id="run_after-later-than-expires",
    ),
    pytest.param(
        {
            "run_after": datetime(2030, 1, 1, tzinfo=UTC),
            "expires": datetime(2030, 1, 1, tzinfo=UTC),
        },
        ValueError,
        "run_after .* is not before expires",
        id="run_after-at-expires",
    ),
    pytest.param(
        {"run_after": timedelta(hours=2), "expires": timedelta(hours=1)},
        ValueError,
        r"run_after \(2:00:00 from now\) is not before expires \(1:00:00 from now\)",
        id="run_after-later-than-expires-as-timedeltas",
    ),
    pytest.param(
        {"run_after": datetime.now(UTC) + timedelta(hours=2), "expires": timedelta(hours=1)},
        ValueError,
        "run_after .* is not before expires",
        id="run_after-instant-later-than-expires-from-now",
    ),
    pytest.param(
        {"run_after": timedelta(days=2), "expires": datetime.now(UTC) + timedelta(days=1)},
        ValueError,
        "run_after .* is not before expires",
        id="run_after-from-now-later-than-expires-instant",
    ),
    # JSON object keys are text: json.dumps would store {1: "a"} as {"1": "a"}.
    pytest.param(
        {"payload": {1: "a"}},
        TypeError,
        r"payload has a key that is not a string: 1 \(int\) at payload\b",
        id="payload-int-key",
    ),
    pytest.param(
        {"payload": {"rows": [{"ok": 1}, {None: "x"}]}},
        TypeError,
        r"key that is not a string: None \(NoneType\) at payload\['rows'\]\[1\]",
        id="payload-nested-none-key",
    ),
    pytest.param(
        {"payload": [{True: 1}]},
        TypeError,
        r"key that is not a string: True \(bool\)",
        id="payload-bool-key",
    ),
]


@pytest.mark.parametrize(("override", "error", "message"), BAD)
def test_bad_arguments_raise_before_writing(
    engine: Engine, pg: psycopg.Connection, override: dict, error: type, message: str
) -> None:
    args = {"job_type": "t", "payload": {}} | override
    job_type, payload = args.pop("job_type"), args.pop("payload")
    with Session(engine) as session, session.begin():
        outbox.enqueue(session, "fine", {"before": True})
        with pytest.raises(error, match=message):
            outbox.enqueue(session, job_type, payload, **args)
        with pytest.raises(error, match=message):
            outbox.enqueue_many(session, [NewJob("ok", {}), NewJob(job_type, payload, **args)])
    # The caller's transaction went on and committed its own work; nothing else.
    assert pg.execute("SELECT job_type FROM jobs").fetchall() == [("fine",)]


def test_run_after_before_expires_is_accepted(engine: Engine, pg: psycopg.Connection) -> None:
    soon = datetime.now(UTC) + timedelta(minutes=5)
    with Session(engine) as session, session.begin():
        outbox.enqueue(session, "t", {}, run_after=timedelta(minutes=1), expires=timedelta(hours=1))
        outbox.enqueue(session, "t", {}, run_after=soon, expires=soon + timedelta(seconds=1))
        outbox.enqueue(session, "t", {}, run_after=timedelta(minutes=1), expires=soon)
        outbox.enqueue(session, "t", {}, run_after=soon, expires=timedelta(hours=1))
    assert pg.execute("SELECT bool_and(run_after < expires_at) FROM jobs").fetchone() == (True,)


def test_payload_limit_is_configurable(
    engine: Engine, pg: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(outbox.MAX_PAYLOAD_BYTES_ENV, "100")
    with Session(engine) as session, session.begin():
        outbox.enqueue(session, "t", "x" * 90)
        with pytest.raises(ValueError, match="the limit is 100"):
            outbox.enqueue(session, "t", "x" * 100)
    assert _rows(pg, "jobs") == 1


def test_enqueue_many_rejects_non_newjob(engine: Engine) -> None:
    with Session(engine) as session, pytest.raises(TypeError, match="NewJob"):
        outbox.enqueue_many(session, [("t", {})])  # type: ignore[list-item]


def test_job_ids_are_unique_uuids(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        ids = outbox.enqueue_many(session, [NewJob("t", {}) for _ in range(50)])
    assert all(isinstance(i, uuid.UUID) for i in ids)
    assert len(set(ids)) == 50


def test_a_null_payload_is_stored_as_json_null(engine: Engine, pg) -> None:
    with Session(engine) as session, session.begin():
        job_id = outbox.enqueue(session, "t", None)
    assert pg.execute(
        "SELECT payload = 'null'::jsonb FROM jobs WHERE job_id = %s", [job_id]
    ).fetchone()[0]


async def test_a_none_payload_is_json_null_from_every_producer_to_the_handler(
    engine: Engine, pg, db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology
) -> None:
    """None is the JSON value null, as documented: never replaced by {} (nor
    refused). Stored as null by enqueue, enqueue_many and a schedule, and the
    handler gets None."""
    with Session(engine) as session, session.begin():
        one = outbox.enqueue(session, "seen", None)
        (many,) = outbox.enqueue_many(session, [NewJob("seen", None)])
        outbox.schedule(session, "nothing", "seen", None, every=timedelta(hours=1))
    rows = pg.execute(
        "SELECT jsonb_typeof(payload) FROM jobs UNION ALL SELECT jsonb_typeof(payload)"
        " FROM schedules"
    ).fetchall()
    assert rows == [("null",)] * 3
    registry = Registry()
    seen: list[object] = []

    @registry.handler("seen")
    async def remember(job: consumers.Job) -> None:
        seen.append(job.payload)

    async with both_running(db_url, amqp_url, topology, registry):
        for job_id in (one, many):
            await wait_for_state(pg, job_id, "SUCCEEDED")
    # (The hourly schedule may fire meanwhile, near the hour: null as well.)
    assert len(seen) >= 2 and all(payload is None for payload in seen), seen


def _encode(value: object) -> object:
    """A json_default for dates, ids and decimals, as a user would write one."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    raise TypeError(f"cannot encode a {type(value).__name__}")


WHEN = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
ORDER = uuid.UUID("0191e2a4-7c1d-7000-8000-000000000001")


async def test_a_json_default_encodes_values_json_cannot_hold_and_the_handler_reads_them(
    engine: Engine, pg, db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology
) -> None:
    """datetime, UUID and Decimal are refused by default; with json_default they are
    stored as what it made of them (plain JSON), through enqueue and enqueue_many
    alike, and that is what the handler reads."""
    payload = {"when": WHEN, "order": ORDER, "total": Decimal("10.50"), "lines": [(1, WHEN)]}
    with Session(engine) as session, session.begin():
        one = outbox.enqueue(session, "read", payload, json_default=_encode)
        (many,) = outbox.enqueue_many(session, [NewJob("read", payload, json_default=_encode)])
    plain = {
        "when": "2030-01-02T03:04:05+00:00",
        "order": str(ORDER),
        "total": "10.50",
        "lines": [[1, "2030-01-02T03:04:05+00:00"]],
    }
    stored = pg.execute("SELECT payload FROM jobs ORDER BY job_id").fetchall()
    assert stored == [(plain,), (plain,)]
    registry = Registry()
    seen: dict[uuid.UUID, object] = {}

    @registry.handler("read")
    async def read(job: consumers.Job) -> None:
        seen[job.id] = job.payload

    async with both_running(db_url, amqp_url, topology, registry):
        for job_id in (one, many):
            await wait_for_state(pg, job_id, "SUCCEEDED")
    assert seen == {one: plain, many: plain}


def test_without_a_json_default_a_value_json_cannot_hold_is_refused_with_its_path(
    engine: Engine, pg: psycopg.Connection
) -> None:
    with Session(engine) as session, session.begin():
        with pytest.raises(
            TypeError,
            match=r"not JSON-serialisable: payload\['rows'\]\[1\]\['at'\] is of type datetime",
        ):
            outbox.enqueue(session, "t", {"rows": [{"at": 1}, {"at": WHEN}]})
        with pytest.raises(TypeError, match=r"not JSON-serialisable: payload is of type set"):
            outbox.enqueue(session, "t", {1, 2})
    assert _rows(pg, "jobs") == 0


REFUSED_WITH_DEFAULT = [
    pytest.param(
        {"x": [object()]},
        TypeError,
        r"payload\['x'\]\[0\] is of type object, which json_default refused \(cannot encode",
        id="default-refuses",
    ),
    pytest.param(
        {"when": WHEN, 7: "x"}, TypeError, "key that is not a string: 7", id="non-string-key"
    ),
    pytest.param({"total": Decimal("NaN")}, ValueError, "not valid JSON", id="default-made-nan"),
    pytest.param(
        {"big": uuid.UUID(int=0)}, ValueError, "the limit is 100", id="size-after-default"
    ),
    pytest.param({"deep": WHEN}, ValueError, "more than 100 levels deep", id="depth-after-default"),
]


@pytest.mark.parametrize(("payload", "error", "message"), REFUSED_WITH_DEFAULT)
def test_a_json_default_keeps_every_payload_check(
    engine: Engine,
    pg: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
    payload: object,
    error: type,
    message: str,
) -> None:
    """What json_default makes is checked as any payload is (keys, NaN, size,
    depth), and a value it refuses is named by its path."""
    monkeypatch.setenv(outbox.MAX_PAYLOAD_BYTES_ENV, "100")

    def encode(value: object) -> object:
        if isinstance(value, Decimal):
            return float(value)
        if isinstance(value, uuid.UUID):
            return "x" * 100
        if isinstance(value, datetime) and "deep" in payload:  # type: ignore[operator]
            deep: object = 1
            for _ in range(100):
                deep = [deep]
            return deep
        return _encode(value)

    with Session(engine) as session, session.begin():
        with pytest.raises(error, match=message):
            outbox.enqueue(session, "t", payload, json_default=encode)
        with pytest.raises(error, match=message):
            outbox.enqueue_many(session, [NewJob("t", payload, json_default=encode)])
        with pytest.raises(TypeError, match="json_default must be a function"):
            outbox.enqueue(session, "t", {}, json_default="iso")  # type: ignore[arg-type]
    assert _rows(pg, "jobs") == 0


def test_a_json_default_that_never_reaches_json_is_refused(engine: Engine) -> None:
    """A json_default that keeps returning what JSON cannot hold, or a payload that
    holds itself, is refused rather than looped over."""
    looped: list[object] = []
    looped.append(looped)
    with Session(engine) as session, session.begin():
        with pytest.raises(TypeError, match=r"payload\['x'\] is of type object.* in 10 calls"):
            outbox.enqueue(session, "t", {"x": object()}, json_default=lambda value: object())
        with pytest.raises(ValueError, match="more than 100 levels deep"):
            outbox.enqueue(session, "t", looped, json_default=_encode)
