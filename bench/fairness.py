"""Fair share under a backlog: tenant A enqueues 20,000 no-op jobs, then tenant B
200; how long each waits (claim minus enqueue), with weights 1:1 and 1:3.

Without fair share, B would wait for all of A's backlog. With it, B's jobs go out
in turn with A's from the moment they arrive, so B waits about (the wake-ups in
flight + B's share of the interleaving) / the drain rate. Each weighting runs in a
fresh database with the same fleet (one relay, two consumer processes).

Prints one JSON object.
"""

from __future__ import annotations

from typing import Any

import psycopg

from bench.common import argument_parser, committing, fleet_options, percentiles, report
from bench.fleet import drain_rate, fleet
from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import DatabaseUrl


def waits(db: DatabaseUrl, tenant: str) -> dict[str, float]:
    with psycopg.connect(db.conninfo) as conn:
        rows = conn.execute(
            "SELECT EXTRACT(EPOCH FROM started_at - created_at) * 1000 FROM jobs WHERE tenant = %s",
            [tenant],
        ).fetchall()
    return percentiles([float(r[0]) for r in rows])


def run(weight_b: float, a_jobs: int, b_jobs: int, consumers: int) -> dict[str, Any]:
    with fleet(consumers=consumers) as f:
        with committing(f.db) as session:
            outbox.set_tenant_limit(session, "tenant-b", weight=weight_b)
        rate = drain_rate(
            f,
            [outbox.NewJob("noop", {}, tenant="tenant-a") for _ in range(a_jobs)],
            [outbox.NewJob("noop", {}, tenant="tenant-b") for _ in range(b_jobs)],
        )
        return {
            "weights": f"1:{weight_b:g}",
            "tenant_b_wait": waits(f.db, "tenant-b"),
            "tenant_a_wait": waits(f.db, "tenant-a"),
            "drain_jobs_per_s": round(rate),
        }


def main() -> None:
    parser = argument_parser("bench.fairness", __doc__)
    parser.add_argument("--a-jobs", type=int, default=20_000, help="tenant A's backlog")
    parser.add_argument("--b-jobs", type=int, default=200, help="tenant B's jobs, after A's")
    fleet_options(parser, consumers=2, concurrency=None)
    args = parser.parse_args()
    runs = [run(w, args.a_jobs, args.b_jobs, args.consumers) for w in (1.0, 3.0)]
    report("fairness", {"runs": runs})


if __name__ == "__main__":
    main()
