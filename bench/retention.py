"""Retention under load: the tables stay bounded while jobs flow through them.

    python -m bench.retention [--minutes 10] [--rate 200] [--keep-finished 60]
                              [--sample-every 30] [--consumers 1]

1. a scratch database and broker namespace; one `relay --keep-finished K` and
   --consumers `consumer --app bench.apps` processes;
2. a producer enqueues --rate jobs a second for --minutes: 70% no-ops, 20% that
   mark an effect key done with their completion, 10% that fail at once; every job
   has a dedup key of its own;
3. every --sample-every seconds: rows by state in jobs, rows in job_attempts,
   outbox and job_effects, each table's total size (pg_total_relation_size: heap,
   indexes, TOAST) and dead tuples; then, if --vacuum says so, a plain VACUUM of
   the four tables, standing in for autovacuum (with --vacuum auto: only when the
   server runs no autovacuum);
4. at the end, the relay's retention log lines are summed.

With K seconds kept and retention every 30 s, finished jobs should stay below about
rate x (K + 30 + a few seconds of drain) rows. Retention bounds the rows; the space
of deleted rows is reused once (auto)vacuum has reclaimed it, so sizes level off
only where something vacuums. Prints one JSON object.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bench.common import (
    BIN,
    argument_parser,
    fleet_options,
    machine,
    scratch_database,
    scratch_topology,
    service_env,
    stopping,
)
from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import DatabaseUrl

TABLES = ("jobs", "job_attempts", "outbox", "job_effects")
# The relay's default --retention-interval (relay/settings.py).
RETENTION_INTERVAL = 30.0


def produce(db: DatabaseUrl, rate: float, seconds: float, stop: threading.Event) -> int:
    """Enqueue ``rate`` jobs a second in ticks of a tenth of a second, on a fixed
    schedule (not as fast as possible). Returns how many were enqueued."""
    engine = create_engine(db.sqlalchemy, pool_size=2)
    began, done, tick = time.monotonic(), 0, 0
    try:
        while not stop.is_set() and time.monotonic() - began < seconds:
            tick += 1
            target = int(rate * tick / 10)
            jobs = []
            for i in range(done, target):
                kind = "fails" if i % 10 == 0 else "effect" if i % 10 < 3 else "noop"
                jobs.append(outbox.NewJob(kind, {"key": i}, dedup_key=f"bench-{i}"))
            with Session(engine) as session, session.begin():
                outbox.enqueue_many(session, jobs)
            done = target
            delay = began + tick / 10 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    finally:
        engine.dispose()
    return done


def sample(conn: psycopg.Connection, started: float) -> dict[str, Any]:
    rows = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}  # type: ignore[index]
    states: dict[str, int] = dict(
        conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall()
    )
    sizes: dict[str, int] = dict(
        conn.execute(
            "SELECT relname, pg_total_relation_size(relid) FROM pg_stat_user_tables"
            " WHERE relname = ANY(%s)",
            [list(TABLES)],
        ).fetchall()
    )
    dead: dict[str, int] = dict(
        conn.execute(
            "SELECT relname, n_dead_tup FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            [list(TABLES)],
        ).fetchall()
    )
    return {
        "t_s": round(time.monotonic() - started),
        "rows": rows,
        "jobs_by_state": states,
        "kib": {t: sizes.get(t, 0) // 1024 for t in TABLES},
        "dead_tuples": {t: dead.get(t, 0) for t in TABLES},
    }


def vacuum(conn: psycopg.Connection) -> None:
    """What autovacuum would do to the churned tables: mark dead rows' space free
    for reuse (plain VACUUM: no lock that blocks the jobs flowing through)."""
    for table in TABLES:
        conn.execute(f"VACUUM {table}")


def retention_log(path: Path) -> dict[str, Any]:
    rounds, deleted = 0, 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "relay.retention_deleted":
            rounds += 1
            deleted += int(event.get("jobs", 0))
    return {"rounds_that_deleted": rounds, "jobs_deleted": deleted}


def main() -> None:
    parser = argument_parser("bench.retention", __doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the load run")
    parser.add_argument("--rate", type=float, default=200.0, help="jobs enqueued per second")
    parser.add_argument(
        "--keep-finished", type=float, default=60.0, help="the relay's --keep-finished, seconds"
    )
    parser.add_argument("--sample-every", type=float, default=30.0, help="seconds between samples")
    fleet_options(parser, consumers=1, concurrency=None)
    parser.add_argument(
        "--vacuum",
        choices=["auto", "always", "never"],
        default="auto",
        help="VACUUM the tables after each sample (auto: if the server's autovacuum is off)",
    )
    args = parser.parse_args()
    seconds = args.minutes * 60

    log_dir = Path(tempfile.mkdtemp(prefix="bench-retention-"))
    relay_log = log_dir / "relay.log"
    with scratch_database("retention") as db, scratch_topology(["default"]) as topology:
        env = service_env(db, topology)
        with relay_log.open("wb") as out:
            relay = subprocess.Popen(
                [str(BIN / "relay"), "--keep-finished", str(args.keep_finished)],
                env=env | {"LOG_LEVEL": "INFO"},
                stderr=out,
                stdout=out,
            )
        # The consumers log every failed job (one in ten here): to a file, not the
        # terminal the JSON goes to.
        with (log_dir / "consumers.log").open("wb") as out:
            consumers = [
                subprocess.Popen(
                    [str(BIN / "consumer"), "--app", "bench.apps"],
                    env=env,
                    stdout=out,
                    stderr=out,
                )
                for _ in range(args.consumers)
            ]
        stop = threading.Event()
        produced: list[int] = []
        samples: list[dict[str, Any]] = []
        autovacuum = vacuuming = False
        with stopping([*consumers, relay]), psycopg.connect(db.conninfo, autocommit=True) as conn:
            try:
                autovacuum = conn.execute("SHOW autovacuum").fetchone() == ("on",)
                vacuuming = args.vacuum == "always" or (args.vacuum == "auto" and not autovacuum)
                started = time.monotonic()
                producer = threading.Thread(
                    target=lambda: produced.append(produce(db, args.rate, seconds, stop))
                )
                producer.start()
                next_at = started
                while producer.is_alive():
                    next_at += args.sample_every
                    producer.join(max(0.0, next_at - time.monotonic()))
                    samples.append(sample(conn, started))
                    if vacuuming:
                        vacuum(conn)
            finally:
                stop.set()

    bound = int(args.rate * (args.keep_finished + RETENTION_INTERVAL + 10))
    warm = args.keep_finished + 2 * RETENTION_INTERVAL
    steady = [s for s in samples if s["t_s"] >= warm]
    print(
        json.dumps(
            {
                "benchmark": "retention",
                "minutes": args.minutes,
                "rate_per_s": args.rate,
                "keep_finished_s": args.keep_finished,
                "retention_interval_s": RETENTION_INTERVAL,
                "server_autovacuum": autovacuum,
                "bench_vacuums_each_sample": vacuuming,
                "enqueued": sum(produced),
                "expected_jobs_rows_at_most": bound,
                "steady_state": {
                    "from_t_s": warm,
                    "max_rows": {
                        t: max((s["rows"][t] for s in steady), default=None) for t in TABLES
                    },
                    "max_kib": {
                        t: max((s["kib"][t] for s in steady), default=None) for t in TABLES
                    },
                    "jobs_rows_within_bound": all(s["rows"]["jobs"] <= bound for s in steady),
                },
                "retention": retention_log(relay_log),
                "logs": str(log_dir),
                "samples": samples,
                "machine": machine(),
            },
            indent=2,
            default=str,
        )
    )


if __name__ == "__main__":
    main()
