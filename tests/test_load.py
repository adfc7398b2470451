"""Four producers enqueueing as fast as they can while the consumers drain: no
deadlock or serialization failure reaches a producer or a worker loop, and
everything enqueued completes once. The figures come from `python -m bench.load`."""

from __future__ import annotations

import pytest

from bench.load import run


@pytest.mark.timeout(400)
def test_four_producers_at_full_speed_while_consumers_drain() -> None:
    report = run(producers=4, seconds=8, consumers=2, concurrency=50)
    assert report["enqueued"] > 500
    assert report["producer_errors"] == {}
    assert report["error_events"] == {}
    assert report["deadlock_or_serialization_mentions"] == 0
    assert report["states"] == {"SUCCEEDED": report["enqueued"]}
