"""Scale-out on one machine: 20,000 no-op jobs drained by one relay and 1, 2 and 4
consumer processes of 50 slots each, one after another, each in a fresh database.
On a 2-core machine the processes share the same cores, so this shows what more
processes cost and whether anything serialises them, not how a cluster scales.

Prints one JSON object.
"""

from __future__ import annotations

from bench.common import argument_parser, fleet_options, report
from bench.fleet import drain_rate, fleet
from hybrid_jobs import outbox


def drain(consumers: int, jobs: int, relays: int, concurrency: int) -> float:
    with fleet(consumers=consumers, relays=relays, concurrency=concurrency) as f:
        return drain_rate(f, [outbox.NewJob("noop", {}) for _ in range(jobs)])


def main() -> None:
    parser = argument_parser("bench.scale", __doc__)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs drained per run")
    parser.add_argument("--relays", type=int, default=1, help="relay processes")
    fleet_options(parser, consumers=None, concurrency=50)
    args = parser.parse_args()
    rates = {n: round(drain(n, args.jobs, args.relays, args.concurrency)) for n in (1, 2, 4)}
    report(
        "scale",
        {
            "jobs": args.jobs,
            "relays": args.relays,
            "drain_jobs_per_s_by_consumer_processes": rates,
        },
    )


if __name__ == "__main__":
    main()
