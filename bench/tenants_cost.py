"""What tenants cost the drain: 20,000 no-op jobs drained (one relay, two consumer
processes of 50) with no tenant, spread over 10 tenants, and spread over 10 tenants
each capped at 20 running (caps that do not bind, so every claim reserves a slot and
every outcome releases it, and only the bookkeeping is measured). Each variant in a
fresh database, one after another, in one run.

Prints one JSON object with jobs/s and each variant's ratio to the first.
"""

from __future__ import annotations

from typing import Any

import outbox
from bench.common import against_first, argument_parser, committing, fleet_options, report
from bench.fleet import drain_rate, fleet

VARIANTS = {"no tenant": (0, None), "10 tenants": (10, None), "10 tenants, capped": (10, 20)}


def run(jobs: int, tenants: int, cap: int | None, consumers: int, concurrency: int) -> float:
    with fleet(consumers=consumers, concurrency=concurrency) as f:
        names = [f"tenant-{i}" for i in range(tenants)]
        if cap is not None:
            with committing(f.db) as session:
                for name in names:
                    outbox.set_tenant_limit(session, name, max_running=cap)
        batch = [
            outbox.NewJob("noop", {}, tenant=names[i % tenants] if tenants else None)
            for i in range(jobs)
        ]
        return drain_rate(f, batch)


def main() -> None:
    parser = argument_parser("bench.tenants_cost", __doc__)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs drained per variant")
    fleet_options(parser)
    args = parser.parse_args()
    rates: dict[str, float] = {}
    for name, (tenants, cap) in VARIANTS.items():
        rates[name] = run(args.jobs, tenants, cap, args.consumers, args.concurrency)
    result: dict[str, Any] = {
        "jobs": args.jobs,
        **against_first(rates, "ratio_to_no_tenant"),
    }
    report("tenants_cost", result)


if __name__ == "__main__":
    main()
