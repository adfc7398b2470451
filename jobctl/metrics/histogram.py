"""Cumulative histograms kept by the collector, and the buckets of each metric.

prometheus-client's own ``Histogram`` observes as events happen in the process; the
collector learns of events from the tables, one round at a time, and exports what it
has accumulated through a custom collector, so it keeps its counts here and hands
out frozen copies for the exposition.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import Final

# Queue wait runs from a wake-up's round trip to a backlog of an hour and more.
WAIT_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
EXECUTION_BUCKETS: Final = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1800,
    3600,
)
ATTEMPT_BUCKETS: Final = (1, 2, 3, 4, 5, 7, 10)
# Scheduler delay and cancellation latency: usually a poll interval or a heartbeat,
# an hour when a relay or a worker was away.
LATENCY_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


@dataclass(frozen=True)
class FrozenHistogram:
    """What the exposition needs: cumulative (le, count) pairs ending with +Inf."""

    buckets: tuple[tuple[str, float], ...]
    sum: float

    @property
    def count(self) -> float:
        return self.buckets[-1][1]


class Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # Prometheus buckets are inclusive (value <= le); a negative value can only
        # come from clock rounding and counts as zero.
        value = max(0.0, value)
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def frozen(self) -> FrozenHistogram:
        cumulative: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            cumulative.append((_le(bound), float(running)))
        return FrozenHistogram(tuple(cumulative), self.sum)


def _le(bound: float) -> str:
    # As Prometheus clients write bucket bounds: 1.0, 0.05, +Inf.
    return "+Inf" if math.isinf(bound) else repr(float(bound))
