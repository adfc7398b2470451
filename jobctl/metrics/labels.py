"""A bound on a label's values: queue names and job types are whatever producers
write, and each value costs a dozen series or more (one per state, outcome and
histogram bucket), so a producer that invents names must not be able to grow a
Prometheus server without limit.

The first ``limit`` values seen keep a series of their own; values past that share
the series of :data:`OTHER`, whose counters and histograms add them up and whose
gauges sum (counts) or take the largest (ages). A value not seen for ``forget_after``
seconds (no job waiting, running or finishing in it, no consumer serving it, no
pause) is forgotten: its series go, and its slot is free for the next value seen,
in name order (a queue counted under OTHER until then gets a series of its own from
then on; what it added to OTHER stays there).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Final

# Not a valid queue name (they start with a letter or digit), so it cannot collide
# with one; a job type could be spelled so, and would share its series.
OTHER: Final = "_other"


class LabelBudget:
    def __init__(self, limit: int, forget_after: timedelta) -> None:
        if limit < 1:
            raise ValueError("a label budget needs at least one slot")
        self.limit = limit
        self.forget_after = forget_after
        # Values with a series of their own (OTHER too, once used), when last seen.
        self._seen: dict[str, datetime] = {}

    def label(self, value: str, now: datetime) -> str:
        """The label ``value`` is counted under now (itself, or OTHER), marking it seen."""
        own = len(self._seen) - (OTHER in self._seen)
        found = value if value in self._seen or own < self.limit else OTHER
        self._seen[found] = now
        return found

    def forget(self, now: datetime, keep: Collection[str] = ()) -> list[str]:
        """The labels not seen for ``forget_after`` (and not in ``keep``), now forgotten."""
        horizon = now - self.forget_after
        gone = [v for v, at in self._seen.items() if at < horizon and v not in keep]
        for value in gone:
            del self._seen[value]
        return gone

    @property
    def labels(self) -> frozenset[str]:
        return frozenset(self._seen)
