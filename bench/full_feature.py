"""Commit-to-handler latency under steady load with the features that make a queue
useful turned on, next to the same load with none of them, in one run.

    python -m bench.full_feature [--rate 200] [--seconds 60] [--tenants 1000]
                                 [--keys 5000] [--history 100000]

Both runs: one job per transaction at a fixed rate, one relay and two consumer
processes, from each commit to its handler's first line (p50/p95/p99).

1. bare: no tenant, no key, no rate limit, an empty history;
2. full: every job belongs to one of --tenants tenants, each capped at
   max_running=5 with fair share; each has a key (--keys distinct, key_limit=1);
   each takes a token of a rate limit set far above the load (100 x --rate per
   second); --history finished jobs are in place, spread over the retention
   period (--keep-finished; by default --history / --rate seconds, the history
   this rate keeps), so the relay's retention deletes about as many of the oldest
   as the run adds (a round every 30 s: the rows swing by up to 30 s of the rate).

Prints one JSON object: both runs' percentiles, the ratio of the full run's p99 to
the bare one's, and the sizes of the tables (rows and bytes) at the start and the
end of the full run. The rows should stay about flat; the bytes grow where
autovacuum is off (deleted rows' space is reused only after a vacuum).
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bench.common import (
    argument_parser,
    committing,
    pace_options,
    percentiles,
    report,
    scratch_system,
    wait_all_done,
)
from bench.marks import ENV, Marks
from bench.peers.base import paced
from harness.history import fill
from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import DatabaseUrl

TABLES = ("jobs", "job_attempts", "outbox", "tenant_usage", "key_usage", "rate_buckets")
RATE_LIMIT = "bench-full"


def sizes(db: DatabaseUrl) -> dict[str, dict[str, int]]:
    with psycopg.connect(db.conninfo) as conn:
        found = {}
        for table in TABLES:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM " + table + "), pg_total_relation_size(%s)",
                [table],
            ).fetchone()
            assert row is not None
            found[table] = {"rows": int(row[0]), "bytes": int(row[1])}
        return found


def steady(
    db: DatabaseUrl, rate: float, seconds: float, marks: Marks, job: Any
) -> dict[str, float]:
    """Jobs committed one per transaction at ``rate`` for ``seconds``, each with the
    enqueue arguments ``job(i)`` gives; their commit-to-start percentiles."""
    engine = create_engine(db.sqlalchemy, pool_size=2)
    committed: dict[str, float] = {}
    for i in paced(rate, seconds):
        with Session(engine) as session, session.begin():
            new_id = outbox.enqueue(session, "latency", {}, **job(i))
        committed[str(new_id)] = time.time()
    engine.dispose()
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        wait_all_done(conn, timeout=600)
    started = marks.starts()
    missing = [j for j in committed if j not in started]
    if missing:
        raise RuntimeError(f"{len(missing)} jobs never started, e.g. {missing[:3]}")
    samples = [(started[j] - c) * 1000 for j, c in committed.items()]
    return percentiles(samples) | {"jobs": len(samples), "rate_per_s": rate}


def prepare(db: DatabaseUrl, args: Any) -> list[str]:
    """The full run's database: --history finished jobs over the retention period
    (the oldest are due as the run goes), analyzed; --tenants tenants capped at 5;
    the rate limit. Returns the relay's arguments (its retention)."""
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        fill(conn, args.history, 0, span_seconds=args.keep_finished)
        conn.execute("VACUUM ANALYZE")
    with committing(db) as session:
        for t in range(args.tenants):
            outbox.set_tenant_limit(session, f"tenant-{t}", max_running=5)
        outbox.set_rate_limit(session, RATE_LIMIT, rate=100 * args.rate, per=timedelta(seconds=1))
    return ["--keep-finished", str(args.keep_finished)]


def featured(args: Any) -> Callable[[int], dict[str, Any]]:
    """The full run's enqueue arguments for its ``i``-th job: a tenant, a key of
    limit 1, the rate limit."""

    def job(i: int) -> dict[str, Any]:
        return {
            "tenant": f"tenant-{i % args.tenants}",
            "key": f"key-{i % args.keys}",
            "key_limit": 1,
            "rate_limit": RATE_LIMIT,
        }

    return job


def featureless(i: int) -> dict[str, Any]:
    """The bare run's enqueue arguments: none."""
    return {}


def feature_options(parser: argparse.ArgumentParser) -> None:
    """The full run's shape (bench.latency --full runs it too)."""
    parser.add_argument("--tenants", type=int, default=1000, help="capped tenants")
    parser.add_argument("--keys", type=int, default=5000, help="distinct keys (key_limit=1)")
    parser.add_argument("--history", type=int, default=100_000, help="finished jobs in place")
    parser.add_argument(
        "--keep-finished",
        type=float,
        default=None,
        help="the relay's --keep-finished in the full run; the history spans it "
        "(default: --history / --rate seconds, what this rate keeps: retention then "
        "deletes about what the run adds, so the tables should stay flat)",
    )


def run(
    args: Any, *, full: bool
) -> tuple[dict[str, float], dict[str, dict[str, dict[str, int]]] | None]:
    marks = Marks(Path(tempfile.mkdtemp(prefix="bench-full-")))
    with scratch_system("bench_full", env={ENV: str(marks.path)}) as system:
        db = system.db
        relay_args = prepare(db, args) if full else []
        system.start("relay", *relay_args)
        for _ in range(2):
            system.start("consumer", "--app", "bench.apps")
        time.sleep(3)  # connected, consuming
        before = sizes(db) if full else None
        job = featured(args) if full else featureless
        figures = steady(db, args.rate, args.seconds, marks, job)
        after = sizes(db) if full else None
    return figures, ({"start": before, "end": after} if full and before and after else None)


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    parser = argument_parser("bench.full_feature", __doc__)
    pace_options(parser, seconds=60, what="each run")
    feature_options(parser)
    args = parser.parse_args()
    if args.keep_finished is None:
        args.keep_finished = args.history / args.rate
    signal.signal(signal.SIGTERM, _terminated)
    bare, _ = run(args, full=False)
    full, tables = run(args, full=True)
    report(
        "full_feature",
        {
            "rate_per_s": args.rate,
            "seconds": args.seconds,
            "tenants": args.tenants,
            "keys": args.keys,
            "history": args.history,
            "bare": bare,
            "full": full,
            "p99_full_to_bare": round(full["p99_ms"] / bare["p99_ms"], 2),
            "p50_full_to_bare": round(full["p50_ms"] / bare["p50_ms"], 2),
            "tables": tables,
        },
    )


if __name__ == "__main__":
    main()
