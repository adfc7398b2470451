"""What a rate limit costs the drain: no-op jobs drained (one relay, two consumer
processes of 50) without a rate limit, and the same jobs under one rate limit far
above the drain rate (1,000,000 per second, so it never binds: every claim takes
its tokens from the one bucket every consumer shares, and only that bookkeeping is
measured). Each variant in a fresh database, one after another, in one run.

Prints one JSON object with jobs/s and each variant's ratio to the first (the
issue's target: at least 0.8).
"""

from __future__ import annotations

from datetime import timedelta

from bench.common import committing, drain_variants
from bench.fleet import drain_rate, fleet
from hybrid_jobs import outbox

VARIANTS = {"no rate limit": False, "rate limit far above the drain": True}
FAR_ABOVE = 1_000_000


def run(jobs: int, limited: bool, consumers: int, concurrency: int) -> float:
    with fleet(consumers=consumers, concurrency=concurrency) as f:
        if limited:
            with committing(f.db) as session:
                outbox.set_rate_limit(session, "bench", rate=FAR_ABOVE, per=timedelta(seconds=1))
        batch = [
            outbox.NewJob("noop", {}, rate_limit="bench" if limited else None) for _ in range(jobs)
        ]
        return drain_rate(f, batch)


def main() -> None:
    drain_variants(
        "rate_limits",
        __doc__,
        VARIANTS,
        lambda limited, args: run(args.jobs, limited, args.consumers, args.concurrency),
        jobs=2_000,
        ratio_key="ratio_to_no_rate_limit",
    )


if __name__ == "__main__":
    main()
