"""A running system for a benchmark: a scratch database and broker namespace, one
or more relays and consumer processes, stopped and dropped afterwards."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bench.common import scratch_system, wait_all_done
from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema.topology import Topology


@dataclass(frozen=True)
class Fleet:
    db: DatabaseUrl
    topology: Topology
    env: dict[str, str]
    processes: list[subprocess.Popen[bytes]]


@contextmanager
def fleet(
    *,
    consumers: int = 2,
    concurrency: int = 50,
    relays: int = 1,
    relay_args: list[str] | None = None,
    consumer_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    app: str = "bench.apps",
) -> Iterator[Fleet]:
    """Start the processes and wait until every consumer has announced itself (so
    the relay's window counts them), then yield; terminate them all afterwards."""
    with scratch_system(env=env) as system:
        for _ in range(relays):
            system.start("relay", *(relay_args or []))
        for _ in range(consumers):
            system.start(
                "consumer",
                *("--app", app, "--concurrency", str(concurrency), *(consumer_args or [])),
            )
        wait_for_workers(system.db, consumers)
        yield Fleet(system.db, system.topology, system.env, system.processes)


def wait_for_workers(db: DatabaseUrl, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM workers").fetchone()[0] < n:  # type: ignore[index]
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {n} consumers announced themselves")
            time.sleep(0.05)


def drain_rate(f: Fleet, *batches: list[outbox.NewJob]) -> float:
    """Commit each batch in a transaction of its own, in order, then wait until no
    job waits or runs: jobs per second from the last commit."""
    engine = create_engine(f.db.sqlalchemy)
    try:
        for batch in batches:
            with Session(engine) as session, session.begin():
                outbox.enqueue_many(session, batch)
    finally:
        engine.dispose()
    committed = time.perf_counter()
    with psycopg.connect(f.db.conninfo, autocommit=True) as conn:
        finished = wait_all_done(conn)
    return sum(len(b) for b in batches) / (finished - committed)
