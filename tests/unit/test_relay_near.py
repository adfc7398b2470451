"""When the relay asks its decision for the next tenants only, and how much of the
backlog across tenants it asks it to scan (relay/wake.py's _Seen)."""

from __future__ import annotations

from hybrid_jobs.relay.wake import (
    FULL_READ_SECONDS,
    NEAR_FROM_TENANTS,
    NEAR_SCAN_MIN,
    NEAR_SCAN_MOST,
    NEAR_SCAN_PER_ROOM,
    _Seen,
)


def test_a_queue_is_read_whole_until_a_read_found_many_tenants_and_again_each_second() -> None:
    seen = _Seen()
    assert seen.params(0.0)["near"] is False, "nothing known yet: every tenant"
    seen.read(100, NEAR_FROM_TENANTS - 1, near=False, at=0.0)
    assert seen.params(0.1)["near"] is False, "few tenants: reading them all costs little"
    seen.read(100, NEAR_FROM_TENANTS, near=False, at=0.2)
    params = seen.params(0.3)
    assert params["near"] is True
    assert params["scan"] == NEAR_SCAN_PER_ROOM * 100
    assert params["bulk"] >= NEAR_FROM_TENANTS, "a full read still sized by the tenants"
    # a second on, a full read again, which notes every tenant's reason
    assert seen.params(0.2 + FULL_READ_SECONDS)["near"] is False


def test_the_scan_grows_when_it_found_too_few_and_shrinks_when_it_found_enough() -> None:
    seen = _Seen()
    seen.read(50, 1000, near=False, at=0.0)
    assert seen.params(0.1)["scan"] == NEAR_SCAN_PER_ROOM * 50
    for expected in (2, 4, 8, 16, 32, 32):
        seen.params(0.1)
        seen.read(50, 1000, near=False, at=0.0)  # asked, and it read every tenant
        assert seen.per_room == min(NEAR_SCAN_MOST, expected * NEAR_SCAN_PER_ROOM)
    seen.params(0.1)
    seen.read(50, None, near=True, at=0.1)
    assert seen.per_room == NEAR_SCAN_MOST - 1
    for _ in range(100):
        seen.params(0.2)
        seen.read(50, None, near=True, at=0.2)
    assert seen.per_room == NEAR_SCAN_PER_ROOM
    seen.read(0, None, near=True, at=0.3)
    assert seen.params(0.3)["scan"] == NEAR_SCAN_MIN, "a room of nothing still scans some"
