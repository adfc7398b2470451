"""The claim and outcome statements' own cost, without a consumer around them: how
long one JOB_CLAIM_MANY (the whole claim) and one JOB_CLAIM_PLAIN_MANY (the shorter
claim a consumer tries first, for jobs with no key, resource, deadline or rate
limit) take for a batch of 1 and of 50 due jobs, with a backlog of waiting jobs in
place; and then one JOB_FINISH_MANY (the whole outcome) and one
JOB_FINISH_PLAIN_MANY (the shorter outcome of leases that hold no key and no
resource), each recording the success of a batch of 1 and of 50 of those jobs.
Keyed jobs, one key each, are claimed by the whole claim and by the claim composed
of the key's gate alone (what the consumer runs for them).

    python -m bench.claim_cost [--jobs 40000] [--repeat 100]

Each try is a real claim, committed, of jobs no earlier try took, on one
autocommit connection as the consumer's pool runs it (the statement prepared at its
first run, and planned once, generically: plumbing.db.DAEMON_OPTIONS). Prints one
JSON object: per batch size, the claim's wall time (p50, p95) with the consumer's
options and with PostgreSQL's default plan cache (five plans for the values, then
the generic one if it looks no costlier), and the outcome's wall time with the
consumer's options.
The claim's fixed cost bounds the start of every job at low load, and the claim's
and the outcome's the drain per batch at high load.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Iterator

import psycopg

from bench.common import argument_parser, committing, machine, scratch_database
from harness.claim import claim_params
from hybrid_jobs import outbox
from hybrid_jobs.consumers.outcome import Outcome
from hybrid_jobs.consumers.store import finish_params
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.plumbing.db import CONTROL_OPTIONS, DAEMON_OPTIONS, with_url_options
from hybrid_jobs.schema import queries as q


def measure(
    db: DatabaseUrl, options: str, ids: list[uuid.UUID], batch: int, statement: str
) -> dict[str, float]:
    """Claim ``ids`` ``batch`` at a time on one connection as the consumer's pool
    makes them (autocommit, prepared after a few executions): each claim is a real
    one, committed, of jobs no earlier try took."""
    walls = []
    # given options replace the URL's, which name the instance's schema: keep both
    with psycopg.connect(
        db.conninfo, options=with_url_options(db, options), autocommit=True
    ) as conn:
        for start in range(0, len(ids) - batch + 1, batch):
            chosen = ids[start : start + batch]
            started = time.perf_counter()
            rows = conn.execute(statement, claim_params(chosen, "bench-claim-cost")).fetchall()
            walls.append((time.perf_counter() - started) * 1000)
            if sum(1 for r in rows if r[0] == "claimed") != batch:
                raise RuntimeError(f"claimed {rows[:3]}... not {batch}")
    # the first few are planned afresh before psycopg prepares the statement
    walls = walls[10:]
    return {
        "claims": len(walls),
        "claim_ms_p50": round(statistics.median(walls), 3),
        "claim_ms_p95": round(statistics.quantiles(walls, n=20)[-1], 3),
    }


def measure_outcomes(
    db: DatabaseUrl, held: list[tuple[uuid.UUID, int]], batch: int, statement: str
) -> dict[str, float]:
    """Record the success of ``held`` leases (job id, generation) ``batch`` at a
    time, as the consumer's pool runs the outcome: each a real one, committed."""
    walls = []
    with psycopg.connect(
        db.conninfo, options=with_url_options(db, DAEMON_OPTIONS), autocommit=True
    ) as conn:
        for start in range(0, len(held) - batch + 1, batch):
            chosen = [(i, g, Outcome.succeeded()) for i, g in held[start : start + batch]]
            started = time.perf_counter()
            rows = conn.execute(statement, finish_params("bench-claim-cost", chosen)).fetchall()
            walls.append((time.perf_counter() - started) * 1000)
            if sum(1 for r in rows if r[1] == "SUCCEEDED") != batch:
                raise RuntimeError(f"recorded {rows[:3]}... not {batch}")
    walls = walls[10:] if batch == 1 else walls[2:]
    return {
        "outcomes": len(walls),
        "outcome_ms_p50": round(statistics.median(walls), 3),
        "outcome_ms_p95": round(statistics.quantiles(walls, n=20)[-1], 3),
    }


def main() -> None:
    parser = argument_parser("bench.claim_cost", __doc__)
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--repeat", type=int, default=100)
    args = parser.parse_args()
    if args.jobs < 20_000 or args.repeat < 20:
        # each timed slice (an eighth of the jobs, a sixteenth for the keyed ones, and
        # at most --repeat claims) must hold ten claims of 50 or more past the first
        # ten, which are planned afresh
        parser.error("--jobs must be 20000 or more and --repeat 20 or more")
    with scratch_database("bench_claim_cost") as db:
        with committing(db) as session:
            ids = outbox.enqueue_many(
                session, [outbox.NewJob("noop", {"i": i}) for i in range(args.jobs)]
            )
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE jobs")
        report: dict[str, object] = {
            "bench": "claim_cost",
            "machine": machine(),
            "jobs_waiting": args.jobs,
        }
        # each measure takes its own slice of the backlog, the rest still waiting
        slices = iter(range(0, args.jobs, args.jobs // 8))
        for claim, statement in (("whole", q.JOB_CLAIM_MANY), ("plain", q.JOB_CLAIM_PLAIN_MANY)):
            # ("default": PostgreSQL's plan cache, what planning for the values first costs)
            for mode, options in (("consumer", DAEMON_OPTIONS), ("default", CONTROL_OPTIONS)):
                for n in (1, 50):
                    first = next(slices)
                    chosen = ids[first : first + min(args.repeat * n, args.jobs // 8)]
                    report[f"{claim}_{mode}_batch_{n}"] = measure(db, options, chosen, n, statement)
        # keyed jobs (a key each, so every one may run): by the whole claim, and by
        # the claim composed of the key's gate alone, which the consumer runs for them
        with committing(db) as session:
            keyed = outbox.enqueue_many(
                session,
                [outbox.NewJob("noop", {"i": i}, key=f"k{i}") for i in range(args.jobs // 4)],
            )
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            conn.execute("ANALYZE jobs")
        parts = iter(range(0, len(keyed), len(keyed) // 4))
        for claim, statement in (
            ("keyed_whole", q.JOB_CLAIM_MANY),
            ("keyed_key_gate", q.job_claim_many(["key"])),
        ):
            for n in (1, 50):
                first = next(parts)
                chosen = keyed[first : first + min(args.repeat * n, len(keyed) // 4)]
                report[f"{claim}_consumer_batch_{n}"] = measure(
                    db, DAEMON_OPTIONS, chosen, n, statement
                )
        # the outcomes of the jobs the plain claim took, by each outcome statement
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT job_id, lease_generation FROM jobs WHERE lease_owner = %s",
                ["bench-claim-cost"],
            ).fetchall()
            conn.execute("ANALYZE jobs")
        held: Iterator[tuple[uuid.UUID, int]] = iter([(row[0], row[1]) for row in rows])
        per = min(args.repeat * 50, len(rows) // 4)
        for outcome, statement in (
            ("whole", q.JOB_FINISH_MANY),
            ("plain", q.JOB_FINISH_PLAIN_MANY),
        ):
            for n in (1, 50):
                leases = [next(held) for _ in range(min(per, args.repeat * n))]
                report[f"outcome_{outcome}_batch_{n}"] = measure_outcomes(db, leases, n, statement)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
