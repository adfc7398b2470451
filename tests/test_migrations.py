"""Migrations: up, down, up again, and a migrated database that matches the table
definitions in schema/tables.py exactly."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema.tables import metadata
from tests.conftest import ROOT, migrate

TABLES = {
    "jobs",
    "job_attempts",
    "outbox",
    "job_effects",
    "schedules",
    "schedule_fires",
    "alembic_version",
}


def _tables(url: DatabaseUrl) -> set[str]:
    with psycopg.connect(url.conninfo) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
    return {r[0] for r in rows}


def test_up_down_up(empty_db_url: DatabaseUrl) -> None:
    migrate(empty_db_url)
    assert _tables(empty_db_url) >= TABLES
    migrate(empty_db_url, "base", down=True)
    assert _tables(empty_db_url) <= {"alembic_version"}
    with psycopg.connect(empty_db_url.conninfo) as conn:
        functions = conn.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
        ).fetchall()
    assert functions == [], "downgrade must remove the trigger functions too"
    migrate(empty_db_url)
    assert _tables(empty_db_url) >= TABLES


def test_migrated_schema_matches_table_definitions(empty_db_url: DatabaseUrl) -> None:
    migrate(empty_db_url)
    engine = create_engine(empty_db_url.sqlalchemy)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    engine.dispose()
    assert diff == []


def test_alembic_command_line_reads_database_url(empty_db_url: DatabaseUrl) -> None:
    """What a user runs: `alembic upgrade head` from the root, DATABASE_URL in the env."""
    env = {**os.environ, "DATABASE_URL": empty_db_url.conninfo}
    alembic = [sys.executable, "-m", "alembic"]
    subprocess.run(
        [*alembic, "upgrade", "head"], cwd=ROOT, env=env, check=True, capture_output=True
    )
    assert _tables(empty_db_url) >= TABLES
    subprocess.run(
        [*alembic, "downgrade", "base"], cwd=ROOT, env=env, check=True, capture_output=True
    )
    assert _tables(empty_db_url) <= {"alembic_version"}


def test_alembic_with_a_malformed_url_says_which_variable(empty_db_url: DatabaseUrl) -> None:
    env = {**os.environ, "DATABASE_URL": "mysql://user:s3cret@host/db"}
    done = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "DATABASE_URL must be a postgresql:// URL" in done.stderr
    assert "s3cret" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
