"""`consumer --app bench.batch_apps`: a handler of one job and a batch handler whose
every call holds the process's one connection to a downstream service for
BENCH_CALL_MS (a bulk insert or a bulk API call, say; 0: no call at all), as
bench.batch_drain sets it, with the batch size and wait it sets (BENCH_BATCH,
BENCH_BATCH_WAIT). The batch handler counts its calls by size and, as the process
exits, writes them to a file of its own in BENCH_BATCH_SIZES (a folder), if set."""

from __future__ import annotations

import asyncio
import atexit
import json
import os
from collections import Counter
from pathlib import Path

from hybrid_jobs import consumers

BATCH = int(os.environ.get("BENCH_BATCH", "100"))
BATCH_WAIT = float(os.environ.get("BENCH_BATCH_WAIT", "0.05"))
SIZES = os.environ.get("BENCH_BATCH_SIZES")
CALL_SECONDS = float(os.environ.get("BENCH_CALL_MS", "0")) / 1000

_sizes: Counter[int] = Counter()
# The process's one connection to the downstream service: one call at a time.
_downstream = asyncio.Lock()


async def _call() -> None:
    if CALL_SECONDS:
        async with _downstream:
            await asyncio.sleep(CALL_SECONDS)


@consumers.handler("call_one")
async def call_one(job: consumers.Job) -> None:
    """One call for its job."""
    await _call()


@consumers.handler("call_batch", batch=BATCH, batch_wait=BATCH_WAIT)
async def call_batch(jobs: list[consumers.Job]) -> None:
    """One call for every job of its batch."""
    _sizes[len(jobs)] += 1
    await _call()


def _write_sizes() -> None:
    if SIZES and _sizes:
        Path(SIZES, f"{os.getpid()}.json").write_text(json.dumps(_sizes))


atexit.register(_write_sizes)
