"""A migrated database and a broker namespace that exist for one run, for the
benchmarks and the chaos soak (tests use the per-test fixtures in conftest)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg

from harness.broker import delete_topology
from harness.services import ADMIN_URL, AMQP_URL
from hybrid_jobs.plumbing.config import DatabaseUrl, instance_schema
from hybrid_jobs.schema.topology import Topology

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def scratch_database(prefix: str = "scratch", *, migrate: bool = True) -> Iterator[DatabaseUrl]:
    """A new database, migrated to head with the real `alembic upgrade head` (or left
    empty, for a benchmark peer that installs its own schema). Migrated, its URL
    looks in the instance's schema (HYBRID_JOBS_SCHEMA, as the migration did), so a
    benchmark's own connections find the tables as the daemons' do."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = DatabaseUrl.parse(f"{ADMIN_URL.rsplit('/', 1)[0]}/{name}")
    if migrate:
        url = url.in_schema(instance_schema()[0])
    try:
        if migrate:
            subprocess.run(
                [sys.executable, "-m", "alembic", "upgrade", "head"],
                cwd=ROOT,
                env={**os.environ, "DATABASE_URL": url.conninfo},
                check=True,
                capture_output=True,
            )
        yield url
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def scratch_topology(queues: list[str], prefix: str = "scratch") -> Iterator[Topology]:
    topology = Topology(prefix=f"{prefix}{uuid.uuid4().hex[:8]}")
    try:
        yield topology
    finally:
        asyncio.run(delete_topology(AMQP_URL, topology, queues))
