"""The automatic prefetch: a consumer's concurrency, twice that after a streak of
short runs, back as soon as a run reaches SHORT_RUN, and doubled again no sooner
than REGROW_AFTER; a prefetch given is kept whatever runs."""

from __future__ import annotations

from hybrid_jobs.consumers.prefetch import (
    GROWTH,
    REGROW_AFTER,
    SHORT_RUN,
    SHORT_STREAK,
    Prefetch,
)


def streak(prefetch: Prefetch, runs: int) -> None:
    for _ in range(runs):
        prefetch.ran(SHORT_RUN / 10)


def test_short_runs_double_it_and_a_long_run_halves_it() -> None:
    changes: list[int] = []
    prefetch = Prefetch(10, 0, on_change=lambda: changes.append(prefetch.ids))
    assert prefetch.automatic and prefetch.ids == 10 and prefetch.most == GROWTH * 10
    streak(prefetch, SHORT_STREAK * 10 - 1)
    assert prefetch.ids == 10 and changes == [], "one short of the streak"
    streak(prefetch, 1)
    assert prefetch.ids == GROWTH * 10 and changes == [GROWTH * 10]
    streak(prefetch, 5)
    assert changes == [GROWTH * 10], "told once per change"
    prefetch.ran(SHORT_RUN)
    assert prefetch.ids == 10 and changes == [GROWTH * 10, 10]


def test_a_run_still_going_halves_it_too() -> None:
    changes: list[int] = []
    prefetch = Prefetch(4, 0, on_change=lambda: changes.append(prefetch.ids))
    streak(prefetch, SHORT_STREAK * 4)
    assert not prefetch.shed_due
    prefetch.running_long()
    assert prefetch.ids == 4 and changes == [8, 4]
    assert prefetch.shed_due, "what is held beyond the new room goes back"
    prefetch.shed_due = False
    prefetch.running_long()
    assert changes == [8, 4] and not prefetch.shed_due, "nothing to do while not doubled"


def test_it_doubles_again_only_after_a_while() -> None:
    prefetch = Prefetch(4, 0)
    streak(prefetch, SHORT_STREAK * 4)
    prefetch.running_long()
    streak(prefetch, 100 * SHORT_STREAK * 4)
    assert prefetch.ids == 4, "a mix of short and long jobs does not flip it"
    prefetch.halved_at -= REGROW_AFTER
    streak(prefetch, 1)
    assert prefetch.ids == 8


def test_a_prefetch_given_or_a_single_slot_is_kept() -> None:
    changes: list[int] = []
    given = Prefetch(10, 3, on_change=lambda: changes.append(given.ids))
    single = Prefetch(1, 0, on_change=lambda: changes.append(single.ids))
    for prefetch in (given, single):
        streak(prefetch, 1000)
        prefetch.ran(60.0)
        prefetch.running_long()
    assert (given.ids, single.ids) == (3, 1) and changes == []
    assert (given.most, single.most) == (3, 1)
    assert not given.automatic and not single.automatic
