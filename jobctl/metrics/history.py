"""The last hour, a minute at a time: what the overview's charts draw.

The collector already reads every attempt that ends, once, in its rounds; each one
it counts is also added here, to the minute it finished in (the attempt's own
``finished_at``, not the round that read it: a round that catches up after an
outage fills the minutes the outage covered, not a spike at its end). Per queue
label (so bounded as the metrics are, :mod:`jobctl.metrics.labels`) and per
minute: the jobs that ended (succeeded, failed or cancelled), the attempts that
raised (retried or failed), and a histogram of queue waits, from which a chart
takes the p95 (the same buckets as ``jobctl_queue_wait_seconds``).

Bounded whatever the traffic: at most ``span / resolution + 1`` minutes of at most
the queue bound (plus ``_other``) each, a fixed number of counts per entry. In
memory: history starts when ``jobctl serve`` does (the chart says so), and the
minutes between two rounds are known only once the later one has read them, so
the view says which span it covers.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Final

from hybrid_jobs.jobctl.metrics.histogram import WAIT_BUCKETS
from hybrid_jobs.schema.states import JobState

RESOLUTION: Final = 60.0
SPAN: Final = 3600.0

# The outcomes that end a job, and those of an attempt that raised.
ENDED: Final = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
RAISED: Final = frozenset({JobState.RETRY_WAIT, JobState.FAILED})


@dataclass
class _Minute:
    ended: int = 0
    raised: int = 0
    waits: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BUCKETS) + 1))


@dataclass(frozen=True)
class Slot:
    """One queue's minute: counts, and its queue waits per WAIT_BUCKETS bucket
    (not cumulative; the last one past the largest bound)."""

    ended: int
    raised: int
    waits: tuple[int, ...]


@dataclass(frozen=True)
class HistoryView:
    """What the history holds at the end of a round. ``starts`` are the minutes'
    starts (epoch seconds, database clock), oldest first; ``covered`` how many
    seconds of each minute the collector has read (0: none, before it started);
    ``queues`` each label's slots, aligned with ``starts`` (None: nothing ended)."""

    resolution: float
    span: float
    starts: tuple[float, ...] = ()
    covered: tuple[float, ...] = ()
    queues: Mapping[str, tuple[Slot | None, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    since: float | None = None
    """When collecting began (the first round's clock); None: not yet."""
    until: float | None = None
    """How far the history has been read."""

    @property
    def empty(self) -> bool:
        return self.until is None or self.since is None or self.until <= self.since


EMPTY: Final = HistoryView(RESOLUTION, SPAN)


class History:
    def __init__(self, span: float = SPAN, resolution: float = RESOLUTION) -> None:
        if resolution <= 0 or span < resolution:
            raise ValueError("a history needs a positive resolution and a span of one or more")
        self.span = span
        self.resolution = resolution
        self._minutes: dict[int, dict[str, _Minute]] = {}
        self.since: float | None = None
        self.until: float | None = None

    def _index(self, at: float) -> int:
        return math.floor(at / self.resolution)

    def add(self, queue: str, finished_at: datetime, outcome: str, wait_s: float | None) -> None:
        """One attempt, counted once (the collector's cursor sees to that)."""
        at = finished_at.timestamp()
        if self.until is not None and at < self.until - self.span - self.resolution:
            return  # a catch-up reaching back past what is kept
        minute = self._minutes.setdefault(self._index(at), {}).setdefault(queue, _Minute())
        if outcome in ENDED:
            minute.ended += 1
        if outcome in RAISED:
            minute.raised += 1
        if wait_s is not None:
            minute.waits[bisect_left(WAIT_BUCKETS, max(0.0, wait_s))] += 1

    def read_until(self, now: datetime, read_to: datetime) -> None:
        """A round has ended at ``now`` with every attempt up to ``read_to`` counted
        (the cursor's mark: ``now`` unless a catch-up stopped at its batch)."""
        if self.since is None:
            self.since = now.timestamp()
        self.until = max(self.until or 0.0, min(now, read_to).timestamp())
        oldest = self._index(self.until - self.span)
        for index in [i for i in self._minutes if i < oldest]:
            del self._minutes[index]

    def forget(self, queues: set[str]) -> None:
        """Labels the metrics forgot: their series are gone, and their slot may go
        to another queue."""
        for minute in self._minutes.values():
            for queue in queues:
                minute.pop(queue, None)

    def view(self) -> HistoryView:
        if self.since is None or self.until is None:
            return HistoryView(self.resolution, self.span)
        last = self._index(self.until)
        count = round(self.span / self.resolution)
        indexes = range(last - count + 1, last + 1)
        starts = tuple(i * self.resolution for i in indexes)
        covered = tuple(
            max(0.0, min(self.until, s + self.resolution) - max(self.since, s)) for s in starts
        )
        names = sorted({q for i in indexes for q in self._minutes.get(i, {})})
        queues: dict[str, tuple[Slot | None, ...]] = {}
        for name in names:
            slots: list[Slot | None] = []
            for i in indexes:
                m = self._minutes.get(i, {}).get(name)
                slots.append(None if m is None else Slot(m.ended, m.raised, tuple(m.waits)))
            queues[name] = tuple(slots)
        return HistoryView(
            self.resolution,
            self.span,
            starts,
            covered,
            MappingProxyType(queues),
            self.since,
            self.until,
        )
