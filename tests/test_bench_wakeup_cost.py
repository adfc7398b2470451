"""`python -m bench.wakeup_cost` end to end at a small size: each round trip was made
(the claims really claimed, or the bench raises) and timed at every gap. No timing is
asserted: benchmarks print figures, tests never judge them."""

from __future__ import annotations

from tests.support.bench import bench_json


def test_every_round_trip_is_timed_at_every_gap() -> None:
    data = bench_json("wakeup_cost", "--trips", "5", timeout=120)
    assert data["trips"] == 5
    for trip in ("select_1", "plain_claim", "publish_confirm"):
        assert list(data[trip]) == ["gap_0_ms", "gap_1_ms", "gap_5_ms", "gap_50_ms"]
        for figures in data[trip].values():
            assert 0 < figures["p50_us"] <= figures["p90_us"], (trip, figures)
