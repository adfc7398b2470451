"""The PgQueuer worker process `bench.peers.pgqueuer_peer` starts:
``python -m bench.peers.pgqueuer_app --batch-size B``, with the database in ``PGDSN``.

PgQueuer's documented shape: an async context manager factory that connects with
asyncpg (its preferred driver) and yields a QueueManager with its entrypoints, run by
``pgqueuer.run``, which is what ``pgq run`` calls (same signal handling, same uvloop
event loop). The ``pgq run`` command itself is not used: in pgqueuer 1.6.0 with typer
0.29 its ``--log-level`` default reaches the logger as a plain string and the command
fails before it starts."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator

import asyncpg
import pgqueuer
import uvloop
from pgqueuer import QueueManager
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries

from bench.marks import Marks


@contextlib.asynccontextmanager
async def create() -> AsyncIterator[QueueManager]:
    connection = await asyncpg.connect(os.environ["PGDSN"])
    qm = QueueManager(Queries(AsyncpgDriver(connection)))
    marks = Marks.from_env()

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        return None

    @qm.entrypoint("latency")
    async def latency(job: Job) -> None:
        marks.started(job.id)

    @qm.entrypoint("ready")
    async def ready(job: Job) -> None:
        marks.ready()

    try:
        yield qm
    finally:
        await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="One PgQueuer worker for bench.compare.")
    parser.add_argument("--batch-size", type=int, default=10)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(pgqueuer.run(create, batch_size=args.batch_size))


if __name__ == "__main__":
    main()
