"""`python -m bench.latency` end to end at a small size: it splits this project's start
and the floor's into the same hops, every job of both measured at every hop. No
timing is judged (benchmarks print figures; tests never judge them), only that the
figures are there and consistent."""

from __future__ import annotations

from tests.support.bench import bench_json

HOPS = [
    "commit_to_notified",
    "notified_to_sent",
    "sent_to_delivered",
    "delivered_to_claimed",
    "claimed_to_started",
    "commit_to_started",
    "notified_to_decided",
    "decided_to_sent",
    "delivered_to_claiming",
    "claiming_to_claimed",
]


def test_ours_and_the_floor_are_split_into_the_same_hops() -> None:
    data = bench_json("latency", "--rate", "40", "--seconds", "1.5")
    for who in ("ours", "floor"):
        figures = data[who]
        assert figures["jobs"] == 60, (who, figures)
        for hop in HOPS:
            p = figures[hop]
            assert p is not None, (who, hop)
            assert p["p50_ms"] <= p["p95_ms"] <= p["p99_ms"], (who, hop, p)
        # the whole start is positive, and no shorter than the claim within it
        total = figures["commit_to_started"]
        assert 0 < figures["delivered_to_claimed"]["p50_ms"] < total["p99_ms"], (who, figures)
        # the claim statement takes time, and comes within the delivery's claim
        claim = figures["claiming_to_claimed"]
        assert 0 < claim["p50_ms"] <= figures["delivered_to_claimed"]["p99_ms"], (who, figures)
        cpu = figures["cpu_ms_per_job"]
        assert cpu["relay"] >= 0 and cpu["consumers"] >= 0 and cpu["relay"] + cpu["consumers"] > 0
    ratio = data["ours_over_floor"]["commit_to_started"]["p50_ms"]
    assert ratio == round(
        data["ours"]["commit_to_started"]["p50_ms"] / data["floor"]["commit_to_started"]["p50_ms"],
        2,
    )


def test_the_full_runs_jobs_are_split_with_their_gates_and_retention_on() -> None:
    # The full run at a small size: tenants, keys, a rate limit and the relay's
    # retention; every job measured at every hop.
    data = bench_json(
        "latency", "--full", "--only", "ours", "--history", "200", "--rate", "40", "--seconds", "2"
    )
    assert data["full"] is True and data["history"] == 200
    figures = data["ours"]
    assert figures["jobs"] == 80, figures
    for hop in HOPS:
        assert figures[hop] is not None, hop
