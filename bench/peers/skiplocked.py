"""The raw SKIP LOCKED loop: what a plain table-backed queue does, no library.

A plain table (id, kind, state, locked_by, attempts, run_after, timestamps) with a
partial index on the queued rows. K worker processes each loop: claim up to b queued
rows in one statement (``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED
LIMIT b)``, its own commit), run the no-op handlers, then mark the same b rows done in
one statement (its own commit). An idle worker waits on LISTEN, and every enqueue
NOTIFYs in its own transaction, so an idle loop answers at once; a 0.5 s wait is the
backstop.

- drain: the workers are started and listening; N rows are inserted in one statement
  (one commit); jobs/s from that commit until the workers have marked all N done.
- latency: one row per transaction at a fixed rate; from each commit to the moment a
  worker claimed it and began its handler.

`bench.drain` runs the same loop with b=1 as its baseline.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from multiprocessing.synchronize import Event
from pathlib import Path

import psycopg

from bench.common import scratch_database
from bench.marks import Marks, marks_dir
from bench.peers.base import (
    Contender,
    Figures,
    Settings,
    drain_timeout,
    paced,
    started_latency,
    wait_until,
)
from hybrid_jobs.plumbing.config import DatabaseUrl

CHANNEL = "skiplocked_jobs"

CREATE = """
CREATE TABLE IF NOT EXISTS skiplocked_jobs (
    id bigserial PRIMARY KEY,
    kind text NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}',
    state text NOT NULL DEFAULT 'queued',
    locked_by text,
    attempts integer NOT NULL DEFAULT 0,
    run_after timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX IF NOT EXISTS skiplocked_jobs_queued
    ON skiplocked_jobs (run_after, id) WHERE state = 'queued';
"""
CLAIM = """
UPDATE skiplocked_jobs
SET state = 'running', locked_by = %(worker)s, attempts = attempts + 1, started_at = now()
WHERE id IN (
    SELECT id FROM skiplocked_jobs
    WHERE state = 'queued' AND run_after <= now()
    ORDER BY run_after, id
    FOR UPDATE SKIP LOCKED
    LIMIT %(batch)s)
RETURNING id, kind
"""
COMPLETE = """
UPDATE skiplocked_jobs SET state = 'done', locked_by = NULL, finished_at = now()
WHERE id = ANY(%(ids)s) AND state = 'running' AND locked_by = %(worker)s
"""
# A data-modifying CTE runs once whatever the outer SELECT reads: rows and wake-up in
# one statement, one commit.
ENQUEUE_MANY = """
WITH jobs AS (INSERT INTO skiplocked_jobs (kind, payload)
              SELECT 'noop', jsonb_build_object('i', i) FROM generate_series(1, %(n)s) AS i)
SELECT pg_notify('skiplocked_jobs', '')
"""
ENQUEUE_ONE = """
WITH job AS (INSERT INTO skiplocked_jobs (kind) VALUES ('latency') RETURNING id)
SELECT id, pg_notify('skiplocked_jobs', '') FROM job
"""


def _work(conninfo: str, batch: int, marks_path: str, stop: Event) -> None:
    # Ctrl-C is the parent's to handle: it sets `stop`, or ends us if we hang.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = f"skiplocked-{os.getpid()}"
    marks = Marks(Path(marks_path))
    with psycopg.connect(conninfo, autocommit=True) as conn:
        # Listening before the first claim: a row committed after that claim
        # looked is announced to us, so no enqueue is missed while idle.
        conn.execute(f"LISTEN {CHANNEL}")
        marks.ready()
        while not stop.is_set():
            rows = conn.execute(CLAIM, {"worker": worker, "batch": batch}).fetchall()
            if not rows:
                for _ in conn.notifies(timeout=0.5, stop_after=1):
                    break
                continue
            for job_id, kind in rows:
                if kind == "latency":
                    marks.started(job_id)
            done = conn.execute(COMPLETE, {"ids": [r[0] for r in rows], "worker": worker}).rowcount
            marks.done(done)


@contextlib.contextmanager
def workers_on(db: DatabaseUrl, workers: int, batch: int) -> Iterator[Marks]:
    """K loop processes on the table (created if missing), listening before we yield."""
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        conn.execute(CREATE)
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    with marks_dir() as marks:
        procs = [
            ctx.Process(target=_work, args=(db.conninfo, batch, str(marks.path), stop))
            for _ in range(workers)
        ]
        try:
            for p in procs:
                p.start()

            def ready() -> bool:
                if any(p.exitcode is not None for p in procs):
                    raise RuntimeError("a SKIP LOCKED worker exited early")
                return marks.ready_workers() >= workers

            wait_until(ready, "SKIP LOCKED workers listening", timeout=60)
            yield marks
        finally:
            stop.set()
            for p in procs:
                p.join(10)
                if p.exitcode is None:
                    p.kill()
                    p.join()


def drain_with(db: DatabaseUrl, marks: Marks, n: int) -> float:
    before = marks.done_count()
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        conn.execute(ENQUEUE_MANY, {"n": n})
    committed = time.perf_counter()
    finished = wait_until(
        lambda: marks.done_count() >= before + n, "SKIP LOCKED drain", drain_timeout(n)
    )
    return n / (finished - committed)


def drain(db: DatabaseUrl, n: int, workers: int, batch: int = 1) -> float:
    """N rows drained by K loop processes claiming b at a time; jobs/s from the commit."""
    with workers_on(db, workers, batch) as marks:
        return drain_with(db, marks, n)


def latency_with(db: DatabaseUrl, marks: Marks, rate: float, seconds: float) -> dict[str, float]:
    committed: dict[str, float] = {}
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        for _ in paced(rate, seconds):
            row = conn.execute(ENQUEUE_ONE).fetchone()
            assert row is not None
            committed[str(row[0])] = time.time()
    return started_latency(marks, committed, rate, "SKIP LOCKED")


def measure(settings: Settings, *, batch: int) -> Figures:
    with (
        scratch_database("bench_skiplocked", migrate=False) as db,
        workers_on(db, settings.workers, batch) as marks,
    ):
        rate = drain_with(db, marks, settings.jobs)
        lat = latency_with(db, marks, settings.rate, settings.seconds)
        # The latency run ends once every job has started: the last ones may still be
        # finishing (a slow CI run found 399 of 400 done at once), so wait for them.
        with psycopg.connect(db.conninfo, autocommit=True) as conn:

            def all_done() -> bool:
                done = "SELECT bool_and(state = 'done') FROM skiplocked_jobs"
                row = conn.execute(done).fetchone()
                return bool(row and row[0])

            wait_until(all_done, "SKIP LOCKED left jobs undone", 30)
    return Figures(rate, lat, {"batch": batch})


def contenders() -> list[Contender]:
    return [
        Contender(
            name=f"skiplocked b={batch}",
            group="skiplocked",
            setup=f"K processes, psycopg 3, claim and complete {batch} per statement, "
            "LISTEN/NOTIFY wake-up",
            measure=functools.partial(measure, batch=batch),
        )
        for batch in (1, 10)
    ]
