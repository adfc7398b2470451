"""What the benchmarks share: a scratch database migrated to head, a scratch broker
namespace, and percentiles."""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg

from schema.config import AmqpUrl, DatabaseUrl
from schema.topology import Topology
from tests.support.broker import delete_topology

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ADMIN_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://127.0.0.1:5432/postgres")
AMQP = AmqpUrl.parse(os.environ.get("AMQP_URL", "amqp://127.0.0.1:5672/"))


@contextlib.contextmanager
def scratch_database() -> Iterator[DatabaseUrl]:
    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = DatabaseUrl.parse(f"{ADMIN_URL.rsplit('/', 1)[0]}/{name}")
    try:
        subprocess.run(
            [str(BIN / "alembic"), "upgrade", "head"],
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
def scratch_topology(queues: list[str]) -> Iterator[Topology]:
    topology = Topology(prefix=f"bench{uuid.uuid4().hex[:8]}")
    try:
        yield topology
    finally:
        asyncio.run(delete_topology(AMQP.url, topology, queues))


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples_ms, n=100, method="inclusive")
    return {"p50_ms": round(q[49], 2), "p95_ms": round(q[94], 2), "p99_ms": round(q[98], 2)}


def service_env(db: DatabaseUrl, topology: Topology) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": db.conninfo,
        "AMQP_URL": AMQP.url,
        "AMQP_PREFIX": topology.prefix,
        "LOG_LEVEL": "WARNING",
    }


def machine() -> dict[str, object]:
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
