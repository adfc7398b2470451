"""The consumer's retry backoff: capped doubling, jitter within its spread, sane
settings only."""

from __future__ import annotations

from hybrid_jobs.consumers import Backoff
from hybrid_jobs.consumers.backoff import DEFAULT_BACKOFF


def test_backoff_schedule() -> None:
    assert [Backoff(jitter=0).raw(n) for n in range(1, 11)] == [
        5,
        10,
        20,
        40,
        80,
        160,
        320,
        640,
        900,
        900,
    ]
    for n in range(1, 12):
        assert 0.75 * DEFAULT_BACKOFF.raw(n) <= DEFAULT_BACKOFF.delay(n) <= 900
    assert Backoff(jitter=0).raw(10_000) == 900
