"""Fixtures on the real services: a database per test, cloned from a migrated
template, and a broker namespace (exchange and queue prefix) per test, so tests run
in any order and side by side.

Each service is checked once, by the first fixture that needs it, not at start-up:
tests/unit/ needs neither and runs with both down."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.plumbing.db import make_pool
from hybrid_jobs.schema.topology import Topology
from tests.support import databases, services
from tests.support.broker import delete_topology
from tests.support.processes import service_env
from tests.support.services import ADMIN_URL, AMQP_URL

ROOT = Path(__file__).resolve().parent.parent

# The tests' databases hold their instance in public, as an install from before
# HYBRID_JOBS_SCHEMA does, and the daemons and jobctl runs they start (which inherit
# this environment) look there. tests/test_instances.py sets its own schemas.
os.environ.setdefault("HYBRID_JOBS_SCHEMA", "public")


def _admin() -> psycopg.Connection:
    return psycopg.connect(ADMIN_URL, autocommit=True)


def _url_for(dbname: str) -> DatabaseUrl:
    base = ADMIN_URL.rsplit("/", 1)[0]
    return DatabaseUrl.parse(f"{base}/{dbname}")


def alembic_config(url: DatabaseUrl) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "schema" / "migrations"))
    cfg.attributes["url"] = url
    return cfg


def migrate(url: DatabaseUrl, target: str = "head", *, down: bool = False) -> None:
    engine = create_engine(url.sqlalchemy)
    try:
        with engine.begin() as conn:
            cfg = alembic_config(url)
            cfg.attributes["connection"] = conn
            (command.downgrade if down else command.upgrade)(cfg, target)
    finally:
        engine.dispose()


@contextlib.contextmanager
def _database(prefix: str, template: str | None = None) -> Iterator[str]:
    """A database of its own (a copy of ``template``, if given), dropped afterwards
    (even if connections linger)."""
    name = databases.new_name(prefix)
    databases.create(_admin, name, template)
    try:
        yield name
    finally:
        databases.drop(_admin, name)


def _stop_unless_up(problem: str | None) -> None:
    """End the session, saying how to start the service: every test after this one
    would fail the same way. In a pytest-xdist worker an exit is lost in an internal
    error, so there each test that needs the service fails with the message (the
    session fixture's failure is kept, so the service is asked only once)."""
    if problem is None:
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.fail(problem, pytrace=False)
    pytest.exit(problem, returncode=3)


@pytest.fixture(scope="session")
def postgres_up() -> None:
    _stop_unless_up(services.postgres_problem())


@pytest.fixture(scope="session")
def rabbitmq_up() -> None:
    _stop_unless_up(services.rabbitmq_problem())


@pytest.fixture(scope="session")
def _dropper(postgres_up: None) -> Iterator[databases.Dropper]:
    """Drops the tests' databases off their time; the session's end waits for it."""
    dropper = databases.Dropper(_admin)
    yield dropper
    dropper.wait()


@pytest.fixture(scope="session")
def _copies(template_db: str, _dropper: databases.Dropper) -> Iterator[databases.Copies]:
    copies = databases.Copies(_admin, template_db)
    yield copies
    if (unused := copies.close()) is not None:
        _dropper.drop_later(unused)


@pytest.fixture(scope="session")
def template_db(postgres_up: None) -> Iterator[str]:
    """Migrated once per session; each test's database is a copy of it."""
    with _database("hj_tpl") as name:
        migrate(_url_for(name))
        yield name


@pytest.fixture
def db_url(_copies: databases.Copies, _dropper: databases.Dropper) -> Iterator[DatabaseUrl]:
    name = _copies.take("hj_t")
    yield _url_for(name)
    _dropper.drop_later(name)


@pytest.fixture
def empty_db_url(_dropper: databases.Dropper) -> Iterator[DatabaseUrl]:
    """A database with no tables at all, for migration tests."""
    name = databases.new_name("hj_e")
    databases.create(_admin, name, None)
    yield _url_for(name)
    _dropper.drop_later(name)


@pytest.fixture
def engine(db_url: DatabaseUrl) -> Iterator[Engine]:
    eng = create_engine(db_url.sqlalchemy)
    yield eng
    eng.dispose()


@pytest.fixture
async def async_engine(db_url: DatabaseUrl) -> AsyncIterator[AsyncEngine]:
    eng = create_async_engine(db_url.sqlalchemy)
    yield eng
    await eng.dispose()


@pytest.fixture
async def pool(db_url: DatabaseUrl) -> AsyncIterator[AsyncConnectionPool[AsyncConnection]]:
    """A small async pool on the test database, made as the daemons make theirs."""
    p = make_pool(db_url, "test", max_size=2)
    await p.open(wait=True)
    yield p
    await p.close()


@pytest.fixture
def pg(db_url: DatabaseUrl) -> Iterator[psycopg.Connection]:
    """An autocommit connection for looking at, and poking, the test database."""
    with psycopg.connect(db_url.conninfo, autocommit=True) as conn:
        yield conn


@pytest.fixture
def amqp_url(rabbitmq_up: None) -> AmqpUrl:
    return AmqpUrl.parse(AMQP_URL)


@pytest.fixture
async def topology(db_url: DatabaseUrl, rabbitmq_up: None) -> AsyncIterator[Topology]:
    """A broker namespace of the test's own; its queues are deleted afterwards."""
    topo = Topology(prefix=f"t{uuid.uuid4().hex[:10]}")
    yield topo
    with psycopg.connect(db_url.conninfo) as conn:
        queues = [r[0] for r in conn.execute("SELECT DISTINCT queue FROM jobs")]
    # The test apps declare "sync" whether or not a job used it.
    await delete_topology(AMQP_URL, topo, {*queues, "default", "sync"})


@pytest.fixture
def env(db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology) -> dict[str, str]:
    """The environment of a relay or consumer the test starts: the test's database,
    broker and namespace."""
    return service_env(db_url, amqp_url, topology)
