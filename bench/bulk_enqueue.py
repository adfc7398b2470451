"""Bulk enqueue: N jobs written by one call, next to PgQueuer's batch enqueue.

1. A scratch database migrated to head (and, for PgQueuer, one with its own
   schema from `pgq install`); nothing else runs: no relay, no consumer.
2. This project: `outbox.enqueue_many(session, [NewJob(...)] * N)` and the commit, on
   a SQLAlchemy session as a producer would call it: each job's row and its wake-up
   in the outbox, by COPY (a batch this large of plain jobs, or with ``--tags``
   a tag on each), or by its one statement (``--dedup-keys``: a key on each).
   PgQueuer's jobs carry neither a tag nor a key in any case.
3. PgQueuer: `Queries.enqueue([...] * N, ...)` on asyncpg, its preferred driver:
   one statement, one commit.
4. The contenders alternate, `--repeat` times each, every round on fresh empty
   tables (with ``--backlog N``: on tables holding N waiting jobs, enqueued first,
   each round's own jobs deleted after it); jobs/s is the jobs over the time from
   the call to the commit's return, and the median round is reported with the
   ratio ours / PgQueuer.

The header says whether autovacuum was on: the figure does not depend on it
(each round starts on an empty table), but every bench says.

With ``--sizes N ...``, instead: where the COPY starts to pay. For each batch size,
this project's batches of plain jobs written by COPY and by the one statement
(``outbox.bulk.COPY_FROM`` set past and below the size), alternated, each
enqueuing and committing 20,000 jobs in batches of that size; the median time per
job of each.

Usage: python -m bench.bulk_enqueue [--jobs 100000] [--repeat 3] [--payload] [--tags]
       [--dedup-keys] [--backlog 1000000] [--sizes 50 100 200 500]
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import Any

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bench.common import (
    argument_parser,
    autovacuum,
    report,
    scratch_database,
    server_versions,
)
from hybrid_jobs import outbox
from hybrid_jobs.outbox import NewJob, bulk
from hybrid_jobs.plumbing.config import DatabaseUrl


def ours(
    db: DatabaseUrl,
    jobs: int,
    payload: dict[str, int] | None,
    backlog: bool,
    fields: dict[str, Any] | None = None,
) -> float:
    """Seconds from the call to the commit's return, on tables emptied first (with a
    backlog: holding it, the round's own jobs deleted afterwards)."""
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        if not backlog:
            conn.execute("TRUNCATE jobs, outbox, job_attempts CASCADE")
        conn.execute("VACUUM ANALYZE jobs, outbox")
    engine = create_engine(db.sqlalchemy)
    try:
        given = fields or {}
        keyed = "dedup_key" in given
        batch = [
            NewJob("noop", payload, **(given | {"dedup_key": f"{given['dedup_key']}{n}"}))
            if keyed
            else NewJob("noop", payload, **given)
            for n in range(jobs)
        ]
        with Session(engine) as session:
            session.connection()  # connected before the clock starts, as a live pool is
            started = time.perf_counter()
            ids = outbox.enqueue_many(session, batch)
            session.commit()
            elapsed = time.perf_counter() - started
        assert len(set(ids)) == jobs
    finally:
        engine.dispose()
    if backlog:
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            conn.execute("DELETE FROM jobs WHERE job_id = ANY(%s)", [ids])  # outbox: cascade
    return elapsed


def fill(db: DatabaseUrl, jobs: int, peer: DatabaseUrl) -> None:
    """``jobs`` waiting jobs in both projects' tables, as a backlog the rounds add to."""
    engine = create_engine(db.sqlalchemy)
    try:
        for start in range(0, jobs, 100_000):
            with Session(engine) as session, session.begin():
                outbox.enqueue_many(session, [NewJob("waiting")] * min(100_000, jobs - start))
    finally:
        engine.dispose()
    asyncio.run(_pgqueuer_fill(peer, jobs))


async def _pgqueuer_fill(db: DatabaseUrl, jobs: int) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(db.conninfo)
    try:
        queries = Queries(AsyncpgDriver(connection))
        for start in range(0, jobs, 100_000):
            n = min(100_000, jobs - start)
            await queries.enqueue(["waiting"] * n, [None] * n, [0] * n)
    finally:
        await connection.close()


async def _pgqueuer(db: DatabaseUrl, jobs: int, payload: bytes | None, backlog: bool) -> float:
    # PgQueuer comes with the bench extra only: imported when it is measured.
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(db.conninfo)
    try:
        if not backlog:
            await connection.execute("TRUNCATE pgqueuer")
        await connection.execute("VACUUM ANALYZE pgqueuer")
        queries = Queries(AsyncpgDriver(connection))
        started = time.perf_counter()
        ids = await queries.enqueue(["noop"] * jobs, [payload] * jobs, [0] * jobs)
        elapsed = time.perf_counter() - started
        if backlog:
            await connection.execute("DELETE FROM pgqueuer WHERE id = ANY($1)", ids)
        return elapsed
    finally:
        await connection.close()


def pgqueuer(db: DatabaseUrl, jobs: int, payload: bytes | None, backlog: bool) -> float:
    return asyncio.run(_pgqueuer(db, jobs, payload, backlog))


def per_job(db: DatabaseUrl, size: int, copy: bool, total: int = 20_000) -> float:
    """Microseconds per job, enqueuing ``total`` jobs in committed batches of ``size``
    by COPY or by the statement."""
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        # Not emptied: from an empty table, with autovacuum off, a backend keeps the
        # plans it made while the table was small (the outbox's foreign-key check
        # among them, a scan of jobs), and every round would grow slower.
        conn.execute("VACUUM ANALYZE jobs, outbox")
    engine = create_engine(db.sqlalchemy)
    was = bulk.COPY_FROM
    bulk.COPY_FROM = 1 if copy else size + 1
    try:
        batch = [NewJob("noop") for _ in range(size)]
        with Session(engine) as session:
            session.connection()
            session.commit()
            started = time.perf_counter()
            for _ in range(max(1, total // size)):
                outbox.enqueue_many(session, batch)
                session.commit()
            elapsed = time.perf_counter() - started
    finally:
        bulk.COPY_FROM = was
        engine.dispose()
    return elapsed / (max(1, total // size) * size) * 1e6


def crossover(sizes: list[int], repeat: int) -> None:
    with scratch_database("bench_bulk_sizes") as db:
        per_job(db, 20_000, True, 20_000)  # tables of some size, as a producer meets
        found = {}
        for size in sizes:
            times: dict[str, list[float]] = {"copy": [], "statement": []}
            for _ in range(repeat):
                times["copy"].append(per_job(db, size, True))
                times["statement"].append(per_job(db, size, False))
            found[str(size)] = {
                name: round(statistics.median(values), 1) for name, values in times.items()
            }
        report(
            "bulk_enqueue_sizes",
            {
                "repeat": repeat,
                "copy_from": bulk.COPY_FROM,
                "autovacuum": autovacuum(db.conninfo),
                "servers": server_versions(),
                "microseconds_per_job": found,
            },
        )


def main() -> None:
    parser = argument_parser("bench.bulk_enqueue", __doc__)
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per call")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per contender")
    parser.add_argument(
        "--payload", action="store_true", help='a small payload ({"order": 1}) instead of none'
    )
    parser.add_argument("--tags", action="store_true", help="a tag on each of this project's jobs")
    parser.add_argument(
        "--dedup-keys",
        action="store_true",
        help="a dedup_key of its own on each of this project's jobs (by the statement)",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=0,
        help="waiting jobs in place before the rounds (each round deletes its own after)",
    )
    parser.add_argument(
        "--sizes", type=int, nargs="+", help="compare COPY and the statement at these batch sizes"
    )
    args = parser.parse_args()
    if args.sizes:
        crossover(args.sizes, args.repeat)
        return
    ours_payload = {"order": 1} if args.payload else None
    # what this project's jobs carry beyond the peer's (PgQueuer's jobs: neither)
    fields: dict[str, Any] = {}
    if args.tags:
        fields["tags"] = ["import"]
    if args.dedup_keys:
        fields["dedup_key"] = f"{uuid.uuid4().hex}-"  # and the job's number: none taken
    peer_payload = b'{"order": 1}' if args.payload else None
    with (
        scratch_database("bench_bulk_ours") as mine,
        scratch_database("bench_bulk_pgq", migrate=False) as theirs,
    ):
        from bench.peers.pgqueuer_peer import install

        install(theirs)
        if args.backlog:
            fill(mine, args.backlog, theirs)
        backlog = bool(args.backlog)
        rounds: dict[str, list[float]] = {"this project": [], "pgqueuer": []}
        for _ in range(args.repeat):
            rounds["this project"].append(ours(mine, args.jobs, ours_payload, backlog, fields))
            rounds["pgqueuer"].append(pgqueuer(theirs, args.jobs, peer_payload, backlog))
        median = {name: statistics.median(times) for name, times in rounds.items()}
        rates = {name: args.jobs / seconds for name, seconds in median.items()}
        report(
            "bulk_enqueue",
            {
                "jobs": args.jobs,
                "backlog": args.backlog,
                "repeat": args.repeat,
                "payload": ours_payload,
                "this_projects_jobs_also": sorted(fields),
                "autovacuum": autovacuum(mine.conninfo),
                "servers": server_versions(),
                "jobs_per_second": {name: round(rate) for name, rate in rates.items()},
                "rounds_seconds": {
                    name: [round(t, 3) for t in times] for name, times in rounds.items()
                },
                "ours_over_pgqueuer": round(rates["this project"] / rates["pgqueuer"], 2),
            },
        )


if __name__ == "__main__":
    main()
