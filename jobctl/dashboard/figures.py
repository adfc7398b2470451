"""The overview's latency figures, from the metrics collector's cached snapshot.

A page load never reads the history: the collector already folds every finished
attempt, cancellation and schedule fire into histograms once per round
(jobctl.metrics). Its histograms count from the start of ``jobctl serve``; the
dashboard keeps the snapshots it has seen for a while and shows the difference
between the newest and one about ``WINDOW`` old, so a percentile describes the last
minutes rather than the process's whole life (until it has seen one that old, it
says "since start").
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from hybrid_jobs.jobctl.metrics import Collector, Snapshot
from hybrid_jobs.jobctl.metrics.histogram import FrozenHistogram

# The span the figures cover, once the dashboard has seen snapshots that old.
WINDOW: Final = 15 * 60.0
# A collection older than this many intervals is shown as stale.
STALE_ROUNDS: Final = 3


@dataclass(frozen=True)
class Quantiles:
    """Estimated from histogram buckets (linear within a bucket, as Prometheus's
    histogram_quantile does); ``above`` marks a value past the last finite bucket,
    which a histogram can only bound from below."""

    count: int
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    above: frozenset[str] = frozenset()


@dataclass(frozen=True)
class QueueFigures:
    queue: str
    wait: Quantiles
    execution: Quantiles
    attempts: Mapping[str, int]
    """Attempts that ended in the span, by outcome (succeeded, retry_scheduled, ...)."""
    attempts_per_success: float | None
    """The mean attempt number of the attempts that succeeded."""
    leases_expired: int
    """Attempts the sweeper ended because their lease ran out, in the span."""


@dataclass(frozen=True)
class Figures:
    state: str
    """ok, stale, waiting (no round yet) or off (the collector is not running)."""
    collected_ago: float | None
    span_seconds: float | None
    """What the figures cover; None: since jobctl serve started."""
    queues: Mapping[str, QueueFigures] = field(default_factory=dict)
    scheduler_delay: Quantiles = Quantiles(0)
    cancellation_latency: Quantiles = Quantiles(0)


def quantile(h: FrozenHistogram, q: float) -> tuple[float | None, bool]:
    """The q-quantile and whether it lies past the last finite bound."""
    total = h.count
    if total <= 0:
        return None, False
    rank = q * total
    lower, below = 0.0, 0.0
    for le, cumulative in h.buckets:
        upper = float(le)
        if cumulative >= rank:
            if math.isinf(upper):
                return lower, True
            inside = cumulative - below
            share = 0.0 if inside <= 0 else (rank - below) / inside
            return lower + (upper - lower) * share, False
        lower, below = upper, cumulative
    return lower, True


def quantiles(h: FrozenHistogram | None) -> Quantiles:
    if h is None or h.count <= 0:
        return Quantiles(0)
    found = {name: quantile(h, q) for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))}
    return Quantiles(
        count=round(h.count),
        p50=found["p50"][0],
        p95=found["p95"][0],
        p99=found["p99"][0],
        mean=h.sum / h.count,
        above=frozenset(name for name, (_, past) in found.items() if past),
    )


def minus(now: FrozenHistogram, then: FrozenHistogram | None) -> FrozenHistogram:
    """What was observed between two snapshots of one cumulative histogram."""
    if then is None:
        return now
    earlier = dict(then.buckets)
    buckets = tuple((le, max(0.0, n - earlier.get(le, 0.0))) for le, n in now.buckets)
    return FrozenHistogram(buckets, max(0.0, now.sum - then.sum))


def merged(histograms: Iterable[FrozenHistogram]) -> FrozenHistogram | None:
    """One histogram of several with the same buckets (a queue's job types)."""
    total: dict[str, float] = {}
    sums = 0.0
    found = False
    for h in histograms:
        found = True
        sums += h.sum
        for le, n in h.buckets:
            total[le] = total.get(le, 0.0) + n
    if not found:
        return None
    return FrozenHistogram(tuple(total.items()), sums)


class Recent:
    """The snapshots this process's dashboard has seen, with when each was taken,
    newest last: the newest is compared with the one that is about WINDOW old."""

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self._seen: deque[tuple[float, Snapshot]] = deque()

    def note(self, at: float, snapshot: Snapshot) -> None:
        if self._seen and self._seen[-1][1] is snapshot:
            return
        self._seen.append((at, snapshot))
        # Keep one snapshot older than the window: it is the baseline.
        while len(self._seen) > 2 and self._seen[1][0] <= at - self.window:
            self._seen.popleft()

    def baseline(self, at: float) -> tuple[float, Snapshot] | None:
        """The oldest snapshot kept, if older than the newest; None: only one seen."""
        if len(self._seen) < 2:
            return None
        oldest = self._seen[0]
        return oldest if oldest[0] < at else None


def figures(collector: Collector | None, recent: Recent, *, now: float | None = None) -> Figures:
    """The overview's figures from the collector's cache; reads no table."""
    now = time.time() if now is None else now
    if collector is None or not collector.running:
        return Figures("off", None, None)
    snapshot, status = collector.snapshot, collector.status
    if snapshot is None or status.last_success <= 0:
        return Figures("waiting", None, None)
    recent.note(status.last_success, snapshot)
    base = recent.baseline(status.last_success)
    before = None if base is None else base[1]
    stale = now - status.last_success > STALE_ROUNDS * collector.settings.interval
    return Figures(
        state="stale" if stale else "ok",
        collected_ago=max(0.0, now - status.last_success),
        span_seconds=None if base is None else status.last_success - base[0],
        queues=_queues(snapshot, before),
        scheduler_delay=quantiles(
            minus(snapshot.scheduler_delay, None if before is None else before.scheduler_delay)
        ),
        cancellation_latency=quantiles(
            minus(
                snapshot.cancellation_latency,
                None if before is None else before.cancellation_latency,
            )
        ),
    )


def _queues(now: Snapshot, then: Snapshot | None) -> dict[str, QueueFigures]:
    names = {queue for queue, _ in now.jobs} | set(now.queue_wait) | set(now.leases_expired)
    found: dict[str, QueueFigures] = {}
    for queue in sorted(names):
        execution = merged(
            minus(h, None if then is None else then.execution.get(key))
            for key, h in now.execution.items()
            if key[0] == queue
        )
        attempts: dict[str, int] = {}
        for (q, _type, outcome), n in now.attempts_finished.items():
            if q == queue:
                was = 0 if then is None else then.attempts_finished.get((q, _type, outcome), 0)
                attempts[outcome] = attempts.get(outcome, 0) + n - was
        per_success = now.attempts_per_success.get(queue)
        successes = None
        if per_success is not None:
            successes = minus(
                per_success, None if then is None else then.attempts_per_success.get(queue)
            )
        wait = now.queue_wait.get(queue)
        expired = now.leases_expired.get(queue, 0)
        found[queue] = QueueFigures(
            queue=queue,
            wait=quantiles(
                None
                if wait is None
                else minus(wait, None if then is None else then.queue_wait.get(queue))
            ),
            execution=quantiles(execution),
            attempts=attempts,
            attempts_per_success=(
                successes.sum / successes.count
                if successes is not None and successes.count > 0
                else None
            ),
            leases_expired=expired - (0 if then is None else then.leases_expired.get(queue, 0)),
        )
    return found
