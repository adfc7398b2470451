"""How many job ids a consumer holds beyond its free slots.

``--prefetch N`` holds N. Left at 0, a consumer holds as many as its concurrency, and
twice that once its jobs prove short. A claim takes the ids of the message that
woke it, and the relay packs at most half the smallest prefetch of a queue's
consumers into a message (WORKER_PACK_LIMIT), so the prefetch sets how many jobs each
claim and each outcome statement carries, and their fixed costs are paid per that
many. Twice the ids drained 20,000 no-op jobs a third faster (``python -m bench.drain
--no-baseline``: 8,405 against 6,350 jobs/s at 50 slots; 3,620 against 2,060 at 10),
and the start at 200 jobs/s did not move.

Ids held here wait while every slot is busy, though another consumer may have a free
one. For short jobs that wait is short; for long ones it is what a large prefetch
costs. So a consumer doubles its prefetch only after ``SHORT_STREAK`` times its
concurrency of runs in a row, each shorter than ``SHORT_RUN``, and any longer run
brings it back at once. The workers table says the current figure, for the relay's
packing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

# A run this short keeps the prefetch doubled: the ids it holds wait at most about
# two such runs for a slot.
SHORT_RUN: Final = 0.05
# How many of the consumer's concurrency of short runs in a row double it.
SHORT_STREAK: Final = 2
GROWTH: Final = 2


class Prefetch:
    def __init__(
        self, concurrency: int, fixed: int, on_change: Callable[[], None] = lambda: None
    ) -> None:
        """``fixed``: the ``--prefetch`` given (0: automatic); ``on_change`` is
        called when the figure changes (the workers row should say it)."""
        self.concurrency = concurrency
        self.fixed = fixed
        self.on_change = on_change
        self.short_runs = 0

    @property
    def automatic(self) -> bool:
        return self.fixed == 0

    @property
    def ids(self) -> int:
        if not self.automatic:
            return self.fixed
        if self.short_runs >= SHORT_STREAK * self.concurrency:
            return GROWTH * self.concurrency
        return self.concurrency

    def ran(self, seconds: float) -> None:
        """A handler ran this long."""
        if not self.automatic:
            return
        before = self.ids
        self.short_runs = self.short_runs + 1 if seconds < SHORT_RUN else 0
        if self.ids != before:
            self.on_change()
