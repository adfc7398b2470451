"""How long a failed job waits before its next attempt."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with jitter.

    The delay after the n-th attempt (n = attempts made so far, so the first retry
    uses n = 1) is ``min(cap, base * 2**(n-1))``, then spread by ``jitter`` (a
    fraction either way) so jobs that failed together do not all return in the same
    second, and capped again. With the defaults (5 s base, 15 min cap) the delays
    before jitter are 5, 10, 20, 40, 80, 160, 320, 640, then 900 seconds.
    """

    base: float = 5.0
    cap: float = 900.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0 or not 0 <= self.jitter <= 1:
            raise ValueError("Backoff needs base >= 0, cap >= 0 and 0 <= jitter <= 1")

    def raw(self, attempts_made: int) -> float:
        exponent = min(max(attempts_made, 1) - 1, 64)
        return min(self.cap, self.base * 2.0**exponent)

    def delay(self, attempts_made: int) -> float:
        spread = random.uniform(1 - self.jitter, 1 + self.jitter)
        return min(self.cap, self.raw(attempts_made) * spread)


DEFAULT_BACKOFF = Backoff()
