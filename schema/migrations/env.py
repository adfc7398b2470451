"""Alembic environment: the database comes from DATABASE_URL (or DATABASE_URL_FILE).

Tests and tools that already hold a connection pass it in
``config.attributes["connection"]`` instead; ``jobctl migrate`` also passes
``config.attributes["on_version_apply"]``, a callback told of every step run.

The instance lives in the schema its URL names (HYBRID_JOBS_SCHEMA, through
``config.attributes["url"]``), alembic's version table with it; a URL without one
(a test's) leaves the tables where the connection's search_path puts them.
"""

from __future__ import annotations

import logging
import sys
from logging.config import fileConfig

from alembic import context
from alembic.migration import MigrationContext
from psycopg import sql
from sqlalchemy import Connection, create_engine, pool

from hybrid_jobs.plumbing.config import ConfigError, check_schema, database_url
from hybrid_jobs.schema import revisions
from hybrid_jobs.schema.tables import metadata

target_metadata = metadata


def _run(connection: Connection, schema: str | None) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        on_version_apply=context.config.attributes.get("on_version_apply"),
        # alembic's own table lives with the instance: one version per instance
        version_table_schema=schema,
    )
    with context.begin_transaction():
        if schema is not None:
            _enter(connection, schema)
        context.run_migrations()
        # Alembic says nothing when there was nothing to do; say where the database is.
        revision = context.get_context().get_current_revision()
        logging.getLogger("alembic.env").info("Database is at revision %s", revision or "base")


def _enter(connection: Connection, schema: str) -> None:
    """Create the instance's schema if need be, and work in it for this transaction:
    every table, sequence and function the migrations make unqualified lands there,
    and a function's ``SET search_path FROM CURRENT`` names it."""
    name = sql.Identifier(check_schema(schema)).as_string(connection.connection.driver_connection)
    connection.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {name}")
    connection.exec_driver_sql(
        "SELECT set_config('search_path', %(schema)s, true)", {"schema": name}
    )


def run_migrations_online() -> None:
    url = context.config.attributes.get("url")
    connection = context.config.attributes.get("connection")
    if connection is not None:
        # The caller's connection: the instance its URL names, else the tables go
        # where the connection's search_path says.
        _run(connection, url.schema if url is not None else None)
        return
    try:
        url = url or database_url()
    except ConfigError as exc:
        sys.exit(f"alembic: {exc}")
    engine = create_engine(url.sqlalchemy, poolclass=pool.NullPool)
    with engine.connect() as conn:
        if url.schema is not None and not url.schema_given:
            _refuse_second_instance(conn, url.schema)
        _run(conn, url.schema)


def _refuse_second_instance(conn: Connection, schema: str) -> None:
    """`alembic upgrade` with HYBRID_JOBS_SCHEMA unset stops, as `jobctl migrate`
    does, rather than create an instance beside an existing one."""
    migration = MigrationContext.configure(conn, opts={"version_table_schema": schema})
    found = [] if migration.get_current_revision() else installs(conn)
    # Ended here: alembic leaves a transaction it did not begin to its caller, who
    # would roll it back at close.
    conn.rollback()
    why = revisions.second_instance(schema, found)
    if why is not None:
        sys.exit(f"alembic: {why}")


def installs(conn: Connection) -> list[str]:
    return [row[0] for row in conn.exec_driver_sql(revisions.INSTALLS)]


# From alembic's own command line (`alembic upgrade head`), log as alembic.ini says,
# so a run says which steps it took. A program calling alembic's API keeps its own
# logging (cmd_opts is only set by the command line).
if context.config.cmd_opts is not None and context.config.config_file_name:
    fileConfig(context.config.config_file_name, disable_existing_loggers=False)
if context.is_offline_mode():
    sys.exit("alembic: offline (--sql) mode is not supported; run against a database")
run_migrations_online()
