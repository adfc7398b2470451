"""Several instances in one database, each in its own schema (HYBRID_JOBS_SCHEMA):
tables, functions, advisory locks, NOTIFY channels and broker names apart, so that
each instance's relay and consumers drain its own jobs only; and an install from
before the setting (in public) found and named, never split from."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import psycopg
import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.outbox.waiting import APPLICATION_NAME as WAIT_APPLICATION
from hybrid_jobs.plumbing.cli import connection_options, topology
from hybrid_jobs.plumbing.config import ConfigError, DatabaseUrl, check_schema
from hybrid_jobs.plumbing.db import make_pool
from hybrid_jobs.schema import revisions
from hybrid_jobs.schema.locks import LockKey
from hybrid_jobs.schema.queries.outbox import OUTBOX_WAKE_QUEUE
from hybrid_jobs.schema.queries.worker import MAINTENANCE_TRY_LOCK
from hybrid_jobs.schema.topology import Topology
from tests.conftest import _admin, _database, _url_for
from tests.support import databases, pgbouncer
from tests.support.broker import delete_topology
from tests.support.processes import (
    BIN,
    ROOT,
    fleet,
    jobctl,
    jobctl_env,
    jobctl_process,
    refused,
    service_env,
)
from tests.support.services import AMQP_URL

A, B = "inst_a", "inst_b"
APP = ["--app", "tests.apps.basic"]


def _migrate(url: DatabaseUrl, schema: str | None) -> None:
    env = {"HYBRID_JOBS_SCHEMA": schema} if schema else {}
    # A process of its own, as a user runs it, which leaves no connection behind: the
    # database is then copied, which PostgreSQL refuses while one is open.
    done = jobctl_process("migrate", url=url, cwd=Path(ROOT), **env)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def _two_instances(postgres_up: None) -> Iterator[str]:
    """A database holding two instances, in schemas inst_a and inst_b, each made by
    `jobctl migrate`: the template of each test's own copy."""
    with _database("hj_inst") as name:
        _migrate(_url_for(name), A)
        _migrate(_url_for(name), B)
        yield name


@pytest.fixture
def shared(_two_instances: str, _dropper: databases.Dropper) -> Iterator[DatabaseUrl]:
    """One database holding two instances, in schemas inst_a and inst_b."""
    name = databases.new_name("hj_i")
    databases.create(_admin, name, _two_instances)
    yield _url_for(name)
    _dropper.drop_later(name)


@pytest.fixture
def engines(shared: DatabaseUrl) -> Iterator[dict[str, Engine]]:
    """The application's engine for each instance, bound as the guide says."""
    made = {schema: create_engine(shared.sqlalchemy) for schema in (A, B)}
    for schema, engine in made.items():
        assert outbox.bind_instance(engine, schema) == schema
    yield made
    for engine in made.values():
        engine.dispose()


@pytest.fixture
def raw(shared: DatabaseUrl) -> Iterator[psycopg.Connection]:
    """A connection looking at both instances by their qualified names."""
    with psycopg.connect(shared.conninfo, autocommit=True) as conn:
        yield conn


def _alembic(*args: str, url: DatabaseUrl, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "alembic"), *args],
        cwd=ROOT,
        env=jobctl_env(url, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _enqueue(engine: Engine, count: int) -> list[uuid.UUID]:
    with Session(engine) as session, session.begin():
        return outbox.enqueue_many(session, [outbox.NewJob("noop", {}) for _ in range(count)])


def _states(conn: psycopg.Connection, schema: str) -> dict[str, int]:
    rows = conn.execute(f"SELECT state, count(*) FROM {schema}.jobs GROUP BY state").fetchall()
    return {state: n for state, n in rows}


async def _until_succeeded(conn: psycopg.Connection, schema: str, count: int) -> None:
    deadline = time.monotonic() + 60
    while _states(conn, schema).get("SUCCEEDED", 0) < count:
        assert time.monotonic() < deadline, f"{schema}: {_states(conn, schema)}"
        await asyncio.sleep(0.1)


def test_a_schema_name_is_checked_and_reaches_every_connection() -> None:
    assert check_schema("hybrid_jobs") == "hybrid_jobs"
    for bad in ("", "Upper", "pg_catalog", "a-b", 'a"; DROP', "x" * 49, "1st"):
        with pytest.raises(ConfigError, match="HYBRID_JOBS_SCHEMA"):
            check_schema(bad)
    url = DatabaseUrl.parse("postgresql://u@h1:5432,h2:5433/db?options=-c%20jit%3Doff")
    placed = url.in_schema("inst_a")
    assert placed.params["options"] == "-c jit=off -c search_path=inst_a"
    assert placed.params["host"] == "h1,h2"
    pooled = DatabaseUrl.parse("postgresql://u@h/db")
    pooled = DatabaseUrl(pooled.conninfo, pooled=True).in_schema("inst_a")
    assert "options" not in pooled.params, "a transaction pooler drops startup options"


def test_the_broker_prefix_follows_a_named_instance() -> None:
    @click.command()
    @connection_options
    def probe(**kwargs: str) -> None:
        click.echo(topology(kwargs["amqp_prefix"], kwargs["queue_type"]).prefix)

    def prefix(**env: str | None) -> str:
        done = CliRunner().invoke(probe, [], env={"AMQP_PREFIX": None, **env})
        assert done.exit_code == 0, done.output
        return done.output.strip()

    assert prefix(HYBRID_JOBS_SCHEMA="billing") == "billing"
    assert prefix(HYBRID_JOBS_SCHEMA="public") == "jobs", "an install from before keeps its queues"
    assert prefix(HYBRID_JOBS_SCHEMA=None) == "jobs"
    assert prefix(HYBRID_JOBS_SCHEMA="billing", AMQP_PREFIX="shared") == "shared"


def test_each_instance_has_its_own_tables_and_functions(
    shared: DatabaseUrl, raw: psycopg.Connection
) -> None:
    for schema in (A, B):
        version = raw.execute(f"SELECT version_num FROM {schema}.alembic_version").fetchone()
        assert version == (revisions.head(),)
    assert raw.execute("SELECT to_regclass('public.jobs')").fetchone() == (None,)
    # Every function runs with its own instance's search_path, and notifies its
    # instance's channels.
    rows = raw.execute(
        """SELECT n.nspname, p.proname, p.proconfig, p.prosrc
           FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
           WHERE n.nspname IN (%s, %s)""",
        [A, B],
    ).fetchall()
    assert len(rows) >= 2 * 9
    tables = {
        r[0]
        for r in raw.execute(
            "SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v')",
            [A],
        )
    }
    assert {"jobs", "outbox", "tenant_usage"} <= tables
    for schema, name, config, source in rows:
        # A function whose body names a table of the instance runs with the
        # instance's search_path; one that names none may go without (a SET costs
        # every call).
        if config is None:
            code = re.sub(r"'(?:[^']|'')*'", "''", source)  # not in a string (a channel)
            named = {t for t in tables if re.search(rf"\b{t}\b", code)}
            assert not named, (schema, name, named)
        else:
            assert config == [f'search_path="{schema}"'], (schema, name)
        if "pg_notify" in source:
            assert "TG_TABLE_SCHEMA" in source and "pg_notify('" not in source, name


def test_producers_daemons_and_jobctl_each_see_their_own_instance(
    shared: DatabaseUrl,
    engines: dict[str, Engine],
    raw: psycopg.Connection,
    rabbitmq_up: None,
) -> None:
    topologies = {s: Topology(prefix=f"t{uuid.uuid4().hex[:10]}") for s in (A, B)}
    envs = {s: service_env(shared, AMQP_URL, topologies[s], HYBRID_JOBS_SCHEMA=s) for s in (A, B)}
    try:
        a_first = _enqueue(engines[A], 20)
        b_first = _enqueue(engines[B], 30)
        assert _states(raw, A) == {"QUEUED": 20} and _states(raw, B) == {"QUEUED": 30}
        with fleet(envs[A], APP) as (relay_a, _):
            asyncio.run(_until_succeeded(raw, A, 20))
            # A's relay and consumer never touched B's jobs.
            assert _states(raw, B) == {"QUEUED": 30}
            with fleet(envs[B], APP) as (relay_b, _):
                a_more = _enqueue(engines[A], 10)
                asyncio.run(_until_succeeded(raw, B, 30))
                asyncio.run(_until_succeeded(raw, A, 30))
            for relay, schema in ((relay_a, A), (relay_b, B)):
                listening = relay.wait_for_event("relay.listening")
                assert listening["channel"] == f"{schema}.outbox"
        assert set(a_first + a_more).isdisjoint(b_first)
        for schema, ids in ((A, a_first + a_more), (B, b_first)):
            found = raw.execute(f"SELECT job_id FROM {schema}.jobs").fetchall()
            assert {row[0] for row in found} == set(ids)
            attempts = raw.execute(f"SELECT count(*) FROM {schema}.job_attempts").fetchone()
            assert attempts == (len(ids),)
        # jobctl pointed at each instance counts its own jobs only.
        for schema in (A, B):
            done = jobctl("stats", "--json", url=shared, cwd=Path(ROOT), HYBRID_JOBS_SCHEMA=schema)
            assert done.returncode == 0, done.stderr
            queues = {q["queue"]: q["succeeded"] for q in json.loads(done.stdout)["queues"]}
            assert queues == {"default": 30}, (schema, queues)
    finally:
        for topology in topologies.values():
            asyncio.run(delete_topology(AMQP_URL, topology, {"default", "sync"}))


async def test_advisory_locks_are_per_instance(shared: DatabaseUrl) -> None:
    pools = {s: make_pool(shared.in_schema(s), "test", max_size=2) for s in (A, B)}
    for pool in pools.values():
        await pool.open(wait=True)
    try:
        async with pools[A].connection() as held, held.transaction():
            key = {"key": int(LockKey.SWEEP)}
            assert (await (await held.execute(MAINTENANCE_TRY_LOCK, key)).fetchone()) == (True,)
            async with pools[A].connection() as same:
                row = await (await same.execute(MAINTENANCE_TRY_LOCK, key)).fetchone()
                assert row == (False,), "two relays of one instance take turns"
            async with pools[B].connection() as other:
                row = await (await other.execute(MAINTENANCE_TRY_LOCK, key)).fetchone()
                assert row == (True,), "another instance's chore does not wait"
        # The relay's per-queue lock (the first step of its decision) too.
        gate = OUTBOX_WAKE_QUEUE.split("), settled AS")[0].removeprefix(
            "\nWITH RECURSIVE gate AS ("
        )
        async with pools[A].connection() as held, held.transaction():
            await held.execute(gate, {"queue": "default"})
            async with pools[B].connection() as other:
                row = await (await other.execute(gate, {"queue": "default"})).fetchone()
                assert row == (True,)
            async with pools[A].connection() as same:
                row = await (await same.execute(gate, {"queue": "default"})).fetchone()
                assert row == (False,)
    finally:
        for pool in pools.values():
            await pool.close()
    # Two instances' migrations do not wait for each other.
    with psycopg.connect(shared.conninfo) as one, psycopg.connect(shared.conninfo) as two:
        one.execute(revisions.MIGRATION_LOCK, {"schema": A})
        two.execute("SET lock_timeout = '2s'")
        two.execute(revisions.MIGRATION_LOCK, {"schema": B})
        with pytest.raises(psycopg.errors.LockNotAvailable):
            two.execute(revisions.MIGRATION_LOCK, {"schema": A})


def test_sql_enqueue_works_from_a_connection_looking_elsewhere(
    shared: DatabaseUrl, raw: psycopg.Connection
) -> None:
    with psycopg.connect(shared.conninfo, autocommit=True) as listener:
        listener.execute('LISTEN "inst_b.outbox"')
        listener.execute('LISTEN "inst_a.outbox"')
        # search_path public: the function and its triggers find their own tables.
        raw.execute("SET search_path = public")
        row = raw.execute("SELECT inst_b.hybrid_jobs_enqueue('noop', '{}'::jsonb)").fetchone()
        assert row is not None
        heard = list(listener.notifies(timeout=10, stop_after=1))
    assert [n.channel for n in heard] == ["inst_b.outbox"]
    assert raw.execute("SELECT job_id FROM inst_b.jobs").fetchall() == [(row[0],)]
    assert raw.execute("SELECT count(*) FROM inst_b.outbox").fetchone() == (1,)
    assert _states(raw, A) == {}


def test_waiting_for_a_job_listens_on_its_instance(
    engines: dict[str, Engine], raw: psycopg.Connection
) -> None:
    (job_id,) = _enqueue(engines[B], 1)
    with ThreadPoolExecutor(1) as pool:
        waited = pool.submit(outbox.wait_for, engines[B], job_id, 30)
        # The listening connection's last statement names B's channel.
        deadline = time.monotonic() + 20
        while not raw.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND query = %s",
            [WAIT_APPLICATION, 'LISTEN "inst_b.job_finished"'],
        ).fetchone():
            assert time.monotonic() < deadline, "no listener on inst_b.job_finished"
            time.sleep(0.05)
        raw.execute("UPDATE inst_b.jobs SET state = 'CANCELLED' WHERE job_id = %s", [job_id])
        assert waited.result(timeout=40).state == "CANCELLED"


def test_bind_instance_refuses_a_table_that_would_hide_the_instances(
    shared: DatabaseUrl, raw: psycopg.Connection
) -> None:
    engine = create_engine(shared.sqlalchemy)
    nowhere = create_engine(shared.sqlalchemy)
    try:
        raw.execute("CREATE TABLE public.outbox (id int)")
        outbox.bind_instance(engine, A)
        with pytest.raises(ConfigError, match=r"public\.outbox .*schema inst_a"):
            engine.connect()
        raw.execute("DROP TABLE public.outbox")
        outbox.bind_instance(nowhere, "inst_c")
        with pytest.raises(ConfigError, match="HYBRID_JOBS_SCHEMA=inst_c"):
            nowhere.connect()
    finally:
        engine.dispose()
        nowhere.dispose()
    # The application's own unqualified names still find its own tables first.
    raw.execute("CREATE TABLE public.orders (id int)")
    bound = create_engine(shared.sqlalchemy)
    outbox.bind_instance(bound, A)
    with bound.connect() as conn:
        assert conn.execute(text("SELECT to_regclass('orders')::text")).scalar() == "orders"
        path = conn.execute(text("SHOW search_path")).scalar()
        assert path == '"$user", public, inst_a'
    bound.dispose()


async def test_an_async_engine_binds_the_same_way(
    shared: DatabaseUrl, raw: psycopg.Connection
) -> None:
    engine = create_async_engine(shared.sqlalchemy)
    outbox.bind_instance(engine, B)
    try:
        async with AsyncSession(engine) as session, session.begin():
            job_id = await outbox.enqueue_async(session, "noop", {})
    finally:
        await engine.dispose()
    assert raw.execute("SELECT job_id FROM inst_b.jobs").fetchall() == [(job_id,)]
    assert _states(raw, A) == {}


def test_an_install_in_public_is_found_and_named(db_url: DatabaseUrl) -> None:
    """An install from before HYBRID_JOBS_SCHEMA (the tests' databases are one)."""
    unset = {"HYBRID_JOBS_SCHEMA": ""}
    done = jobctl("migrate", url=db_url, cwd=Path(ROOT), **unset)
    assert done.returncode == 2
    assert "already holds one in schema public: set HYBRID_JOBS_SCHEMA=public" in done.stderr
    env = service_env(db_url, AMQP_URL, Topology(prefix="unused"), **unset)
    said = refused("relay", [], env).stderr
    assert "no jobs table in schema hybrid_jobs" in said
    assert "set HYBRID_JOBS_SCHEMA=public to use it" in said
    alembic = _alembic("upgrade", "head", url=db_url, **unset)
    assert alembic.returncode == 1
    assert "already holds one in schema public" in alembic.stderr
    # Set to public, everything works as before (this whole suite runs so), alembic's
    # own command line included.
    done = jobctl("migrate", url=db_url, cwd=Path(ROOT), HYBRID_JOBS_SCHEMA="public")
    assert done.returncode == 0, done.stderr
    assert "already at head" in done.stdout
    for step in (("downgrade", "0027"), ("upgrade", "head")):
        alembic = _alembic(*step, url=db_url, HYBRID_JOBS_SCHEMA="public")
        assert alembic.returncode == 0, alembic.stderr
        with psycopg.connect(db_url.conninfo) as conn:
            found = conn.execute("SELECT version_num FROM public.alembic_version").fetchone()
        assert found == ("0027" if step[0] == "downgrade" else revisions.head(),)
    # Creating a second instance beside it is a choice said out loud.
    done = jobctl("migrate", url=db_url, cwd=Path(ROOT), HYBRID_JOBS_SCHEMA="hybrid_jobs")
    assert done.returncode == 0, done.stderr


def test_through_a_transaction_pooler_the_role_or_database_names_the_schema(
    shared: DatabaseUrl,
) -> None:
    """Startup options do not pass a transaction pooler: the server's own setting
    for the database (or the role) must name the schema, and the start-up check
    says so when it does not."""
    pooled = {"HYBRID_JOBS_SCHEMA": A, "DATABASE_POOLER": "transaction"}
    done = jobctl("doctor", url=shared, cwd=Path(ROOT), **pooled)
    assert "no jobs table in schema inst_a" in done.stdout, done.stdout
    dbname = shared.dbname
    with psycopg.connect(shared.conninfo, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("ALTER DATABASE {} SET search_path = inst_b").format(
                psycopg.sql.Identifier(dbname)
            )
        )
    done = jobctl("doctor", url=shared, cwd=Path(ROOT), **pooled)
    assert "in schema inst_b for this connection, not in inst_a" in done.stdout, done.stdout
    assert "ALTER ROLE <role> SET search_path = inst_a" in done.stdout
    with psycopg.connect(shared.conninfo, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("ALTER DATABASE {} SET search_path = inst_a").format(
                psycopg.sql.Identifier(dbname)
            )
        )
    done = jobctl("doctor", url=shared, cwd=Path(ROOT), **pooled)
    assert "is at this release's migration" in done.stdout, done.stdout


@pytest.mark.skipif(not pgbouncer.available(), reason="pgbouncer is not installed")
def test_daemons_through_pgbouncer_drain_the_instance_the_database_names(
    shared: DatabaseUrl, engines: dict[str, Engine], raw: psycopg.Connection, rabbitmq_up: None
) -> None:
    _enqueue(engines[B], 40)
    _enqueue(engines[A], 5)
    # What a pooler's user sets (on the role, or as here on the database), since
    # the startup option that names the schema does not pass the pooler.
    raw.execute(
        psycopg.sql.SQL("ALTER DATABASE {} SET search_path = inst_b").format(
            psycopg.sql.Identifier(shared.dbname)
        )
    )
    topology = Topology(prefix=f"t{uuid.uuid4().hex[:10]}")
    try:
        with pgbouncer.pgbouncer() as port:
            env = service_env(shared, AMQP_URL, topology, HYBRID_JOBS_SCHEMA=B) | {
                "DATABASE_URL": shared.conninfo.replace("127.0.0.1:5432", f"127.0.0.1:{port}"),
                "DATABASE_POOLER": "transaction",
                "DATABASE_LISTEN_URL": shared.conninfo,
            }
            with fleet(env, APP):
                asyncio.run(_until_succeeded(raw, B, 40))
            served = pgbouncer.transactions_served(port, shared.dbname)
        assert served > 10, "the daemons' transactions went through PgBouncer"
        assert _states(raw, A) == {"QUEUED": 5}
    finally:
        asyncio.run(delete_topology(AMQP_URL, topology, {"default", "sync"}))
