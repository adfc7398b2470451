"""The overview's charts: per queue, over the last hour, jobs ended per minute,
attempts that raised per minute and the queue-wait p95, drawn on the server as
inline SVG (``_charts.html``), from the collector's history (jobctl.metrics.history):
a page load reads no table and computes a few hundred points.

Everything here is pure: a history view in, series and their geometry out (paths
in the SVG's pixel coordinates, axis ticks with their labels), so the shapes can be
tested without a browser. The page's CSP forbids inline styles; the SVG carries
only attributes, and its colours come from dashboard.css by class.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from hybrid_jobs.jobctl.dashboard.figures import quantile
from hybrid_jobs.jobctl.dashboard.render import NONE, duration
from hybrid_jobs.jobctl.metrics.histogram import WAIT_BUCKETS, Histogram
from hybrid_jobs.jobctl.metrics.history import HistoryView, Slot
from hybrid_jobs.jobctl.metrics.labels import OTHER

MINUS: Final = "\N{MINUS SIGN}"

# Queues with charts of their own, the busiest over the span; the rest share one row.
SHOWN_QUEUES: Final = 8
# A minute the collector has read less of than this share of is not drawn as a
# rate: two seconds of a minute say little about it (the first and the current).
MIN_COVERED: Final = 0.25

# The SVG's size in pixels and the plot area within it.
WIDTH: Final = 360
HEIGHT: Final = 104
LEFT: Final = 46
RIGHT: Final = 8
TOP: Final = 8
BOTTOM: Final = 18


@dataclass(frozen=True)
class Series:
    """Values aligned with ``at`` (each the middle of its minute, epoch seconds);
    None: unknown (not collected then, or no attempt to take a wait from)."""

    at: tuple[float, ...]
    values: tuple[float | None, ...]

    @property
    def known(self) -> list[float]:
        return [v for v in self.values if v is not None]

    @property
    def last(self) -> float | None:
        return next((v for v in reversed(self.values) if v is not None), None)

    @property
    def peak(self) -> float | None:
        known = self.known
        return max(known) if known else None


@dataclass(frozen=True)
class Tick:
    at: float  # pixels
    label: str


@dataclass(frozen=True)
class Chart:
    """One chart's geometry, ready for the template."""

    kind: str  # "ended", "raised" or "wait": the CSS class of its line
    title: str
    unit: str
    lines: tuple[str, ...]  # path data, one per run of known values
    areas: tuple[str, ...]  # the same runs closed down to zero
    dots: tuple[tuple[float, float], ...]  # runs of a single value
    y_ticks: tuple[Tick, ...]
    x_ticks: tuple[Tick, ...]
    blank: tuple[float, float] | None  # x from..to before collecting began
    now: str  # the latest point's value, as text
    peak: str
    summary: str  # for screen readers and the SVG's <title>
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM


@dataclass(frozen=True)
class QueueCharts:
    queue: str
    label: str
    queues: int  # how many queues the row adds up (1 but for the "others" row)
    ended: int  # jobs ended over the span
    charts: tuple[Chart, ...]


@dataclass(frozen=True)
class Charts:
    state: str
    """ok; collecting (no span read yet); off (no collector in this process)."""
    rows: tuple[QueueCharts, ...] = ()
    since: datetime | None = None
    """When the history starts, if within the span (jobctl serve started since)."""
    span: float = 0.0
    resolution: float = 0.0
    hidden: int = 0
    """Queues not shown on their own (added up in the last row)."""


# ------------------------------------------------------------------ numbers


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above ``value``
    (1 for nothing to show: a flat zero line sits at the bottom of a 0..1 axis)."""
    if not math.isfinite(value) or value <= 0:
        return 1.0
    power: float = 10.0 ** math.floor(math.log10(value))
    # With a tolerance: a value that is a step already may come out of a float
    # product a hair above it, and must not jump to the next step.
    return next(step * power for step in (1, 2, 2.5, 5, 10) if value <= step * power * (1 + 1e-9))


# An axis of time past ten seconds ends at a span people count in, whose half is
# one too: 30 s (15 s), 4 min (2 min), 30 min (15 min), 2 h (1 h).
_SPANS: Final = (
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
    240.0,
    600.0,
    1200.0,
    1800.0,
    3600.0,
    7200.0,
    4 * 3600.0,
    8 * 3600.0,
    24 * 3600.0,
)


def nice_span(value: float) -> float:
    """:func:`nice_ceiling` for seconds: round numbers below ten seconds, round
    spans of time above (a day's multiples past a day)."""
    if not math.isfinite(value) or value <= 10:
        return nice_ceiling(value)
    found = next((span for span in _SPANS if value <= span * (1 + 1e-9)), None)
    return found if found is not None else 86400.0 * nice_ceiling(value / 86400.0)


def rate(value: float) -> str:
    """A per-minute figure in few characters: 0, 0.4, 12, 940, 1.25k, 3.5M."""
    unit = ""
    for limit, name in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            value, unit = value / limit, name
            break
    # Two decimals below 10 (an axis's middle may be 1.25k), one below 100.
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    text = f"{value:.{digits}f}"
    if digits:
        text = text.rstrip("0").rstrip(".")
    return text + unit


def seconds(value: float) -> str:
    return "0" if value == 0 else duration(value)


# ------------------------------------------------------------------ series


def _merge(slots: Iterable[Slot | None]) -> Slot | None:
    found = [s for s in slots if s is not None]
    if not found:
        return None
    return Slot(
        sum(s.ended for s in found),
        sum(s.raised for s in found),
        tuple(sum(col) for col in zip(*(s.waits for s in found), strict=True)),
    )


def _p95(waits: tuple[int, ...]) -> float | None:
    # Estimated from the buckets as the latency table's are (a value past the last
    # bound shows as that bound).
    h = Histogram(WAIT_BUCKETS)
    h.counts = list(waits)
    value, _past = quantile(h.frozen(), 0.95)
    return value


def _drawn(view: HistoryView, start: float, covered: float) -> bool:
    """Whether a point says something: read long enough, and over. The point being
    read now is left out: its attempts are still ending (and some of those that
    ended are not committed yet), so it would always dip at the end of a chart."""
    closed = view.until is not None and start + view.resolution <= view.until
    return closed and covered >= MIN_COVERED * view.resolution


def series(view: HistoryView, slots: Sequence[Slot | None]) -> tuple[Series, Series, Series]:
    """Jobs ended per minute, attempts raised per minute, queue-wait p95, of one
    queue's (or several merged) slots."""
    at = tuple(start + view.resolution / 2 for start in view.starts)
    ended: list[float | None] = []
    raised: list[float | None] = []
    wait: list[float | None] = []
    for start, slot, covered in zip(view.starts, slots, view.covered, strict=True):
        if not _drawn(view, start, covered):
            ended.append(None)
            raised.append(None)
            wait.append(None)
            continue
        per_minute = 60.0 / covered
        ended.append(0.0 if slot is None else slot.ended * per_minute)
        raised.append(0.0 if slot is None else slot.raised * per_minute)
        wait.append(None if slot is None else _p95(slot.waits))
    return Series(at, tuple(ended)), Series(at, tuple(raised)), Series(at, tuple(wait))


# ------------------------------------------------------------------ geometry


def _runs(s: Series) -> list[list[tuple[float, float]]]:
    runs: list[list[tuple[float, float]]] = [[]]
    for at, value in zip(s.at, s.values, strict=True):
        if value is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((at, value))
    return [r for r in runs if r]


def _f(x: float) -> str:
    return f"{x:.1f}".removesuffix(".0")


def chart(
    kind: str,
    title: str,
    unit: str,
    s: Series,
    *,
    start: float,
    end: float,
    since: float | None,
    label: Callable[[float], str],
    span_label: str,
    ceiling: Callable[[float], float] = nice_ceiling,
) -> Chart:
    """The geometry of one series over [start, end] (epoch seconds)."""
    left, right, top, bottom = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    top_value = ceiling(s.peak or 0.0)
    width = max(end - start, 1e-9)

    def x(at: float) -> float:
        return left + (right - left) * min(1.0, max(0.0, (at - start) / width))

    def y(value: float) -> float:
        return bottom - (bottom - top) * min(1.0, max(0.0, value / top_value))

    lines: list[str] = []
    areas: list[str] = []
    dots: list[tuple[float, float]] = []
    for run in _runs(s):
        points = [(x(at), y(v)) for at, v in run]
        if len(points) == 1:
            dots.append((round(points[0][0], 1), round(points[0][1], 1)))
            continue
        line = "M" + " L".join(f"{_f(px)},{_f(py)}" for px, py in points)
        lines.append(line)
        areas.append(f"{line} L{_f(points[-1][0])},{bottom} L{_f(points[0][0])},{bottom} Z")
    y_ticks = tuple(Tick(round(y(v), 1), label(v)) for v in (0.0, top_value / 2, top_value))
    x_ticks = (
        Tick(left, span_label),
        Tick((left + right) / 2, MINUS + duration((end - start) / 2)),
        Tick(right, "now"),
    )
    blank = None
    if since is not None and since > start:
        blank = (left, round(x(since), 1))
    now, peak = s.last, s.peak
    now_text = NONE if now is None else label(now)
    peak_text = NONE if peak is None else label(peak)
    return Chart(
        kind=kind,
        title=title,
        unit=unit,
        lines=tuple(lines),
        areas=tuple(areas),
        dots=tuple(dots),
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        blank=blank,
        now=now_text,
        peak=peak_text,
        summary=f"{title}: {now_text}{unit} latest, peak {peak_text}{unit}",
    )


def build(view: HistoryView | None, *, shown: int = SHOWN_QUEUES) -> Charts:
    """Every row of charts for a history view (None: no collector)."""
    if view is None:
        return Charts("off")
    if (
        view.empty
        or view.until is None
        or view.since is None
        or not any(_drawn(view, s, c) for s, c in zip(view.starts, view.covered, strict=True))
    ):
        return Charts("collecting", span=view.span, resolution=view.resolution)
    totals = {q: sum(s.ended for s in slots if s) for q, slots in view.queues.items()}
    # The busiest have rows of their own, in name order (rows do not jump about
    # between refreshes as their ranks swap); the rest, with the metrics' own
    # _other, add up in one row.
    own = sorted((q for q in totals if q != OTHER), key=lambda q: (-totals[q], q))
    if len(own) == shown + 1 and OTHER not in totals:
        shown += 1  # a row of "1 other queue" would say less than the queue's name
    picked = sorted(own[:shown])
    rest = [q for q in view.queues if q not in picked]
    groups = [(q, q, [q]) for q in picked]
    hidden = len([q for q in rest if q != OTHER])
    if rest:
        groups.append((OTHER, "other queues", rest))
    end = view.until
    start = end - view.span
    since = view.since if view.since > start else None
    span_label = MINUS + duration(view.span)

    def make(
        kind: str,
        title: str,
        unit: str,
        s: Series,
        label: Callable[[float], str],
        ceiling: Callable[[float], float] = nice_ceiling,
    ) -> Chart:
        return chart(
            kind,
            title,
            unit,
            s,
            start=start,
            end=end,
            since=since,
            label=label,
            span_label=span_label,
            ceiling=ceiling,
        )

    rows: list[QueueCharts] = []
    for key, name, members in groups:
        slots = [_merge(view.queues[m][i] for m in members) for i in range(len(view.starts))]
        ended, raised, wait = series(view, slots)
        rows.append(
            QueueCharts(
                queue=key,
                label=name,
                queues=len(members),
                ended=sum(totals[m] for m in members),
                charts=(
                    make("ended", "Jobs ended", "/min", ended, rate),
                    make("raised", "Failures", "/min", raised, rate),
                    make("wait", "Queue wait p95", "", wait, seconds, nice_span),
                ),
            )
        )
    return Charts(
        "ok",
        tuple(rows),
        since=None if since is None else datetime.fromtimestamp(since, UTC),
        span=view.span,
        resolution=view.resolution,
        hidden=hidden,
    )
