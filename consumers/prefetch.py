"""How many job ids a consumer holds beyond its free slots.

``--prefetch N`` holds N. Left at 0, a consumer holds as many as its concurrency, and
twice that while its jobs prove short. A claim takes the ids of the message that
woke it, and the relay packs at most half the smallest prefetch of a queue's
consumers into a message (WORKER_PACK_LIMIT), so the prefetch sets how many jobs each
claim and each outcome statement carries, and their fixed costs are paid per that
many. Measured (``python -m bench.drain --no-baseline``, 20,000 no-op jobs, alternated
with a prefetch fixed at the concurrency): 7,400 against 6,358 jobs/s at 50 slots,
about 3,300 against 2,050 at the default 10, the start at 200 jobs/s unmoved.

Ids held here wait while every slot is busy, though another consumer may have a free
one: for short jobs a short wait, for long ones what a large prefetch costs. So the
prefetch doubles only after ``SHORT_STREAK`` times the concurrency of runs in a row
each shorter than ``SHORT_RUN``, and halves again as soon as a run reaches that long,
whether it ended or still runs (the worker looks every ``SHORT_RUN``); the ids then
held beyond the room go back to the outbox's backlog, for other consumers. After
that it doubles again no sooner than ``REGROW_AFTER``, so a mix of short and long
jobs does not flip it at every long one. With one slot, doubling would change
neither the messages nor RabbitMQ's window, so it stays. A weighed job's run counts
as a long one: a message of twice the ids of weighed jobs would mostly find no room
to start them (every job of weight 2 drained at 0.51 of plain with it doubled,
against 0.64 to 0.71).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Final

# A run this short keeps the prefetch doubled.
SHORT_RUN: Final = 0.05
# How many times the concurrency of short runs in a row double it.
SHORT_STREAK: Final = 2
GROWTH: Final = 2
# Doubled again no sooner than this after it halved.
REGROW_AFTER: Final = 10.0


class Prefetch:
    def __init__(
        self, concurrency: int, fixed: int, on_change: Callable[[], None] = lambda: None
    ) -> None:
        """``fixed``: the ``--prefetch`` given (0: follow the jobs); ``on_change``
        is called when the figure changes (the workers row should say it, and ids
        held beyond the new room go back)."""
        self.concurrency = concurrency
        self.fixed = fixed
        self.on_change = on_change
        self.short_runs = 0
        self.doubled = False
        self.halved_at = -math.inf
        # Halved since the worker last gave back what it held beyond the new room.
        self.shed_due = False

    @property
    def automatic(self) -> bool:
        return self.fixed == 0 and self.concurrency > 1

    @property
    def most(self) -> int:
        """The largest figure it takes."""
        return GROWTH * self.concurrency if self.automatic else self.ids

    @property
    def ids(self) -> int:
        if self.fixed:
            return self.fixed
        return GROWTH * self.concurrency if self.doubled else self.concurrency

    def ran(self, seconds: float) -> None:
        """A handler returned or raised after running this long (a run the worker
        stopped says nothing of how long the job takes)."""
        if not self.automatic:
            return
        if seconds >= SHORT_RUN:
            self.running_long()
            return
        self.short_runs += 1
        if (
            not self.doubled
            and self.short_runs >= SHORT_STREAK * self.concurrency
            and time.monotonic() - self.halved_at >= REGROW_AFTER
        ):
            self.doubled = True
            self.on_change()

    def running_long(self) -> None:
        """A run reached SHORT_RUN: back to the concurrency, and the streak starts
        again."""
        self.short_runs = 0
        if self.doubled:
            self.doubled = False
            self.halved_at = time.monotonic()
            self.shed_due = True
            self.on_change()
