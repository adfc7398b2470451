"""Where commit-to-handler-start goes, hop by hop.

Jobs are committed one per transaction at a fixed rate; the relay and the consumers
run with LOG_LEVEL=DEBUG, which makes them trace each wake-up with a wall-clock time
(relay.notified, relay.sent, consumer.delivered, consumer.claimed), and the bench
handler notes when it starts. All processes share the machine's clock. Per job:

    commit -> notified   the producer sends COMMIT until the relay hears its NOTIFY
                         (delivered at commit, often before COMMIT returns)
    notified -> sent     the relay decides, marks and publishes (confirms awaited)
    sent -> delivered    RabbitMQ hands the message to a consumer
    delivered -> claimed the consumer's claim statement, committed
    claimed -> started   the handler's task gets the event loop

(a hop can be negative where two processes race: a delivery can arrive before the
relay has logged the publish it waits confirms for). DEBUG tracing costs a little
itself: the headline figure is bench.drain's, at the normal log level.

With --history N, N finished jobs are in place and the tables analyzed before the
run, as autovacuum would have them in production: the planner then knows the
jobs table is large, which changes the plans the prepared statements settle on.

Prints one JSON object.
"""

from __future__ import annotations

import bisect
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

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
from bench.marks import ENV, Marks
from bench.peers.base import paced
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
]


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def main() -> None:
    parser = argument_parser("bench.latency", __doc__)
    pace_options(parser, seconds=10)
    fleet_options(parser, consumers=2, concurrency=None)
    parser.add_argument(
        "--no-trace",
        dest="trace",
        action="store_false",
        help="run at the normal log level: only commit-to-start and CPU, not the hops",
    )
    parser.add_argument(
        "--history", type=int, default=0, help="finished jobs in place, analyzed, before the run"
    )
    args = parser.parse_args()

    logs = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    level = "DEBUG" if args.trace else "INFO"
    with scratch_system(env={ENV: str(logs), "LOG_LEVEL": level}, logs=logs) as system:
        db = system.db
        if args.history:
            with psycopg.connect(db.conninfo, autocommit=True) as conn:
                fill(conn, args.history, 0)
                conn.execute("VACUUM ANALYZE jobs")
        procs = [system.start("relay")]
        procs += [system.start("consumer", "--app", "bench.apps") for _ in range(args.consumers)]
        time.sleep(3)  # connected, consuming
        cpu_before = [cpu_seconds(p.pid) for p in procs]
        engine = create_engine(db.sqlalchemy, pool_size=2)
        committed: dict[str, float] = {}
        committing: dict[str, float] = {}
        for _ in paced(args.rate, args.seconds):
            with Session(engine) as session, session.begin():
                job_id = outbox.enqueue(session, "latency", {})
                committing[str(job_id)] = time.time()
            committed[str(job_id)] = time.time()
        engine.dispose()
        total = len(committed)
        wait_succeeded(db, "latency", total)
        cpu = [cpu_seconds(p.pid) - b for p, b in zip(procs, cpu_before, strict=True)]

    at: dict[str, dict[str, float]] = {j: {"commit": t} for j, t in committed.items()}
    notified = sorted(e["t"] for e in _events(logs / "p0.log") if e["event"] == "relay.notified")
    for path in logs.glob("p*.log"):
        for e in _events(path):
            kind = {"relay.sent": "sent", "consumer.delivered": "delivered"}.get(e["event"])
            kind = kind or {"consumer.claimed": "claimed"}.get(e["event"])
            if kind:
                for job_id in e["job_ids"]:
                    at.get(job_id, {}).setdefault(kind, e["t"])
    for job_id, t in Marks(logs).starts().items():
        at.get(job_id, {}).setdefault("started", t)
    # The NOTIFY a job's commit caused is the first one the relay heard after the
    # producer sent COMMIT (not after COMMIT returned: the notification can be
    # faster than the reply, and the next job's would be matched instead).
    for job_id, times in at.items():
        k = bisect.bisect_left(notified, committing[job_id])
        if k < len(notified):
            times["notified"] = notified[k]
        times["committing"] = committing[job_id]
    result: dict[str, Any] = {"rate_per_s": args.rate, "jobs": len(at), "history": args.history}
    for name, a, b in HOPS:
        samples = [(t[b] - t[a]) * 1000 for t in at.values() if a in t and b in t]
        result[name] = percentiles(samples) if len(samples) > 10 else None
    result["cpu_ms_per_job"] = {
        "relay": round(cpu[0] * 1000 / total, 3),
        "consumers": round(sum(cpu[1:]) * 1000 / total, 3),
    }
    report("latency", result)


if __name__ == "__main__":
    main()
