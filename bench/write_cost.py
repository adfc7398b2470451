"""What a write of a jobs row pays for the table's CHECK constraints and indexes.

PostgreSQL checks every CHECK of a table at every write of a row, whichever columns
the write sets, and prepares each one's expression again for every statement. Every
claim, outcome and heartbeat writes jobs rows, so these costs sit in each of them.

1. Copies of jobs in a scratch database, each filled with the same --jobs waiting
   jobs: as migrated (its CHECKs and its indexes), with its CHECKs only, with its
   indexes only, and with the primary key alone; no trigger is copied. Beside them,
   jobs itself, whose triggers fire too (a claim's write matches none of their WHEN
   clauses but one statement trigger's: what they cost it is their set-up).
2. On each copy, the claim's write (QUEUED to RUNNING, the lease set) of 1 row and of
   --batch rows by primary key, --repeat times each, the copies taken in turn on one
   autocommit connection with synchronous_commit off (the write's own cost, not the
   disk's). Per copy: the p50 of each, and what its CHECKs or indexes add to a
   statement (fixed) and to each row, against the primary key alone.
3. Each CHECK of jobs alone, on a copy of its own, against a copy with none: what
   it adds to an INSERT of --jobs rows (per row, the fastest of three) and to the
   claim's write of one row (per statement, p50 of --repeat). A CHECK that costs
   more than a microsecond a row is one to look at (a bounded repetition in a
   regular expression cost 6).

    python -m bench.write_cost [--jobs 20000] [--batch 25] [--repeat 200]

Prints one JSON object.
"""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

import psycopg

from bench.common import argument_parser, committing, report, scratch_database
from hybrid_jobs import outbox
from hybrid_jobs.plumbing.db import with_url_options

# The copies of jobs: (name, what CREATE TABLE ... (LIKE jobs ...) includes); and
# jobs itself, whose triggers fire too.
COPIES = {
    "jobs_with_its_triggers": "",
    "as_migrated": "INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES",
    "checks_only": "INCLUDING DEFAULTS INCLUDING CONSTRAINTS",
    "indexes_only": "INCLUDING DEFAULTS INCLUDING INDEXES",
    "primary_key_only": "INCLUDING DEFAULTS",
}
# The claim's write, as JOB_CLAIM_MANY's step 4 sets a lease.
CLAIM_WRITE = """
UPDATE {table}
SET state = 'RUNNING', lease_owner = 'bench-write-cost',
    lease_expires_at = now() + interval '1 minute',
    lease_generation = lease_generation + 1, attempt_count = attempt_count + 1,
    started_at = now(), updated_at = now()
WHERE job_id = ANY(%s::uuid[])
"""


def _copy(conn: psycopg.Connection, table: str, including: str) -> None:
    if not including:
        return  # jobs itself
    conn.execute(f"CREATE TABLE {table} (LIKE jobs {including})")
    if "INCLUDING INDEXES" not in including:
        conn.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (job_id)")
    conn.execute(f"INSERT INTO {table} SELECT * FROM jobs")
    conn.execute(f"VACUUM ANALYZE {table}")


def _writes(conn: psycopg.Connection, ids: list[uuid.UUID], batch: int, repeat: int) -> Any:
    """Per copy, the p50 wall time (ms) of writing 1 row and ``batch`` rows, each
    write to rows no earlier one wrote, the copies in turn."""
    walls: dict[str, dict[int, list[float]]] = {t: {1: [], batch: []} for t in COPIES}
    tables = {name: name if including else "jobs" for name, including in COPIES.items()}
    at = 0
    for _ in range(repeat):
        for size in (1, batch):
            chosen = ids[at : at + size]
            at += size
            for name, table in tables.items():
                started = time.perf_counter()
                conn.execute(CLAIM_WRITE.format(table=table), [chosen])
                walls[name][size].append((time.perf_counter() - started) * 1000)
    return {
        t: {n: statistics.median(w[repeat // 10 :]) for n, w in by.items()}
        for t, by in walls.items()
    }


def _split(p50: dict[str, dict[int, float]], batch: int) -> dict[str, Any]:
    """What each copy adds against the primary key alone: per statement and per row."""
    base = p50["primary_key_only"]
    base_row = (base[batch] - base[1]) / (batch - 1)
    out = {}
    for table, by in p50.items():
        per_row = (by[batch] - by[1]) / (batch - 1)
        out[table] = {
            "one_row_ms": round(by[1], 3),
            f"{batch}_rows_ms": round(by[batch], 3),
            "added_per_statement_us": round(((by[1] - per_row) - (base[1] - base_row)) * 1000, 1),
            "added_per_row_us": round((per_row - base_row) * 1000, 2),
        }
    return out


def _each_check(conn: psycopg.Connection, ids: list[uuid.UUID], repeat: int) -> dict[str, Any]:
    """Each CHECK of jobs on a copy of its own, against a copy with none: the
    microseconds it adds to an INSERT of every job, per row (the fastest of three),
    and to the claim's write of one row, per statement (p50 of ``repeat``), most
    costly first."""
    checks = conn.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = 'jobs'::regclass AND contype = 'c' ORDER BY conname"
    ).fetchall()
    tables = {"": "bench_check_none"}
    conn.execute("CREATE TABLE bench_check_none (LIKE jobs INCLUDING DEFAULTS)")
    for n, (name, definition) in enumerate(checks):
        table = tables[name] = f"bench_check_{n}"
        conn.execute(f"CREATE TABLE {table} (LIKE jobs INCLUDING DEFAULTS)")
        conn.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_only {definition}")
    inserts = {name: float("inf") for name in tables}
    for _ in range(3):
        for name, table in tables.items():
            conn.execute(f"TRUNCATE {table}")
            started = time.perf_counter()
            conn.execute(f"INSERT INTO {table} SELECT * FROM jobs")
            inserts[name] = min(inserts[name], time.perf_counter() - started)
    for table in tables.values():
        conn.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (job_id)")
        conn.execute(f"VACUUM ANALYZE {table}")
    writes: dict[str, list[float]] = {name: [] for name in tables}
    for n in range(repeat):
        for name, table in tables.items():
            started = time.perf_counter()
            conn.execute(CLAIM_WRITE.format(table=table), [[ids[n]]])
            writes[name].append(time.perf_counter() - started)
    insert_none = inserts.pop("")
    write_none = statistics.median(writes.pop(""))
    rows = len(ids)
    added = {
        name: {
            "insert_per_row_us": round((inserts[name] - insert_none) / rows * 1e6, 2),
            "write_per_statement_us": round((statistics.median(w) - write_none) * 1e6, 1),
        }
        for name, w in writes.items()
    }
    return dict(sorted(added.items(), key=lambda kv: -kv[1]["write_per_statement_us"]))


def main() -> None:
    parser = argument_parser("bench.write_cost", __doc__)
    parser.add_argument("--jobs", type=int, default=20_000, help="waiting jobs in each copy")
    parser.add_argument("--batch", type=int, default=25, help="rows of the larger write")
    parser.add_argument("--repeat", type=int, default=200, help="writes of each size per copy")
    args = parser.parse_args()
    if args.batch < 2 or args.repeat < 10:
        parser.error("--batch must be 2 or more and --repeat 10 or more")
    needed = args.repeat * (1 + args.batch)
    if needed > args.jobs:
        parser.error(f"--repeat {args.repeat} writes of 1 and {args.batch} rows need "
                     f"--jobs {needed} or more")  # fmt: skip
    with scratch_database("bench_write_cost") as db:
        with committing(db) as session:
            ids = outbox.enqueue_many(
                session, [outbox.NewJob("noop", {"i": i}) for i in range(args.jobs)]
            )
        with psycopg.connect(
            db.conninfo,
            autocommit=True,
            options=with_url_options(db, "-c synchronous_commit=off"),
        ) as conn:
            # every copy, and jobs itself, vacuumed and analyzed alike
            conn.execute("VACUUM ANALYZE jobs")
            for table, including in COPIES.items():
                _copy(conn, table, including)
            # (before the writes below move jobs' rows on: copies of waiting jobs)
            each = _each_check(conn, ids, args.repeat)
            p50 = _writes(conn, ids, args.batch, args.repeat)
            counts = conn.execute(
                "SELECT (SELECT count(*) FROM pg_constraint"
                "        WHERE conrelid = 'jobs'::regclass AND contype = 'c'),"
                "       (SELECT count(*) FROM pg_index WHERE indrelid = 'jobs'::regclass)"
            ).fetchone()
    assert counts is not None
    report(
        "write_cost",
        {
            "jobs": args.jobs,
            "batch": args.batch,
            "repeat": args.repeat,
            "jobs_checks": counts[0],
            "jobs_indexes": counts[1],
            "claim_write": _split(p50, args.batch),
            "by_check": each,
        },
    )


if __name__ == "__main__":
    main()
