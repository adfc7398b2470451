"""What each gate costs the drain, against the plain drain, in one run.

    python -m bench.gates [--jobs 20000] [--consumers 2] [--concurrency 50]
                          [--keys 10000] [--resources 10000] [--tenant-cap 5]
                          [--repeat 1] [--variants plain,keys,...]

Each variant drains --jobs no-op jobs (committed at once with enqueue_many) on one
relay and --consumers consumer processes of --concurrency slots, in a fresh
scratch database and broker namespace; jobs/s from the commit until no job waits
or runs, and then every job must have SUCCEEDED (else the run stops with an
error). The gates are set so that they hardly ever bind: what is measured is
their bookkeeping, not waiting.

- plain: no gate;
- keys: over --keys keys, key_limit=1 (as bench.keys: every claim takes a key,
  every outcome releases it and wakes the key's next job);
- tenants-1000, tenants-10000: over 1,000 / 10,000 tenants, each capped at
  --tenant-cap running (max_running, set before the commit; as
  bench.tenants_scale: every claim reserves a slot, every outcome releases it);
- rate: every job under one rate limit of 1,000,000 per second (as
  bench.rate_limits: every claim takes tokens of the one bucket all share);
- resource: over --resources resources, one per job (jobs of one resource are
  --resources apart in the batch, so holders rarely collide);
- deadline: every job with an expiry one hour away (expires=);
- concurrency: every job of a type whose handler declares global_limit=100,000
  (every claim takes a slot of its one row, every outcome gives it back);
- queue-limit: every job of a queue with a concurrency limit of 100,000
  (every claim takes a slot of the queue's one row, every outcome gives it back);
- weight: every job of weight 2 (every claim counts its consumer's free slots by
  weight, every outcome is composed with the weight; each consumer runs half as
  many no-op jobs at once).

--repeat R runs the whole list R times in alternation (plain, keys, ..., plain,
keys, ...), so slow drift of the machine falls on every variant alike; each
variant's figure is the median of its R rates, its ratio that median over the
plain drain's. --variants picks a subset; plain is always run, first in each
round, since the ratios are to it.

Prints a line per drain and a table on stderr, then one JSON object.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from types import FrameType
from typing import Any

import psycopg

from bench import keys, tenants_scale
from bench.common import argument_parser, committing, fleet_options, report
from bench.fleet import drain_rate, fleet
from bench.rate_limits import FAR_ABOVE
from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import DatabaseUrl

RATE_LIMIT = "bench-gates"
EXPIRES = timedelta(hours=1)

# A variant: given the options and the fleet's database, sets what the gate needs
# (caps, a rate limit; committed before the jobs) and returns the jobs to drain.
Variant = Callable[[argparse.Namespace, DatabaseUrl], list[outbox.NewJob]]


def plain(args: argparse.Namespace, db: DatabaseUrl) -> list[outbox.NewJob]:
    return [outbox.NewJob("noop", {}) for _ in range(args.jobs)]


def keyed(args: argparse.Namespace, db: DatabaseUrl) -> list[outbox.NewJob]:
    # key_limit is left to its default, 1
    return keys.jobs_over(args.keys, args.jobs)


def tenants(n: int) -> Variant:
    def variant(args: argparse.Namespace, db: DatabaseUrl) -> list[outbox.NewJob]:
        tenants_scale.set_caps(db, n, args.tenant_cap)
        return tenants_scale.jobs_over(n, args.jobs)

    return variant


def rate(args: argparse.Namespace, db: DatabaseUrl) -> list[outbox.NewJob]:
    with committing(db) as session:
        outbox.set_rate_limit(session, RATE_LIMIT, rate=FAR_ABOVE, per=timedelta(seconds=1))
    return [outbox.NewJob("noop", {}, rate_limit=RATE_LIMIT) for _ in range(args.jobs)]


def resource(args: argparse.Namespace, db: DatabaseUrl) -> list[outbox.NewJob]:
    return [
        outbox.NewJob("noop", {}, resource=f"resource:{i % args.resources}")
        for i in range(args.jobs)
    ]


def deadline(args: argparse.Namespace, db: DatabaseUrl) -> list[outbox.NewJob]:
    return [outbox.NewJob("noop", {}, expires=EXPIRES) for _ in range(args.jobs)]


def concurrency(args: argparse.Namespace, db: DatabaseUrl) -> list[outbox.NewJob]:
    return [outbox.NewJob("noop_limited", {}) for _ in range(args.jobs)]


def queue_limited(args: argparse.Namespace, db: DatabaseUrl) -> list[outbox.NewJob]:
    # far above the load: the limit's bookkeeping, never its waiting
    with committing(db) as session:
        outbox.set_queue_limit(session, "default", 100_000, by="bench")
    return [outbox.NewJob("noop", {}) for _ in range(args.jobs)]


def weighed(args: argparse.Namespace, db: DatabaseUrl) -> list[outbox.NewJob]:
    return [outbox.NewJob("noop", {}, weight=2) for _ in range(args.jobs)]


VARIANTS: dict[str, Variant] = {
    "plain": plain,
    "keys": keyed,
    "tenants-1000": tenants(1_000),
    "tenants-10000": tenants(10_000),
    "rate": rate,
    "resource": resource,
    "deadline": deadline,
    "concurrency": concurrency,
    "queue-limit": queue_limited,
    "weight": weighed,
}


def variant_options(parser: argparse.ArgumentParser) -> None:
    """The shape of the variants' gates (bench.cpu_split drains a variant too)."""
    parser.add_argument("--keys", type=int, default=10_000, help="keys of the keys variant")
    parser.add_argument(
        "--resources", type=int, default=10_000, help="resources of the resource variant"
    )
    parser.add_argument(
        "--tenant-cap", type=int, default=5, help="max_running of each tenant (tenants-*)"
    )


def states(db: DatabaseUrl) -> dict[str, int]:
    with psycopg.connect(db.conninfo) as conn:
        rows = conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall()
    return {str(state): int(n) for state, n in rows}


def drain(name: str, args: argparse.Namespace) -> float:
    """One variant's drain in a fresh database: jobs/s, once every job SUCCEEDED."""
    with fleet(consumers=args.consumers, concurrency=args.concurrency) as f:
        batch = VARIANTS[name](args, f.db)
        jobs_per_s = drain_rate(f, batch)
        found = states(f.db)
    if found != {"SUCCEEDED": len(batch)}:
        raise RuntimeError(f"{name}: {len(batch)} jobs drained, ended {found}")
    return jobs_per_s


def chosen(variants: str) -> list[str]:
    names = [v.strip() for v in variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    return ["plain", *dict.fromkeys(v for v in names if v != "plain")]


def table(
    order: list[str], medians: dict[str, float], ratios: dict[str, float], rounds: int
) -> str:
    lines = [f"{'variant':<16}{'median jobs/s':>15}{'ratio to plain':>16}   ({rounds} rounds)"]
    lines += [f"{v:<16}{medians[v]:>15.0f}{ratios[v]:>16.2f}" for v in order]
    return "\n".join(lines)


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    parser = argument_parser("bench.gates", __doc__)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs drained per variant")
    fleet_options(parser, consumers=2, concurrency=50)
    variant_options(parser)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the whole list")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated; plain is always run"
    )
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C: daemons stopped, database and broker namespace dropped.
    signal.signal(signal.SIGTERM, _terminated)
    order = chosen(args.variants)
    started = time.monotonic()
    rates: dict[str, list[float]] = {v: [] for v in order}
    for r in range(args.repeat):
        for name in order:
            rates[name].append(drain(name, args))
            print(
                f"round {r + 1}/{args.repeat} {name}: {rates[name][-1]:.0f} jobs/s",
                file=sys.stderr,
                flush=True,
            )
    medians = {v: statistics.median(rs) for v, rs in rates.items()}
    ratios = {v: medians[v] / medians["plain"] for v in order}
    print(table(order, medians, ratios, args.repeat), file=sys.stderr, flush=True)
    result: dict[str, Any] = {
        "jobs": args.jobs,
        "consumer_processes": args.consumers,
        "concurrency_per_process": args.concurrency,
        "keys": args.keys,
        "resources": args.resources,
        "tenant_cap": args.tenant_cap,
        "repeat": args.repeat,
        "drain_jobs_per_s": {v: round(m) for v, m in medians.items()},
        "ratio_to_plain": {v: round(x, 2) for v, x in ratios.items()},
        "rounds_jobs_per_s": {v: [round(x) for x in rs] for v, rs in rates.items()},
        "seconds": round(time.monotonic() - started),
    }
    report("gates", result)


if __name__ == "__main__":
    main()
