"""Where commit-to-handler-start goes, hop by hop: this project's, and the floor's
(`bench.peers.floor`, this design's hops with the least SQL) split the same way.

Jobs are committed one per transaction at a fixed rate. Ours: the relay and the
consumers run with LOG_LEVEL=DEBUG, which makes them trace each wake-up with a
wall-clock time (relay.notified, relay.decided, relay.sent, consumer.delivered,
consumer.claiming, consumer.claimed). The floor's processes note the same points in
their marks (BENCH_HOPS). Each bench handler notes when it starts. All processes
share the machine's clock. Per job:

    commit -> notified   the producer sends COMMIT until the relay hears its NOTIFY
                         (delivered at commit, often before COMMIT returns)
    notified -> sent     the relay decides, marks and publishes (confirms awaited),
                         split in two:
      notified -> decided   its turn to run, BEGIN, and the decision that marks
                            the wake-ups sent (the floor: its one-line UPDATE)
      decided -> sent       the publish, until RabbitMQ's confirms are back
    sent -> delivered    RabbitMQ hands the message to a consumer
    delivered -> claimed the consumer's claim, committed, split in two:
      delivered -> claiming the consumer's own way from the delivery to its claim
      claiming -> claimed   the claim statement and its commit
    claimed -> started   the handler's task gets the event loop

(a hop can be negative where two processes race: a delivery can arrive before the
relay has noted the publish it waits confirms for). Tracing costs a little itself:
the headline figures are bench.compare's, untraced.

``--only ours`` or ``--only floor`` runs one of them; by default ours runs first,
then the floor, and ``ours_over_floor`` divides each hop's p50 and p99.

With --history N, N finished jobs are in place and the tables analyzed before our
run, as autovacuum would have them in production: the planner then knows the jobs
table is large, which changes the plans the prepared statements settle on.

With --full, ours runs bench.full_feature's full run: every job of one of 1,000
tenants capped at 5, with one of 5,000 keys (key_limit=1) and a rate limit far
above the load, over finished jobs (--history, else 100,000) that the relay's
retention deletes as the run adds more. The floor has none of that.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import bisect
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bench import full_feature
from bench.common import (
    argument_parser,
    cpu_seconds,
    fleet_options,
    pace_options,
    percentiles,
    report,
    scratch_system,
)
from bench.drain import wait_succeeded
from bench.marks import ENV, HOPS_ENV, Marks
from bench.peers import floor
from bench.peers.base import paced, wait_until
from harness.history import fill
from hybrid_jobs import outbox

# (the figure's name, from, to): "committing" is when the producer sent COMMIT,
# "commit" when COMMIT returned.
HOPS = [
    ("commit_to_notified", "committing", "notified"),
    ("notified_to_sent", "notified", "sent"),
    ("sent_to_delivered", "sent", "delivered"),
    ("delivered_to_claimed", "delivered", "claimed"),
    ("claimed_to_started", "claimed", "started"),
    ("commit_to_started", "commit", "started"),
    # two of them split: the relay's pass up to its decision (its turn, BEGIN, the
    # decision) and the publish with its confirms; the consumer's way to its claim
    # and the claim statement, committed
    ("notified_to_decided", "notified", "decided"),
    ("decided_to_sent", "decided", "sent"),
    ("delivered_to_claiming", "delivered", "claiming"),
    ("claiming_to_claimed", "claiming", "claimed"),
]

# The finished jobs in place for --full, unless --history says otherwise.
FULL_HISTORY = 100_000

# One job's times, by point: the producer's (committing, commit) and each hop's.
Times = dict[str, dict[str, float]]


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def split(
    committing: dict[str, float],
    committed: dict[str, float],
    notified: list[float],
    hops: list[tuple[str, float, list[str]]],
    starts: dict[str, float],
) -> dict[str, Any]:
    """Each hop's percentiles, from the producer's times, the NOTIFYs the relay
    heard, the (hop, time, job ids) noted and the handlers' starts, by job id."""
    at: Times = {j: {"commit": t, "committing": committing[j]} for j, t in committed.items()}
    for name, t, job_ids in hops:
        for job_id in job_ids:
            at.get(job_id, {}).setdefault(name, t)
    for job_id, t in starts.items():
        at.get(job_id, {}).setdefault("started", t)
    # The NOTIFY a job's commit caused is the first one the relay heard after the
    # producer sent COMMIT (not after COMMIT returned: the notification can be
    # faster than the reply, and the next job's would be matched instead).
    notified = sorted(notified)
    for times in at.values():
        k = bisect.bisect_left(notified, times["committing"])
        if k < len(notified):
            times["notified"] = notified[k]
    figures: dict[str, Any] = {"jobs": len(at)}
    for name, a, b in HOPS:
        samples = [(t[b] - t[a]) * 1000 for t in at.values() if a in t and b in t]
        figures[name] = percentiles(samples) if len(samples) > 10 else None
    return figures


def ours(args: argparse.Namespace) -> dict[str, Any]:
    logs = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    with scratch_system(env={ENV: str(logs), "LOG_LEVEL": "DEBUG"}, logs=logs) as system:
        db = system.db
        relay_args: list[str] = []
        job: Callable[[int], dict[str, Any]] = full_feature.featureless
        if args.full:
            shape = full_shape(args)
            relay_args, job = full_feature.prepare(db, shape), full_feature.featured(shape)
        elif args.history:
            with psycopg.connect(db.conninfo, autocommit=True) as conn:
                fill(conn, args.history, 0)
                conn.execute("VACUUM ANALYZE jobs")
        procs = [system.start("relay", *relay_args)]
        procs += [system.start("consumer", "--app", "bench.apps") for _ in range(args.consumers)]
        # Listening and consuming before the first commit: a NOTIFY sent before the
        # relay's LISTEN is never heard, and its hop would be missing.
        ready = {0: "relay.listening"} | {i: "consumer.started" for i in range(1, len(procs))}

        def all_ready() -> bool:
            for i in ready:
                if procs[i].poll() is not None:
                    raise RuntimeError(f"p{i} exited with {procs[i].returncode}")
            return all(
                any(e["event"] == event for e in _events(logs / f"p{i}.log"))
                for i, event in ready.items()
            )

        wait_until(all_ready, "relay listening and consumers consuming", timeout=60)
        cpu_before = [cpu_seconds(p.pid) for p in procs]
        engine = create_engine(db.sqlalchemy, pool_size=2)
        committed: dict[str, float] = {}
        committing: dict[str, float] = {}
        for i in paced(args.rate, args.seconds):
            with Session(engine) as session, session.begin():
                job_id = outbox.enqueue(session, "latency", {}, **job(i))
                committing[str(job_id)] = time.time()
            committed[str(job_id)] = time.time()
        engine.dispose()
        wait_succeeded(db, "latency", len(committed))
        cpu = [cpu_seconds(p.pid) - b for p, b in zip(procs, cpu_before, strict=True)]

    notified = [e["t"] for e in _events(logs / "p0.log") if e["event"] == "relay.notified"]
    kinds = {
        "relay.decided": "decided",
        "relay.sent": "sent",
        "consumer.delivered": "delivered",
        "consumer.claiming": "claiming",
        "consumer.claimed": "claimed",
    }
    hops = [
        (kinds[e["event"]], e["t"], e["job_ids"])
        for path in logs.glob("p*.log")
        for e in _events(path)
        if e["event"] in kinds
    ]
    figures = split(committing, committed, notified, hops, Marks(logs).starts())
    return figures | {"cpu_ms_per_job": _cpu_per_job(cpu, len(committed))}


def full_shape(args: argparse.Namespace) -> argparse.Namespace:
    """bench.full_feature's full run, at this run's rate. Its retention keeps what
    this rate adds in the history's time, and never less than the run and a minute:
    the run's own jobs must still be there to be counted when it ends."""
    history = args.history or FULL_HISTORY
    keep = max(history / args.rate, args.seconds + 60)
    return argparse.Namespace(
        tenants=1000, keys=5000, history=history, keep_finished=keep, rate=args.rate
    )


def floor_split(args: argparse.Namespace) -> dict[str, Any]:
    """The floor's hops: its processes note them in their marks, at the points where
    ours traces the same hops."""
    with floor.floor_fleet(args.consumers, {HOPS_ENV: "1"}) as fleet:
        cpu_before = [cpu_seconds(p.pid) for p in fleet.procs]
        committed: dict[str, float] = {}
        committing: dict[str, float] = {}
        for _ in paced(args.rate, args.seconds):
            # BEGIN, the insert, then COMMIT on its own, as our producer commits
            with fleet.conn.transaction():
                (job_id,) = floor.enqueue(fleet.conn, "latency")
                committing[job_id] = time.time()
            committed[job_id] = time.time()

        def all_started() -> bool:
            fleet.check()
            return fleet.marks.start_count() >= len(committed)

        wait_until(all_started, "floor latency jobs", timeout=60)
        cpu = [cpu_seconds(p.pid) - b for p, b in zip(fleet.procs, cpu_before, strict=True)]
        noted = fleet.marks.hops()
        starts = fleet.marks.starts()
    notified = [t for name, t, _ in noted if name == "notified"]
    hops = [hop for hop in noted if hop[0] != "notified"]
    figures = split(committing, committed, notified, hops, starts)
    return figures | {"cpu_ms_per_job": _cpu_per_job(cpu, len(committed))}


def _cpu_per_job(cpu: list[float], jobs: int) -> dict[str, float]:
    """CPU seconds of the relay (first) and the consumers (the rest), in ms a job."""
    return {
        "relay": round(cpu[0] * 1000 / jobs, 3),
        "consumers": round(sum(cpu[1:]) * 1000 / jobs, 3),
    }


def ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Each hop's p50 and p99 of ``a`` divided by ``b``'s (None where either is
    missing or ``b``'s is not positive: a hop can be negative)."""
    out: dict[str, dict[str, float | None]] = {}
    for name, _, _ in HOPS:
        out[name] = {}
        for q in ("p50_ms", "p99_ms"):
            x, y = (a.get(name) or {}).get(q), (b.get(name) or {}).get(q)
            out[name][q] = round(x / y, 2) if x is not None and y and y > 0 else None
    return out


def main() -> None:
    parser = argument_parser("bench.latency", __doc__)
    pace_options(parser, seconds=10)
    fleet_options(parser, consumers=2, concurrency=None)
    parser.add_argument(
        "--only", choices=["ours", "floor"], help="run only this project's, or only the floor's"
    )
    parser.add_argument(
        "--history", type=int, default=0, help="finished jobs in place, analyzed, before our run"
    )
    parser.add_argument(
        "--full", action="store_true", help="ours with bench.full_feature's tenants, keys and limit"
    )
    args = parser.parse_args()
    history = args.history or (FULL_HISTORY if args.full else 0)
    result: dict[str, Any] = {"rate_per_s": args.rate, "history": history, "full": args.full}
    if args.only != "floor":
        result["ours"] = ours(args)
    if args.only != "ours":
        result["floor"] = floor_split(args)
    if "ours" in result and "floor" in result:
        result["ours_over_floor"] = ratios(result["ours"], result["floor"])
    report("latency", result)


if __name__ == "__main__":
    main()
