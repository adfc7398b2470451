"""Alembic environment: the database comes from DATABASE_URL (or DATABASE_URL_FILE).

Tests and tools that already hold a connection pass it in
``config.attributes["connection"]`` instead; ``jobctl migrate`` also passes
``config.attributes["on_version_apply"]``, a callback told of every step run.
"""

from __future__ import annotations

import logging
import sys
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from hybrid_jobs.plumbing.config import ConfigError, database_url
from hybrid_jobs.schema.tables import metadata

target_metadata = metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        on_version_apply=context.config.attributes.get("on_version_apply"),
    )
    with context.begin_transaction():
        context.run_migrations()
        # Alembic says nothing when there was nothing to do; say where the database is.
        revision = context.get_context().get_current_revision()
        logging.getLogger("alembic.env").info("Database is at revision %s", revision or "base")


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    try:
        url = context.config.attributes.get("url") or database_url()
    except ConfigError as exc:
        sys.exit(f"alembic: {exc}")
    engine = create_engine(url.sqlalchemy, poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)


# From alembic's own command line (`alembic upgrade head`), log as alembic.ini says,
# so a run says which steps it took. A program calling alembic's API keeps its own
# logging (cmd_opts is only set by the command line).
if context.config.cmd_opts is not None and context.config.config_file_name:
    fileConfig(context.config.config_file_name, disable_existing_loggers=False)
if context.is_offline_mode():
    sys.exit("alembic: offline (--sql) mode is not supported; run against a database")
run_migrations_online()
