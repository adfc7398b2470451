"""Alembic environment: the database comes from DATABASE_URL (or DATABASE_URL_FILE).

Tests and tools that already hold a connection pass it in
``config.attributes["connection"]`` instead.
"""

from __future__ import annotations

import sys

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from plumbing.config import ConfigError, database_url
from schema.tables import metadata

target_metadata = metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


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


if context.is_offline_mode():
    sys.exit("alembic: offline (--sql) mode is not supported; run against a database")
run_migrations_online()
