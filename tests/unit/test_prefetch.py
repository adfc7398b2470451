"""The automatic prefetch: a consumer's concurrency, twice that after a streak of
short runs, back at once after a long one; a prefetch given is kept whatever runs."""

from __future__ import annotations

from hybrid_jobs.consumers.prefetch import GROWTH, SHORT_RUN, SHORT_STREAK, Prefetch


def test_short_runs_double_it_and_one_long_run_brings_it_back() -> None:
    changes: list[int] = []
    prefetch = Prefetch(10, 0, on_change=lambda: changes.append(prefetch.ids))
    assert prefetch.ids == 10
    for _ in range(SHORT_STREAK * 10 - 1):
        prefetch.ran(0.001)
    assert prefetch.ids == 10 and changes == [], "one short of the streak"
    prefetch.ran(0.001)
    assert prefetch.ids == GROWTH * 10 and changes == [GROWTH * 10]
    prefetch.ran(0.001)
    assert changes == [GROWTH * 10], "told once per change"
    prefetch.ran(SHORT_RUN)
    assert prefetch.ids == 10 and changes == [GROWTH * 10, 10]
    for _ in range(SHORT_STREAK * 10 - 1):
        prefetch.ran(0.0)
    assert prefetch.ids == 10, "the streak starts again after a long run"


def test_a_prefetch_given_is_kept() -> None:
    changes: list[int] = []
    prefetch = Prefetch(10, 3, on_change=lambda: changes.append(prefetch.ids))
    for _ in range(1000):
        prefetch.ran(0.0)
    prefetch.ran(60.0)
    assert prefetch.ids == 3 and not prefetch.automatic and changes == []
