"""Handlers the benchmarks run: `consumer --app bench.apps`."""

from __future__ import annotations

import asyncio
import os
import time
from typing import TextIO

import consumers

_starts: TextIO | None = None


@consumers.handler("noop")
async def noop(job: consumers.Job) -> None:
    return None


@consumers.handler("sleep")
async def sleep(job: consumers.Job) -> None:
    """Waits, using no CPU: how a burst spreads over consumers (bench.spread)."""
    await asyncio.sleep(float(job.payload.get("seconds", 1)))


def _starts_file() -> TextIO:
    global _starts
    if _starts is None:
        path = os.path.join(os.environ["BENCH_STARTS_DIR"], f"{os.getpid()}.txt")
        _starts = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
    return _starts


@consumers.handler("latency")
async def latency(job: consumers.Job) -> None:
    """Notes when the handler started, for commit-to-start latency. One line per job
    to a file of this process's own (all processes share the machine's clock)."""
    _starts_file().write(f"{job.id} {time.time()}\n")


@consumers.handler("effect")
async def effect(job: consumers.Job) -> None:
    """Marks an effect key done with its completion, as an idempotent handler does
    (bench.retention: the keys must leave with their jobs)."""
    async with job.transaction() as tx:
        await tx.once(f"bench:{job.payload['key']}")


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
