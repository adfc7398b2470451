"""The dashboard's pure parts: percentiles from histogram buckets and their window,
CSRF tokens and what a session remembers of the token, where a redirect may lead,
how spans read."""

from __future__ import annotations

import math

import pytest

from hybrid_jobs.jobctl.dashboard.auth import csrf_for, local_path, token_digest
from hybrid_jobs.jobctl.dashboard.figures import Recent, merged, minus, quantile, quantiles
from hybrid_jobs.jobctl.dashboard.render import duration, progress
from hybrid_jobs.jobctl.metrics.histogram import Histogram

TOKEN = "a-token-of-some-length"


def histogram(*values: float, bounds: tuple[float, ...] = (0.1, 1, 10)) -> Histogram:
    h = Histogram(bounds)
    for v in values:
        h.observe(v)
    return h


def test_quantiles_interpolate_within_a_bucket_as_prometheus_does() -> None:
    # 10 observations in (0.1, 1]: the median lies halfway through that bucket.
    h = histogram(*[0.5] * 10).frozen()
    value, past = quantile(h, 0.5)
    assert value == pytest.approx(0.55) and not past
    # Half below 0.1, half in (1, 10]: p95 is 90 % of the way through the latter.
    h = histogram(*[0.05] * 10, *[5] * 10).frozen()
    assert quantile(h, 0.95)[0] == pytest.approx(1 + 9 * 0.9)
    assert quantile(h, 0.25)[0] == pytest.approx(0.05)


def test_a_quantile_past_the_last_bucket_is_a_lower_bound() -> None:
    q = quantiles(histogram(0.5, 0.5, 50, 50).frozen())
    assert q.count == 4 and q.p50 == pytest.approx(1.0) and q.p99 == 10
    assert q.above == {"p95", "p99"}
    assert q.mean == pytest.approx(101 / 4)


def test_no_observations_no_figures() -> None:
    assert quantiles(histogram().frozen()).count == 0
    assert quantiles(None).p50 is None


def test_the_window_is_the_difference_of_two_snapshots() -> None:
    h = histogram(5, 5, 5)
    before = h.frozen()
    for _ in range(4):
        h.observe(0.05)
    since = minus(h.frozen(), before)
    assert since.count == 4 and since.sum == pytest.approx(0.2)
    assert quantile(since, 0.99)[0] <= 0.1
    both = merged([since, before])
    assert both is not None and both.count == 7
    assert merged([]) is None


def test_recent_keeps_one_snapshot_older_than_the_window_as_baseline() -> None:
    recent = Recent(window=60)
    snapshots = [object() for _ in range(5)]
    for at, snapshot in zip((0, 20, 40, 70, 100), snapshots, strict=True):
        recent.note(at, snapshot)  # type: ignore[arg-type]
    base = recent.baseline(100)
    assert base is not None and base[0] == 40, "the newest at least 60 s older than 100"
    recent.note(100, snapshots[-1])  # type: ignore[arg-type]
    assert recent.baseline(100) == base, "the same snapshot again adds nothing"
    assert Recent().baseline(0) is None


def test_a_csrf_token_belongs_to_its_session_and_a_session_to_its_token() -> None:
    # (Sessions themselves live in the database: tests/test_dashboard.py signs in
    # and out.) The CSRF token is derived from the session's secret alone.
    assert csrf_for("secret-one") == csrf_for("secret-one")
    assert csrf_for("secret-one") != csrf_for("secret-two")
    assert "secret-one" not in csrf_for("secret-one")
    # A session remembers a digest of its token, never the token: a new token ends it.
    assert token_digest(TOKEN) == token_digest(TOKEN) != token_digest(TOKEN + "x")
    assert TOKEN not in token_digest(TOKEN)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/jobs?state=FAILED", "/jobs?state=FAILED"),
        ("/", "/"),
        ("https://evil.example/", "/"),
        ("//evil.example/x", "/"),
        ("/\\evil.example", "/"),
        ("javascript:alert(1)", "/"),
        ("", "/"),
        (None, "/"),
    ],
)
def test_redirects_stay_on_this_server(target: str | None, expected: str) -> None:
    assert local_path(target) == expected


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "\N{EN DASH}"),
        (math.nan, "\N{EN DASH}"),
        (0.0004, "400 µs"),
        (0.012, "12 ms"),
        (2, "2 s"),
        (2.345, "2.35 s"),
        (42.25, "42.2 s"),
        (60, "1 min"),
        (310, "5 min 10 s"),
        (7500, "2 h 5 min"),
        (3 * 86400 + 4 * 3600, "3 d 4 h"),
        (-5, "-5 s"),
    ],
)
def test_spans_read_as_people_say_them(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


def test_progress_becomes_a_bar_only_when_it_is_done_of_total() -> None:
    assert progress({"done": 3, "total": 12, "stage": "x"}) == {
        "done": 3,
        "total": 12,
        "share": 0.25,
        "stage": "x",
    }
    for other in ({"done": 3}, {"done": True, "total": 2}, {"done": 1, "total": 0}, [1, 2], 7):
        assert progress(other) is None
