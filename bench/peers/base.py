"""What every contender in `bench.compare` shares: the settings it is run with, the
figures it returns, and the small loops each one would otherwise repeat (a fixed
enqueue schedule, waiting for a condition, stopping worker processes)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import ROOT, percentiles
from bench.marks import Marks


@dataclass(frozen=True)
class Settings:
    jobs: int  # drained at once
    workers: int  # worker processes, for every contender
    rate: float  # latency: enqueues per second
    seconds: float  # latency: for how long


@dataclass(frozen=True)
class Figures:
    drain_jobs_per_s: float
    latency: dict[str, float]  # p50_ms, p95_ms, p99_ms, jobs, rate_per_s
    details: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Contender:
    name: str  # the table's row
    group: str  # what --only selects
    setup: str  # how it runs, one line
    measure: Callable[[Settings], Figures]


def paced(rate: float, seconds: float) -> Iterator[int]:
    """Yields 0..n-1 on a fixed schedule, each at its target moment, never "as fast as
    possible": a late enqueue does not make the next ones bunch up."""
    began = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = began + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield i


async def paced_async(rate: float, seconds: float) -> AsyncIterator[int]:
    """`paced` for a producer that lives in an event loop."""
    began = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = began + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        yield i


def wait_until(
    done: Callable[[], bool], what: str, timeout: float, interval: float = 0.02
) -> float:
    """Polls until done() is true; returns that moment (perf_counter)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return time.perf_counter()
        time.sleep(interval)
    raise TimeoutError(f"{what}: not within {timeout:.0f}s")


def latency_figures(
    committed: dict[str, float], started: dict[str, float], rate: float
) -> dict[str, float]:
    samples = [(started[j] - at) * 1000 for j, at in committed.items() if j in started]
    if len(samples) < 2:
        raise RuntimeError(f"only {len(samples)} of {len(committed)} latency jobs started")
    return percentiles(samples) | {"jobs": len(samples), "rate_per_s": rate}


def started_latency(
    marks: Marks,
    committed: dict[str, float],
    rate: float,
    what: str,
    check: Callable[[], None] = lambda: None,
) -> dict[str, float]:
    """Once every latency job of ``committed`` (its commit time, by job id) has
    started, their figures; ``check`` raises meanwhile if a worker died."""

    def all_started() -> bool:
        check()
        return marks.start_count() >= len(committed)

    wait_until(all_started, f"{what} latency jobs", timeout=60)
    return latency_figures(committed, marks.starts(), rate)


def drain_timeout(jobs: int) -> float:
    """Long enough for the slowest contender at a few hundred jobs/s, with margin."""
    return 120 + jobs / 50


def stop_processes(procs: list[subprocess.Popen[bytes]], timeout: float = 30) -> None:
    """SIGTERM (every contender's workers stop cleanly on it), then SIGKILL if one
    hangs; never leaves a child behind."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextlib.contextmanager
def running(
    commands: list[list[str]], env: dict[str, str], log: Path
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker processes with their output in one log file; stopped on the way out,
    also on failure or Ctrl-C. A worker that dies early is reported with the log."""
    with log.open("ab") as out:
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for command in commands:
                procs.append(
                    subprocess.Popen(
                        command,
                        cwd=ROOT,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=out,
                        # Out of the terminal's reach: Ctrl-C goes to the benchmark
                        # alone, which stops the workers when it is done with them.
                        start_new_session=True,
                    )
                )
            yield procs
        finally:
            stop_processes(procs)


def check_alive(procs: list[subprocess.Popen[bytes]], log: Path) -> None:
    for p in procs:
        if p.poll() is not None:
            raise RuntimeError(f"a worker exited with {p.returncode}:\n{tail(log)}")


def tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def say(message: str) -> None:
    """Progress goes to stderr, so stdout stays the table (or the JSON)."""
    print(message, file=sys.stderr, flush=True)
