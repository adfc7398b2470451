"""Handlers the benchmarks run: `consumer --app bench.apps`, with the no-op and the
sleep the tests' app has too."""

from __future__ import annotations

from bench.marks import process_marks
from harness.handlers import noop, sleep
from hybrid_jobs import consumers


@consumers.handler("latency")
async def latency(job: consumers.Job) -> None:
    """Notes when the handler started, for commit-to-start latency (all processes
    share the machine's clock)."""
    process_marks().started(job.id)


@consumers.handler("effect")
async def effect(job: consumers.Job) -> None:
    """Marks an effect key done with its completion, as an idempotent handler does
    (bench.retention: the keys must leave with their jobs)."""
    async with job.transaction() as tx:
        await tx.once(f"bench:{job.payload['key']}")


@consumers.handler("noop_limited", global_limit=100_000)
async def noop_limited(job: consumers.Job) -> None:
    """A no-op under a concurrency limit far above any load (bench.gates: the
    limit's bookkeeping, never its waiting)."""
    return None


@consumers.handler("fails")
async def fails(job: consumers.Job) -> None:
    """Ends FAILED at once (bench.retention: failed jobs leave too)."""
    raise consumers.Permanent("bench: this job always fails", code="BENCH")


@consumers.handler("cpu")
def cpu(job: consumers.Job) -> None:
    """A plain function that holds the GIL for its whole run: ``work`` rounds of
    arithmetic in Python (bench.processes: what a second process buys)."""
    total = 0
    for i in range(int(job.payload["work"])):
        total += i * i % 7


__all__ = ["cpu", "effect", "fails", "latency", "noop", "sleep"]
