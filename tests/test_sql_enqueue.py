"""Enqueue from SQL (hybrid_jobs_enqueue, migration 0027): the job and wake-up the
Python producer writes, refused where it refuses, deduplicated as it deduplicates,
from psql, from a trigger, and run by a real relay and consumer."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql
from psycopg.types.json import Jsonb
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import defaults, outbox
from hybrid_jobs.plumbing.config import DatabaseUrl
from tests.support.jobs import until, wait_for_state
from tests.support.processes import fleet

# The same job through either door: Python's keyword arguments, and the SQL call's.
SAME: dict[str, Any] = {
    "queue": "mail",
    "dedup_key": "order-7",
    "priority": 3,
    "max_attempts": 4,
    "tenant": "acme",
    "tags": ["billing", "eu", "billing"],
    "meta": {"source": "checkout", "n": [1, 2]},
}
SQL_SAME = (
    "SELECT hybrid_jobs_enqueue('send_receipt', %(payload)s, queue => 'mail',"
    " dedup_key => 'order-7', delay => interval '90 seconds', priority => 3,"
    " max_attempts => 4, tenant => 'acme', tags => '{billing,eu,billing}',"
    ' meta => \'{"source": "checkout", "n": [1, 2]}\')'
)
PAYLOAD = {"order_id": 7, "lines": [{"sku": "A-1", "qty": 2}], "note": "café, « 10 % »"}
# What differs between any two jobs: their id, and the instants they were written.
_TIMES = {"job_id", "created_at", "updated_at", "run_after"}


def _psql(db_url: DatabaseUrl, statement: str) -> subprocess.CompletedProcess[str]:
    """``statement`` run by the psql a user has, one value a line; through psycopg as a
    plain SQL call where psql is not installed."""
    psql = shutil.which("psql")
    if psql is None:
        with psycopg.connect(db_url.conninfo, autocommit=True) as conn:
            try:
                rows = conn.execute(statement).fetchall()
            except psycopg.Error as exc:
                return subprocess.CompletedProcess([], 3, "", f"ERROR:  {exc.diag.message_primary}")
        return subprocess.CompletedProcess([], 0, "".join(f"{r[0]}\n" for r in rows), "")
    return subprocess.run(
        [psql, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", db_url.conninfo, "-c", statement],
        capture_output=True,
        text=True,
        timeout=30,
    )


def _job(pg: psycopg.Connection, job_id: uuid.UUID) -> dict[str, Any]:
    cur = pg.execute(
        "SELECT *, run_after - created_at AS due_in FROM jobs WHERE job_id = %s", [job_id]
    )
    names = [d.name for d in cur.description or []]
    row = cur.fetchone()
    assert row is not None, f"no job {job_id}"
    return {k: v for k, v in zip(names, row, strict=True) if k not in _TIMES}


def _wakeups(pg: psycopg.Connection, job_id: uuid.UUID) -> list[tuple[Any, ...]]:
    return pg.execute(
        "SELECT o.queue, o.tenant, o.priority, o.available_at = j.run_after, o.sent_at"
        " FROM outbox AS o JOIN jobs AS j USING (job_id) WHERE o.job_id = %s",
        [job_id],
    ).fetchall()


def _tags(pg: psycopg.Connection, job_id: uuid.UUID) -> list[str]:
    rows = pg.execute("SELECT tag FROM job_tags WHERE job_id = %s ORDER BY tag", [job_id])
    return [r[0] for r in rows]


def _count(pg: psycopg.Connection, table: str) -> int:
    row = pg.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def _refused_in_sql(pg: psycopg.Connection, payload: Any = None, **kw: Any) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught, pg.transaction():
        _call(pg, payload, **kw)
    return caught.value


def _call(pg: psycopg.Connection, payload: Any, **kw: Any) -> uuid.UUID:
    """hybrid_jobs_enqueue with ``kw`` as named arguments, as Python's enqueue
    takes them."""
    args = "".join(f", {name} => %({name})s" for name in kw if name != "job_type")
    values = {k: Jsonb(v) if k == "meta" else v for k, v in kw.items()}
    row = pg.execute(
        f"SELECT hybrid_jobs_enqueue(%(job_type)s, %(payload)s{args})",
        {"job_type": "t", **values, "payload": Jsonb(payload)},
    ).fetchone()
    assert row is not None
    return uuid.UUID(str(row[0]))


def test_psql_enqueues_the_job_and_wake_up_that_outbox_enqueue_writes(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    with Session(engine) as session, session.begin():
        python_id = outbox.enqueue(
            session, "send_receipt", PAYLOAD, run_after=timedelta(seconds=90), **SAME
        )
    by_python = (_job(pg, python_id), _wakeups(pg, python_id), _tags(pg, python_id))
    # the same arguments again would find the dedup_key taken: start from no job
    pg.execute("DELETE FROM jobs")

    literal = sql.quote(json.dumps(PAYLOAD, ensure_ascii=False))
    done = _psql(db_url, SQL_SAME.replace("%(payload)s", literal))
    assert done.returncode == 0, done.stderr
    sql_id = uuid.UUID(done.stdout.strip())

    assert (_job(pg, sql_id), _wakeups(pg, sql_id), _tags(pg, sql_id)) == by_python
    assert by_python[0]["due_in"] == timedelta(seconds=90)
    assert by_python[0]["tags"] == ["billing", "eu"]
    assert by_python[1] == [("mail", "acme", 3, True, None)]


def test_a_call_with_only_a_type_and_a_payload_writes_what_the_plain_python_enqueue_writes(
    engine: Engine, pg: psycopg.Connection
) -> None:
    with Session(engine) as session, session.begin():
        python_id = outbox.enqueue(session, "noop", None)
    row = pg.execute("SELECT hybrid_jobs_enqueue('noop', NULL)").fetchone()
    assert row is not None
    sql_id = row[0]
    assert _job(pg, sql_id) == _job(pg, python_id)
    assert _job(pg, sql_id)["payload"] is None  # SQL NULL is stored as JSON null
    assert _wakeups(pg, sql_id) == _wakeups(pg, python_id) == [("default", "", 0, True, None)]


def test_a_taken_dedup_key_returns_the_existing_job_whichever_door_took_it(
    engine: Engine, pg: psycopg.Connection
) -> None:
    call = "SELECT hybrid_jobs_enqueue('sync_account', %s, dedup_key => 'acct-1')"
    first = pg.execute(call, [Jsonb({"n": 1})]).fetchone()
    again = pg.execute(call, [Jsonb({"n": 2})]).fetchone()
    assert first is not None and again is not None
    assert again[0] == first[0]
    with Session(engine) as session, session.begin():
        assert outbox.enqueue(session, "sync_account", {"n": 3}, dedup_key="acct-1") == first[0]
    assert _count(pg, "jobs") == 1
    assert _count(pg, "outbox") == 1
    assert _job(pg, first[0])["payload"] == {"n": 1}
    # and the other way round: a key Python took, SQL finds
    with Session(engine) as session, session.begin():
        python_id = outbox.enqueue(session, "sync_account", {}, dedup_key="acct-2")
    found = pg.execute(call.replace("acct-1", "acct-2"), [Jsonb({})]).fetchone()
    assert found is not None and found[0] == python_id


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


# (keyword arguments, a payload): refused by both doors with the same ValueError text
REFUSALS: list[tuple[str, dict[str, Any], Any]] = [
    ("job_type", {"job_type": ""}, {}),
    ("job_type", {"job_type": "x" * (defaults.MAX_JOB_TYPE_LENGTH + 1)}, {}),
    ("job_type", {"job_type": "send\nemail"}, {}),
    ("queue", {"queue": "my queue"}, {}),
    ("queue", {"queue": "q" * (defaults.MAX_QUEUE_NAME_LENGTH + 1)}, {}),
    ("queue", {"queue": "mail\x1b[2J"}, {}),
    ("dedup_key", {"dedup_key": ""}, {}),
    ("dedup_key", {"dedup_key": "k" * (defaults.MAX_DEDUP_KEY_LENGTH + 1)}, {}),
    ("tenant", {"tenant": "-acme"}, {}),
    ("priority", {"priority": 32768}, {}),
    ("priority", {"priority": -32769}, {}),
    ("max_attempts", {"max_attempts": 0}, {}),
    ("max_attempts", {"max_attempts": defaults.MAX_ATTEMPTS_LIMIT + 1}, {}),
    ("tags", {"tags": ["ok", "not ok"]}, {}),
    ("tags", {"tags": [f"t{i}" for i in range(defaults.MAX_TAGS + 1)]}, {}),
    ("meta", {"meta": {"m": "x" * defaults.MAX_META_BYTES}}, {}),
    ("meta", {"meta": {"m": _deep(defaults.MAX_PAYLOAD_DEPTH)}}, {}),
    ("payload", {}, {"s": "x" * defaults.MAX_PAYLOAD_BYTES}),
    ("payload", {}, _deep(defaults.MAX_PAYLOAD_DEPTH + 1)),
]


@pytest.mark.parametrize(
    ("argument", "kw", "payload"),
    REFUSALS,
    ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(REFUSALS)],
)
def test_each_refusal_of_python_is_refused_in_sql_with_its_text_and_writes_nothing(
    engine: Engine, pg: psycopg.Connection, argument: str, kw: dict[str, Any], payload: Any
) -> None:
    python_kw = {"job_type": "t", **kw}
    with pytest.raises(ValueError) as python, Session(engine) as session, session.begin():
        outbox.enqueue(session, python_kw.pop("job_type"), payload, **python_kw)
    refused = _refused_in_sql(pg, payload, **kw)
    assert isinstance(refused, errors.InvalidParameterValue)  # SQLSTATE 22023
    message = refused.diag.message_primary or ""
    assert message.startswith(argument)
    # the one difference: SQL names the setting that changes the payload limit
    assert message == str(python.value).replace(
        "(MAX_PAYLOAD_BYTES)", "(hybrid_jobs.max_payload_bytes)"
    )
    assert _count(pg, "jobs") == _count(pg, "outbox") == _count(pg, "job_tags") == 0


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"job_type": None}, "job_type must not be null"),
        ({"queue": None}, "queue must not be null"),
        ({"priority": None}, "priority must fit in a smallint (-32768..32767)"),
        (
            {"run_after": "2030-01-01T00:00:00Z", "delay": timedelta(seconds=1)},
            "run_after and delay both say when the job is due: give one",
        ),
        ({"run_after": "infinity"}, "run_after must be a finite time"),
        ({"meta": Jsonb([1])}, "meta must be a JSON object, not array"),
        ({"tags": [["a"], ["b"]]}, "tags must be a one-dimensional array of text"),
        ({"tags": ["a", None]}, "tags: tag must not be null"),
    ],
)
def test_what_only_sql_can_say_is_refused_naming_the_argument(
    pg: psycopg.Connection, kw: dict[str, Any], message: str
) -> None:
    values: dict[str, Any] = {"job_type": "t", **kw}
    args = "".join(f", {name} => %({name})s" for name in kw if name != "job_type")
    if "run_after" in kw:
        args = args.replace("%(run_after)s", "%(run_after)s::timestamptz")
    with pytest.raises(errors.InvalidParameterValue) as caught, pg.transaction():
        pg.execute(f"SELECT hybrid_jobs_enqueue(%(job_type)s, '{{}}'{args})", values)
    assert caught.value.diag.message_primary == message
    assert _count(pg, "jobs") == 0


def _compact_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def test_every_limit_admits_a_value_at_it_as_python_does(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """With the refusals just past each limit, this pins the function's limits to
    hybrid_jobs/defaults.py's, on the real database."""
    # two bytes a character, then one: bytes are counted, not characters
    room = defaults.MAX_PAYLOAD_BYTES - _compact_bytes({"s": ""})
    filler = {"s": "é" * (room // 4) + "x" * (room - 2 * (room // 4))}
    assert _compact_bytes(filler) == defaults.MAX_PAYLOAD_BYTES
    meta = {"m": "x" * (defaults.MAX_META_BYTES - _compact_bytes({"m": ""}))}
    at_limits: list[tuple[dict[str, Any], Any]] = [
        ({"job_type": "x" * defaults.MAX_JOB_TYPE_LENGTH}, {}),
        ({"queue": "q" * defaults.MAX_QUEUE_NAME_LENGTH}, {}),
        ({"dedup_key": "k\n" * (defaults.MAX_DEDUP_KEY_LENGTH // 2)}, {}),
        ({"tenant": "a.b:c-d_e"}, {}),
        ({"priority": 32767, "max_attempts": defaults.MAX_ATTEMPTS_LIMIT}, {}),
        ({"priority": -32768, "max_attempts": 1}, {}),
        ({"tags": [f"t{i}" for i in range(defaults.MAX_TAGS)]}, {}),
        ({"tags": ["a" * defaults.MAX_TAG_LENGTH]}, {}),
        ({"meta": meta}, {}),
        ({"meta": {"m": _deep(defaults.MAX_PAYLOAD_DEPTH - 1)}}, {}),
        ({}, filler),
        ({}, _deep(defaults.MAX_PAYLOAD_DEPTH)),
    ]
    for kw, payload in at_limits:
        values = {"job_type": "t", **kw}
        with Session(engine) as session, session.begin():
            outbox.enqueue(session, values.pop("job_type"), payload, **values)
            session.rollback()
        with pg.transaction(force_rollback=True):
            _call(pg, payload, **kw)


def test_the_payload_limit_follows_the_setting(pg: psycopg.Connection) -> None:
    with pg.transaction(force_rollback=True):
        pg.execute("SET LOCAL hybrid_jobs.max_payload_bytes = 20")
        # 18 bytes as compact JSON, 19 as jsonb's text; then 21
        pg.execute("SELECT hybrid_jobs_enqueue('t', %s)", ['{"s": "0123456789"}'])
        with pytest.raises(errors.InvalidParameterValue) as caught, pg.transaction():
            pg.execute("SELECT hybrid_jobs_enqueue('t', %s)", ['{"s": "0123456789abc"}'])
    assert caught.value.diag.message_primary == (
        "payload is 21 bytes as JSON; the limit is 20 (hybrid_jobs.max_payload_bytes)"
    )


def test_a_tenant_over_its_max_queued_or_its_enqueue_rate_is_refused_as_python_refuses_it(
    engine: Engine, pg: psycopg.Connection
) -> None:
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "full", max_queued=1)
        outbox.set_tenant_limit(session, "fast", max_enqueue_rate=1)
    pg.execute("SELECT hybrid_jobs_enqueue('t', '{}', tenant => 'full')")
    with pytest.raises(outbox.Backpressure) as python, Session(engine) as session:
        outbox.enqueue(session, "t", {}, tenant="full")
    with pytest.raises(errors.ConfigurationLimitExceeded) as caught, pg.transaction():
        pg.execute("SELECT hybrid_jobs_enqueue('t', '{}', tenant => 'full')")
    assert caught.value.diag.message_primary == str(python.value)

    # one token a second, a second's worth at most: the second in one instant waits
    with pytest.raises(errors.ConfigurationLimitExceeded) as caught, pg.transaction():
        pg.execute("SELECT hybrid_jobs_enqueue('t', '{}', tenant => 'fast')")
        pg.execute("SELECT hybrid_jobs_enqueue('t', '{}', tenant => 'fast')")
    assert (caught.value.diag.message_primary or "").startswith(
        "tenant 'fast' enqueues faster than 1 jobs/s; retry in about"
    )
    assert _count(pg, "jobs") == 1


def test_the_ids_are_uuidv7_and_sort_in_the_order_of_the_calls(pg: psycopg.Connection) -> None:
    ids: list[uuid.UUID] = []
    for _ in range(5):
        row = pg.execute(
            "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint,"
            " hybrid_jobs_enqueue('t', '{}'),"
            " floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint,"
            " pg_sleep(0.002)"
        ).fetchone()
        assert row is not None
        before, job_id, after, _ = row
        assert job_id.version == 7 and job_id.variant == uuid.RFC_4122
        assert before <= job_id.int >> 80 <= after
        ids.append(job_id)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


_ORDERS = """
CREATE TABLE orders (id int PRIMARY KEY, email text NOT NULL);
CREATE FUNCTION orders_enqueue_receipt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM hybrid_jobs_enqueue('record', jsonb_build_object('key', 'order-' || NEW.id),
                              dedup_key => 'receipt-' || NEW.id);
  RETURN NULL;
END $$;
CREATE TRIGGER orders_enqueue_receipt AFTER INSERT ON orders
  FOR EACH ROW EXECUTE FUNCTION orders_enqueue_receipt();
"""


def test_a_trigger_enqueues_in_the_transaction_of_the_row_and_rolls_back_with_it(
    pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    pg.execute(_ORDERS)
    with pg.transaction(force_rollback=True):
        pg.execute("INSERT INTO orders VALUES (1, 'a@example.com')")
        assert _count(pg, "jobs") == _count(pg, "outbox") == 1  # the same transaction
    assert _count(pg, "jobs") == _count(pg, "outbox") == 0

    with psycopg.connect(db_url.conninfo, autocommit=True) as listener:
        listener.execute('LISTEN "public.outbox"')
        pg.execute("INSERT INTO orders VALUES (2, 'b@example.com')")
        # the outbox trigger's NOTIFY, sent at commit, tells the relay which queue
        notices = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert notices == ["default"]
    row = pg.execute("SELECT job_type, payload, dedup_key FROM jobs").fetchone()
    assert row == ("record", {"key": "order-2"}, "receipt-2")


@pytest.mark.timeout(120)
async def test_a_job_enqueued_by_a_trigger_is_run_by_the_relay_and_a_consumer(
    pg: psycopg.Connection, env: dict[str, str]
) -> None:
    pg.execute("CREATE TABLE effects (key text PRIMARY KEY, job_id uuid, worker text, pid int)")
    pg.execute(_ORDERS)
    with fleet(env, ["--app", "tests.apps.basic"]):
        pg.execute("INSERT INTO orders VALUES (3, 'c@example.com')")
        row = pg.execute("SELECT job_id FROM jobs").fetchone()
        assert row is not None
        job_id = row[0]
        await wait_for_state(pg, job_id, "SUCCEEDED")
    effect = await until(
        lambda: pg.execute("SELECT key, job_id FROM effects").fetchall(), "the effect"
    )
    assert effect == [("order-3", job_id)]
