"""What tenants cost the drain: 20,000 no-op jobs drained (one relay, two consumer
processes of 50) with no tenant, spread over 10 tenants, and spread over 10 tenants
each capped at 20 running (caps that do not bind, so every claim reserves a slot and
every outcome releases it, and only the bookkeeping is measured). Each variant in a
fresh database, one after another, in one run.

Prints one JSON object with jobs/s and each variant's ratio to the first.
"""

from __future__ import annotations

from bench.common import committing, drain_variants
from bench.fleet import drain_rate, fleet
from hybrid_jobs import outbox

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
    drain_variants(
        "tenants_cost",
        __doc__,
        VARIANTS,
        lambda variant, args: run(args.jobs, *variant, args.consumers, args.concurrency),
        jobs=20_000,
        ratio_key="ratio_to_no_tenant",
    )


if __name__ == "__main__":
    main()
