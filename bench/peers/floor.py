"""The floor of this design: a job's hops from its commit to its handler, each doing
the least it must (`bench.peers.floor_app`), so that what this project's figures
cost beyond them is what its features cost, and what they share is the shape's.

A job is a row in a plain table and an outbox row, committed together (one
statement, one commit; the outbox's statement trigger NOTIFYs). One relay process
hears the NOTIFY, marks the unsent outbox rows and publishes their ids to one
durable RabbitMQ queue with confirms before it commits; K consumer processes claim
each delivery's ids in one fenced UPDATE, ack, run the no-op handlers and record
their end in a second fenced UPDATE. The same hops and commits as ours
(producer commit, NOTIFY, the relay's transaction around its publish and confirms,
a delivery, a claim and an outcome committed durably), with none of the features.

- drain: N jobs and their outbox rows inserted in one statement (one commit); jobs/s
  from that commit until the consumers have recorded all N ends (each consumer
  notes them in its marks file after the commit of the end);
- latency: one job per statement (its own commit) at a fixed rate; from the
  commit's return to the handler's first line.

Each run gets a scratch database and a RabbitMQ queue of its own, removed afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiormq
import psycopg

from bench.common import AMQP, scratch_database
from bench.marks import ENV, Marks, marks_dir
from bench.peers.base import (
    Contender,
    Figures,
    Settings,
    check_alive,
    drain_timeout,
    paced,
    running,
    started_latency,
    wait_until,
)
from bench.peers.floor_app import CHANNEL

CREATE = f"""
CREATE TABLE floor_jobs (
    id bigserial PRIMARY KEY,
    kind text NOT NULL,
    state text NOT NULL DEFAULT 'queued',
    lease_owner text,
    lease_generation bigint NOT NULL DEFAULT 0
);
CREATE TABLE floor_outbox (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    sent boolean NOT NULL DEFAULT false
);
CREATE INDEX floor_outbox_unsent ON floor_outbox (id) WHERE NOT sent;
CREATE FUNCTION floor_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('{CHANNEL}', '');
  RETURN NULL;
END $$;
CREATE TRIGGER floor_outbox_notify AFTER INSERT ON floor_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION floor_outbox_notify();
"""
ENQUEUE = """
WITH j AS (INSERT INTO floor_jobs (kind) SELECT %(kind)s FROM generate_series(1, %(n)s)
           RETURNING id),
     o AS (INSERT INTO floor_outbox (job_id) SELECT id FROM j)
SELECT id FROM j
"""
UNDONE = "SELECT EXISTS (SELECT 1 FROM floor_jobs WHERE state <> 'done')"


@contextlib.contextmanager
def scratch_queue() -> Iterator[str]:
    name = f"bench_floor_{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:

        async def delete() -> None:
            connection = await aiormq.connect(AMQP.url)
            try:
                channel = await connection.channel()
                await channel.queue_delete(name)
            finally:
                await connection.close()

        asyncio.run(delete())


def enqueue(conn: psycopg.Connection, kind: str, n: int = 1) -> list[str]:
    return [str(r[0]) for r in conn.execute(ENQUEUE, {"kind": kind, "n": n}).fetchall()]


def undone(conn: psycopg.Connection) -> bool:
    row = conn.execute(UNDONE).fetchone()
    return bool(row and row[0])


@dataclasses.dataclass
class FloorFleet:
    """The floor's processes, running and warmed up: ``conn`` enqueues (autocommit),
    ``marks`` is their side channel."""

    conn: psycopg.Connection
    marks: Marks
    procs: list[subprocess.Popen[bytes]]
    log: Path

    def check(self) -> None:
        """Raise if a worker died."""
        check_alive(self.procs, self.log)


@contextlib.contextmanager
def floor_fleet(workers: int, env: dict[str, str] | None = None) -> Iterator[FloorFleet]:
    """A scratch database and queue, one floor relay and ``workers`` floor consumers
    (with ``env`` added to theirs), returned once every consumer has run a job."""
    with (
        scratch_database("bench_floor", migrate=False) as db,
        scratch_queue() as queue,
        marks_dir() as marks,
        psycopg.connect(db.conninfo, autocommit=True) as conn,
    ):
        conn.execute(CREATE)
        worker_env = {
            **os.environ,
            "FLOOR_DSN": db.conninfo,
            "AMQP_URL": AMQP.url,
            "FLOOR_QUEUE": queue,
            ENV: str(marks.path),
            **(env or {}),
        }
        app = [sys.executable, "-m", "bench.peers.floor_app"]
        log = marks.path / "workers.log"
        commands = [[*app, "relay"]] + [[*app, "consumer"]] * workers
        with running(commands, worker_env, log) as procs:
            fleet = FloorFleet(conn, marks, procs, log)
            # Warm up: one job at a time until every consumer has run one.
            deadline = time.monotonic() + 60
            while marks.ready_workers() < workers:
                if time.monotonic() > deadline:
                    raise TimeoutError("floor consumers did not all start within 60s")
                fleet.check()
                enqueue(conn, "ready")
                time.sleep(0.05)
            yield fleet
            # Every job ran to its recorded end: nothing the shape lost or left leased.
            wait_until(lambda: not undone(conn), "floor ends", timeout=30)


def measure(settings: Settings) -> Figures:
    with floor_fleet(settings.workers) as fleet:
        enqueue(fleet.conn, "noop", settings.jobs)
        committed = time.perf_counter()

        def done() -> bool:
            fleet.check()
            return fleet.marks.done_count() >= settings.jobs

        finished = wait_until(done, "floor drain", drain_timeout(settings.jobs))
        rate = settings.jobs / (finished - committed)

        committed_at: dict[str, float] = {}
        for _ in paced(settings.rate, settings.seconds):
            (job_id,) = enqueue(fleet.conn, "latency")
            committed_at[job_id] = time.time()
        lat = started_latency(fleet.marks, committed_at, settings.rate, "floor", fleet.check)
    return Figures(rate, lat, {"pack": 20, "relay_batch": 500})


def contenders() -> list[Contender]:
    return [
        Contender(
            name="floor",
            group="floor",
            setup="this design's hops with the least SQL: 1 relay (NOTIFY, mark, publish, "
            "confirms, commit), K consumers (fenced claim, ack, fenced end), aiormq, psycopg 3",
            measure=measure,
        )
    ]
