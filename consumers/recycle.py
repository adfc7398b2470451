"""Recycling a worker process: after so many jobs, or past so much memory, it stops
the way SIGTERM stops it and its supervisor starts a fresh one.

Python rarely gives freed memory back to the system, and a handler (or a library
under it) that leaks a little per job grows its process for ever; Celery's answer,
``worker_max_tasks_per_child`` and ``worker_max_memory_per_child``, is this one. The
limits are checked in the process itself, between jobs: a process that reaches one
stops claiming, lets what it holds finish (or gives it back after the drain, as a
graceful stop does), and exits. Its leases are its own until then, so no job it held
can start anywhere else while it still runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("consumer")

# How often the limits are looked at. Jobs are counted as they are claimed, so a
# process may take the jobs of one more claim before it sees its limit.
JOB_CHECK_INTERVAL_S = 0.05
MEMORY_CHECK_INTERVAL_S = 0.25

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 2**20, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: str) -> int:
    """Bytes in ``512MiB``, ``512M``, ``1.5GB``, ``200000K``; a bare number is MiB.
    Units are powers of 1024, as ``ps`` and ``top`` count resident memory."""
    found = _SIZE.match(text)
    if found is None:
        raise ValueError(f"{text!r} is not a size (say 512MiB or 2GiB)")
    value = float(found.group(1)) * _UNITS[found.group(2).lower()]
    if value < 2**20:
        raise ValueError(f"{text!r} is less than 1 MiB")
    return int(value)


def rss_bytes() -> int:
    """This process's resident memory now (Linux), else its peak (elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


@dataclass(frozen=True)
class RecycleLimits:
    max_jobs: int | None = None
    max_memory: int | None = None  # bytes of resident memory

    def __bool__(self) -> bool:
        return self.max_jobs is not None or self.max_memory is not None


async def recycle_when_due(
    limits: RecycleLimits,
    jobs_started: Callable[[], int],
    stop: asyncio.Event,
    on_recycle: Callable[[], None],
    worker: str,
) -> None:
    """Set ``stop`` once this process has started ``max_jobs`` jobs, or once its
    resident memory passes ``max_memory`` after a job; ``on_recycle`` first (the
    supervisor starts a replacement at once)."""
    loop = asyncio.get_running_loop()
    next_memory_check = 0.0
    if limits.max_memory is not None and rss_bytes() >= limits.max_memory:
        log.warning(
            "consumer.memory_limit_below_baseline",
            extra={
                "worker": worker,
                "rss_mib": round(rss_bytes() / 2**20, 1),
                "limit_mib": round(limits.max_memory / 2**20, 1),
                "detail": "the process is past --max-memory-per-process before any job: "
                "it will be replaced after every job",
            },
        )
    while not stop.is_set():
        await asyncio.sleep(JOB_CHECK_INTERVAL_S)
        jobs = jobs_started()
        reason: dict[str, object] | None = None
        if limits.max_jobs is not None and jobs >= limits.max_jobs:
            reason = {"reason": "max_jobs", "limit": limits.max_jobs}
        elif limits.max_memory is not None and jobs and loop.time() >= next_memory_check:
            next_memory_check = loop.time() + MEMORY_CHECK_INTERVAL_S
            rss = rss_bytes()
            if rss >= limits.max_memory:
                reason = {
                    "reason": "max_memory",
                    "rss_mib": round(rss / 2**20, 1),
                    "limit_mib": round(limits.max_memory / 2**20, 1),
                }
        if reason is not None:
            log.info("consumer.recycling", extra={"worker": worker, "jobs": jobs, **reason})
            on_recycle()
            stop.set()
            return
