"""PgQueuer (PostgreSQL only: LISTEN/NOTIFY wake-ups, FOR UPDATE SKIP LOCKED claims),
at batch size 10 (its default) and 100.

Each run gets an empty scratch database with PgQueuer's own schema (`pgq install`),
and K worker processes (`python -m bench.peers.pgqueuer_app --batch-size B`, which
calls `pgqueuer.run` as `pgq run` does), K being the number of our consumer
processes; the factory connects with asyncpg, PgQueuer's preferred driver, and
registers no-op entrypoints. The workers are warmed up (jobs
enqueued one by one until every process has run one) before anything is timed.

- drain: N jobs enqueued in one `Queries.enqueue` call (one statement, one commit);
  jobs/s from that commit until the queue table is empty (PgQueuer deletes a job's
  row when it records the job's completion, so an empty table means all N are done).
- latency: `Queries.enqueue` of one job per call (its own commit) at a fixed rate;
  from the call's return to the entrypoint's first line.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import os
import subprocess
import sys
import time
from collections.abc import Callable

import asyncpg
import psycopg
from pgqueuer.db import AsyncpgDriver
from pgqueuer.queries import Queries

from bench.common import scratch_database
from bench.marks import ENV, Marks, marks_dir
from bench.peers.base import (
    Contender,
    Figures,
    Settings,
    check_alive,
    drain_timeout,
    paced_async,
    running,
    started_latency,
    wait_until,
)
from hybrid_jobs.plumbing.config import DatabaseUrl

PGQ = [sys.executable, "-m", "pgqueuer"]


def install(db: DatabaseUrl) -> None:
    subprocess.run(
        [*PGQ, "install"],
        env={**os.environ, "PGDSN": db.conninfo},
        check=True,
        capture_output=True,
    )


def queue_empty(conn: psycopg.Connection) -> bool:
    """PgQueuer deletes a job's row once it is done: an empty table is a drained
    queue, every completion recorded (as this project's drain waits for SUCCEEDED).
    On one connection for the whole run: a new one per poll would cost PostgreSQL a
    backend start every 20 ms, a tax on the contender's own server."""
    row = conn.execute("SELECT NOT EXISTS (SELECT 1 FROM pgqueuer)").fetchone()
    return bool(row and row[0])


async def _queries(db: DatabaseUrl) -> tuple[asyncpg.Connection, Queries]:
    connection = await asyncpg.connect(db.conninfo)
    return connection, Queries(AsyncpgDriver(connection))


async def _warm_up(db: DatabaseUrl, marks: Marks, workers: int, check: Callable[[], None]) -> int:
    """One job at a time until every worker process has run one: all are connected,
    listening and past their first dequeue."""
    connection, queries = await _queries(db)
    try:
        sent = 0
        deadline = time.monotonic() + 60
        while marks.ready_workers() < workers:
            if time.monotonic() > deadline:
                raise TimeoutError("PgQueuer workers did not all start within 60s")
            check()
            await queries.enqueue("ready", None)
            sent += 1
            await asyncio.sleep(0.05)
        return sent
    finally:
        await connection.close()


async def _enqueue_many(db: DatabaseUrl, n: int) -> float:
    connection, queries = await _queries(db)
    try:
        await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
        return time.perf_counter()
    finally:
        await connection.close()


async def _enqueue_paced(db: DatabaseUrl, rate: float, seconds: float) -> dict[str, float]:
    connection, queries = await _queries(db)
    committed: dict[str, float] = {}
    try:
        async for _ in paced_async(rate, seconds):
            (job_id,) = await queries.enqueue("latency", None)
            committed[str(job_id)] = time.time()
    finally:
        await connection.close()
    return committed


def measure(settings: Settings, *, batch: int) -> Figures:
    with scratch_database("bench_pgqueuer", migrate=False) as db, marks_dir() as marks:
        install(db)
        env = {**os.environ, "PGDSN": db.conninfo, ENV: str(marks.path)}
        command = [sys.executable, "-m", "bench.peers.pgqueuer_app", "--batch-size", str(batch)]
        log = marks.path / "workers.log"
        with (
            running([command] * settings.workers, env, log) as procs,
            psycopg.connect(db.conninfo, autocommit=True) as probe,
        ):

            def check() -> None:
                check_alive(procs, log)

            def drained() -> bool:
                check()
                return queue_empty(probe)

            sent = asyncio.run(_warm_up(db, marks, settings.workers, check))
            wait_until(
                lambda: marks.ready_count() >= sent and drained(),
                "PgQueuer warm-up jobs",
                timeout=30,
            )

            committed = asyncio.run(_enqueue_many(db, settings.jobs))
            finished = wait_until(drained, "PgQueuer drain", drain_timeout(settings.jobs))
            rate = settings.jobs / (finished - committed)

            committed_at = asyncio.run(_enqueue_paced(db, settings.rate, settings.seconds))
            lat = started_latency(marks, committed_at, settings.rate, "PgQueuer", check)
    return Figures(rate, lat, {"batch_size": batch})


def contenders() -> list[Contender]:
    version = importlib.metadata.version("pgqueuer")
    return [
        Contender(
            name=f"pgqueuer b={batch}",
            group="pgqueuer",
            setup=f"PgQueuer {version}, K `pgqueuer.run` processes, asyncpg, batch_size={batch}",
            measure=functools.partial(measure, batch=batch),
        )
        for batch in (10, 100)
    ]
