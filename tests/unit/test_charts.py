"""The overview's charts, pure: the collector's minute-by-minute history (bounded,
by finish time, with what it covers) and the geometry drawn from it (paths, axis
scaling, the states before any data, gaps, many queues, huge and zero values)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from hybrid_jobs.jobctl.dashboard.charts import (
    BOTTOM,
    HEIGHT,
    LEFT,
    MIN_COVERED,
    RIGHT,
    SHOWN_QUEUES,
    TOP,
    WIDTH,
    Chart,
    Series,
    build,
    chart,
    nice_ceiling,
    nice_span,
    rate,
    seconds,
)
from hybrid_jobs.jobctl.dashboard.charts import series as series_for
from hybrid_jobs.jobctl.dashboard.render import NONE
from hybrid_jobs.jobctl.metrics.history import EMPTY, History
from hybrid_jobs.jobctl.metrics.labels import OTHER

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def points(d: str) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in re.findall(r"([\d.]+),([\d.]+)", d)]


def history_of(minutes: int, per_minute: dict[str, int], *, start: float = 0) -> History:
    """``minutes`` whole minutes of steady traffic, read a minute at a time."""
    h = History()
    h.read_until(at(start), at(start))
    for m in range(minutes):
        for queue, n in per_minute.items():
            for k in range(n):
                h.add(queue, at(start + m + k / (n + 1)), "SUCCEEDED", 0.2)
        h.read_until(at(start + m + 1), at(start + m + 1))
    return h


# ------------------------------------------------------------------ the history


def test_attempts_land_in_the_minute_they_finished_in_not_the_round_that_read_them() -> None:
    h = History()
    h.read_until(at(0), at(0))
    # One round, late (the collector was away), reads attempts of three minutes.
    h.add("mail", at(0.5), "SUCCEEDED", 0.1)
    h.add("mail", at(1.5), "RETRY_WAIT", 0.1)
    h.add("mail", at(2.5), "FAILED", 40.0)
    h.add("mail", at(2.6), "CANCELLED", None)
    h.read_until(at(3), at(3))
    view = h.view()
    slots = view.queues["mail"]
    # The span ends with the minute being read; the three minutes are the last ones
    # before it, each with its own attempt.
    assert [s and (s.ended, s.raised) for s in slots[-4:-1]] == [(1, 0), (0, 1), (2, 1)]
    assert slots[-1] is None
    assert sum(slots[-2].waits) == 1 if slots[-2] else False  # a cancel had no wait
    assert view.covered[-4:-1] == (60.0, 60.0, 60.0) and view.covered[-5] == 0
    assert view.since == at(0).timestamp() and view.until == at(3).timestamp()


def test_the_history_keeps_one_span_and_no_more() -> None:
    h = history_of(150, {"mail": 2})
    view = h.view()
    assert len(view.starts) == 60
    # Minutes older than the span are dropped from memory, not just from the view.
    assert len(h._minutes) <= 61
    # A catch-up reaching back past the span adds nothing.
    h.add("mail", at(10), "SUCCEEDED", 1.0)
    assert min(h._minutes) > h._index(at(10).timestamp())


def test_a_catch_up_stopped_at_its_batch_covers_only_what_it_read() -> None:
    h = History()
    h.read_until(at(0), at(0))
    h.read_until(at(10), at(4))  # the round's clock says 10, its cursor reached 4
    assert h.view().until == at(4).timestamp()


def test_forgotten_labels_leave_the_history() -> None:
    h = history_of(3, {"mail": 1, "gone": 1})
    h.forget({"gone"})
    assert set(h.view().queues) == {"mail"}


# ------------------------------------------------------------------ scaling, labels


@pytest.mark.parametrize(
    ("value", "ceiling"),
    [
        (0, 1),
        (-3, 1),
        (float("nan"), 1),
        (0.3, 0.5),
        (1, 1),
        (1.01, 2),
        (2.2, 2.5),
        (37, 50),
        (2.5e-7, 2.5e-7),
        (9.2e12, 1e13),
    ],
)
def test_the_axis_ends_at_a_round_number_at_or_above_the_peak(value: float, ceiling: float) -> None:
    assert nice_ceiling(value) == pytest.approx(ceiling)


@pytest.mark.parametrize(
    ("value", "ceiling"),
    [
        (0, 1),
        (0.3, 0.5),
        (7, 10),
        (10, 10),
        (11, 20),
        (100, 120),
        (3357, 3600),
        (5000, 7200),
        (30_000, 86400),
        (200_000, 2.5 * 86400),
    ],
)
def test_a_time_axis_ends_at_a_span_people_count_in(value: float, ceiling: float) -> None:
    assert nice_span(value) == pytest.approx(ceiling)
    assert len(seconds(ceiling / 2)) <= 7  # its labels fit the margin: "2.50 s", "30 min"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (0.25, "0.25"),
        (3, "3"),
        (12.5, "12.5"),
        (940, "940"),
        (1200, "1.2k"),
        (3e6, "3M"),
        (2.5e10, "25G"),
    ],
)
def test_rates_read_short(value: float, text: str) -> None:
    assert rate(value) == text


def series(*values: float | None) -> Series:
    return Series(tuple(float(60 * i + 30) for i in range(len(values))), tuple(values))


def draw(s: Series, *, since: float | None = None) -> Chart:
    return chart(
        "ended",
        "Jobs ended",
        "/min",
        s,
        start=0,
        end=60.0 * len(s.values),
        since=since,
        label=rate,
        span_label="-1 h",
    )


def test_a_line_fills_the_plot_area_with_its_peak_below_the_top() -> None:
    c = draw(series(0, 10, 37, 5))
    (line,) = c.lines
    xs, ys = zip(*points(line), strict=True)
    assert min(xs) >= LEFT and max(xs) <= WIDTH - RIGHT
    assert max(ys) == HEIGHT - BOTTOM  # zero sits on the axis
    # 37 on an axis to 50: 74 % of the way up.
    assert min(ys) == pytest.approx(HEIGHT - BOTTOM - 0.74 * (HEIGHT - BOTTOM - TOP), abs=0.1)
    assert [t.label for t in c.y_ticks] == ["0", "25", "50"]
    assert (c.now, c.peak) == ("5", "37")
    assert c.areas[0].endswith("Z")


def test_huge_values_scale_the_axis_and_keep_their_labels_short() -> None:
    c = draw(series(2e9, 9.2e9, 0))
    assert [t.label for t in c.y_ticks] == ["0", "5G", "10G"]
    for x, y in points(c.lines[0]):
        assert TOP <= y <= HEIGHT - BOTTOM and LEFT <= x <= WIDTH - RIGHT


def test_all_zero_is_a_flat_line_on_the_axis_not_a_blank() -> None:
    c = draw(series(0, 0, 0))
    (line,) = c.lines
    assert {y for _, y in points(line)} == {HEIGHT - BOTTOM}
    assert [t.label for t in c.y_ticks] == ["0", "0.5", "1"]


def test_one_value_is_a_dot_and_a_gap_breaks_the_line() -> None:
    one = draw(series(None, None, 4))
    assert one.lines == () and len(one.dots) == 1
    gapped = draw(series(1, 2, None, None, 3, 4, None, 5))
    assert len(gapped.lines) == 2 and len(gapped.dots) == 1
    assert gapped.now == "5"


def test_nothing_known_draws_nothing_and_says_so() -> None:
    c = draw(series(None, None))
    assert c.lines == () and c.dots == () and c.now == NONE


# ------------------------------------------------------------------ the whole section


def test_no_collector_and_no_history_yet_are_their_own_states() -> None:
    assert build(None).state == "off"
    assert build(EMPTY).state == "collecting"
    h = History()
    h.read_until(at(0), at(0))
    assert build(h.view()).state == "collecting"  # one round: nothing covered
    h.read_until(at(0.1), at(0.1))
    assert build(h.view()).state == "collecting"  # 6 s: too little to draw a rate
    h.read_until(at(0.9), at(0.9))
    assert build(h.view()).state == "collecting"  # the minute being read is not drawn
    h.read_until(at(1), at(1))
    found = build(h.view())
    assert found.state == "ok" and found.rows == ()  # nothing ended: its own message


def test_the_point_being_read_is_not_drawn_and_a_short_first_one_neither() -> None:
    h = History()
    late = 1 - MIN_COVERED / 2
    h.read_until(at(late), at(late))  # started near the end of minute 0
    for m in range(3):
        h.add("mail", at(m + 0.9), "SUCCEEDED", 0.1)
    h.read_until(at(2.5), at(2.5))
    (row,) = build(h.view()).rows
    values = [v for v in series_of(h, "mail") if v is not None]
    # Minute 0 was read for less than MIN_COVERED of it, minute 2 is still open.
    assert values == [1.0]
    assert len(row.charts[0].dots) == 1


def series_of(h: History, queue: str) -> tuple[float | None, ...]:
    view = h.view()
    return series_for(view, view.queues[queue])[0].values


def test_a_restarted_collector_shades_what_it_did_not_see() -> None:
    found = build(history_of(20, {"mail": 3}, start=0).view())
    assert found.since == T0
    (row,) = found.rows
    ended = row.charts[0]
    assert ended.blank is not None and ended.blank[0] == LEFT
    # Nothing is drawn over the shaded part, and the 20 minutes seen are one line.
    (line,) = ended.lines
    assert min(x for x, _ in points(line)) > ended.blank[1]
    assert ended.now == "3"
    # The minutes before it started are unknown, not zero.
    assert row.charts[1].now == "0"  # seen, and none raised


def test_an_hour_of_history_has_no_shade() -> None:
    found = build(history_of(70, {"mail": 1}).view())
    assert found.since is None and found.rows[0].charts[0].blank is None


def test_many_queues_show_the_busiest_and_add_up_the_rest() -> None:
    traffic = {f"q{n:03d}": n for n in range(1, 121)}
    traffic[OTHER] = 5
    found = build(history_of(3, traffic).view())
    assert len(found.rows) == SHOWN_QUEUES + 1
    names = [r.queue for r in found.rows]
    assert names[:-1] == sorted(f"q{n:03d}" for n in range(113, 121))
    rest = found.rows[-1]
    assert rest.queue == OTHER and rest.queues == 120 - SHOWN_QUEUES + 1
    assert found.hidden == 120 - SHOWN_QUEUES
    assert rest.ended == 3 * (sum(range(1, 113)) + 5)


def test_one_queue_past_the_limit_keeps_its_name() -> None:
    traffic = {f"q{n}": 1 for n in range(SHOWN_QUEUES + 1)}
    found = build(history_of(2, traffic).view())
    assert OTHER not in [r.queue for r in found.rows]
    assert len(found.rows) == SHOWN_QUEUES + 1


def test_the_wait_p95_comes_from_the_minutes_waits() -> None:
    h = History()
    h.read_until(at(0), at(0))
    for k in range(100):
        h.add("mail", at(0.5), "SUCCEEDED", 0.07 if k < 90 else 20.0)
    h.read_until(at(1), at(1))
    (row,) = build(h.view()).rows
    wait = row.charts[2]
    assert len(wait.dots) == 1
    # p95 falls in the (10, 30] bucket: halfway through it by linear interpolation.
    assert wait.now == "20 s"
