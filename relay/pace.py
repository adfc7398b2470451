"""The automatic window's slack: room for what the consumers take while a decision
runs.

The automatic window is twice the capacity of a queue's live consumers: what their
slots hold and as much again waiting in their prefetch. That is enough while the
relay's decision is quick. With thousands of tenants a decision reads every tenant
with a backlog and takes tens of milliseconds, and the wake-ups the pass before sent
are still in flight when the next one looks: each pass found room for about half the
window, the consumers ran dry between passes, and 10,000 capped tenants drained at
0.46 of a plain drain (0.79 with the window doubled by hand).

So the relay adds, per queue, twice what the consumers take during one decision:
its send rate times the decision's duration, both smoothed over the last passes,
and never more than a batch. A quick decision adds a few wake-ups; a window given
with ``--window`` gets none. The cost is the window's: more wake-ups already
decided, in flight, when a more urgent job arrives.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

Pool = AsyncConnectionPool[AsyncConnection]

# The weight of the latest figure in the smoothed ones.
SMOOTHING = 0.3
# The send rate is measured over spans at least this long: a pass that finds no
# room, a few milliseconds after one that filled it, says nothing of the rate.
RATE_SPAN = 0.2


@dataclass
class Pace:
    """One queue's passes, smoothed: how long a decision that reads the backlog
    takes, and how many wake-ups a second the passes send."""

    decision: float = 0.0
    rate: float = 0.0
    # the span the rate is being measured over: its start, and what was sent in it
    since: float | None = None
    sent: int = 0

    def slack(self, most: int) -> int:
        """The wake-ups to add to the automatic window: twice what the consumers
        take during one decision, at most ``most``."""
        return max(0, min(most, round(2 * self.rate * self.decision)))

    def passed(self, at: float, sent: int, decided: float | None) -> None:
        """Note a pass that ended at ``at`` (time.monotonic) and sent ``sent``
        wake-ups; ``decided``: how long its decision took, when it read the
        backlog (None: it found too little room to look)."""
        if decided is not None:
            self.decision += SMOOTHING * (decided - self.decision)
        if self.since is None:
            self.since, self.sent = at, 0
        self.sent += sent
        span = at - self.since
        if span >= RATE_SPAN:
            self.rate += SMOOTHING * (self.sent / span - self.rate)
            self.since, self.sent = at, 0


_paces: weakref.WeakKeyDictionary[Pool, dict[str, Pace]] = weakref.WeakKeyDictionary()


def pace(pool: Pool, queue: str) -> Pace:
    """The pace of ``queue``'s passes through ``pool``."""
    return _paces.setdefault(pool, {}).setdefault(queue, Pace())
