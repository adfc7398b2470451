"""When the relay asks its decision for the next tenants only, and how much of the
backlog across tenants it asks it to scan (relay/wake.py's _Seen)."""

from __future__ import annotations

from hybrid_jobs.relay.wake import (
    FULL_READ_SECONDS,
    NEAR_FROM_TENANTS,
    NEAR_REST_SECONDS,
    NEAR_SCAN_MIN,
    NEAR_SCAN_MOST_PER_ROOM,
    NEAR_SCAN_PER_ROOM,
    NEAR_SCAN_TENANTS,
    _Seen,
)


def test_a_queue_is_read_whole_until_a_read_found_many_tenants_and_again_each_second() -> None:
    seen = _Seen()
    assert seen.params(0.0)["near"] is False, "nothing known yet: every tenant"
    seen.read(100, NEAR_FROM_TENANTS - 1, near=None, at=0.0)
    assert seen.params(0.1)["near"] is False, "few tenants: reading them all costs little"
    seen.read(100, 1000, near=None, at=0.2)
    params = seen.params(0.3)
    assert params["near"] is True
    assert params["scan"] == NEAR_SCAN_PER_ROOM * 100
    assert params["bulk"] >= 1000, "a full read still sized by the tenants"
    # a second on, a full read again, which notes every tenant's reason
    assert seen.params(0.2 + FULL_READ_SECONDS)["near"] is False


def test_the_scan_grows_when_it_found_too_few_and_shrinks_when_it_found_enough() -> None:
    seen = _Seen()
    seen.read(50, 10_000, near=None, at=0.0)
    assert seen.params(0.1)["scan"] == NEAR_SCAN_PER_ROOM * 50
    per_room = NEAR_SCAN_PER_ROOM
    while per_room < NEAR_SCAN_MOST_PER_ROOM:
        seen.read(50, 10_000, near=False, at=0.1)  # tried, too few: it read every tenant
        per_room = min(NEAR_SCAN_MOST_PER_ROOM, 2 * per_room)
        assert seen.per_room == per_room
        assert seen.params(0.2) == {"bulk": 40_000, "near": True, "scan": per_room * 50}
    for _ in range(100):
        seen.read(50, None, near=True, at=0.2)
    assert seen.per_room == NEAR_SCAN_PER_ROOM
    seen.read(0, None, near=True, at=0.3)
    assert seen.params(0.3)["scan"] == NEAR_SCAN_MIN, "a room of nothing still scans some"


def test_a_pass_that_did_not_try_changes_nothing() -> None:
    """A pass that read every tenant without trying the next ones (a pause started
    or ended) says nothing about the scan."""
    seen = _Seen()
    seen.read(50, 1000, near=None, at=0.0)
    seen.read(50, 1000, near=None, at=0.1)
    assert seen.per_room == NEAR_SCAN_PER_ROOM


def test_the_scan_is_never_longer_than_reading_every_tenant() -> None:
    seen = _Seen()
    seen.read(500, 100, near=None, at=0.0)
    assert seen.params(0.1)["scan"] == NEAR_SCAN_TENANTS * 100


def test_a_queue_the_longest_scan_cannot_serve_is_read_whole_for_a_while() -> None:
    seen = _Seen(per_room=NEAR_SCAN_MOST_PER_ROOM)
    seen.read(50, 1000, near=False, at=5.0)
    assert seen.params(5.1)["near"] is False
    seen.read(50, 1000, near=None, at=5.0 + NEAR_REST_SECONDS)
    assert seen.params(5.0 + NEAR_REST_SECONDS + 0.1)["near"] is True


def test_a_queue_a_scan_of_every_tenant_cannot_serve_is_read_whole_for_a_while() -> None:
    """1,000 tenants and room for 300: once the scan asked for is as long as
    reading every tenant, a pass that still found too few rests the queue at once,
    before the scan per room reaches its most (a longer try costs the full read's
    rows, and the full read besides)."""
    seen = _Seen()
    seen.read(300, 1000, near=None, at=0.0)
    t = 0.1
    while seen.params(t)["scan"] < NEAR_SCAN_TENANTS * 1000:
        assert seen.params(t)["near"] is True
        seen.read(300, None, near=False, at=t)
        t += 0.01
    assert seen.per_room < NEAR_SCAN_MOST_PER_ROOM
    assert seen.params(t)["near"] is True, "the longest scan is still tried once"
    seen.read(300, None, near=False, at=t)
    assert seen.params(t + 0.01)["near"] is False
    assert seen.params(t + NEAR_REST_SECONDS - 0.01)["near"] is False
    # a full read after the rest, and the next tenants are tried again
    seen.read(300, 1000, near=None, at=t + NEAR_REST_SECONDS)
    assert seen.params(t + NEAR_REST_SECONDS + 0.01)["near"] is True


def test_a_full_read_that_takes_long_comes_less_often() -> None:
    """At 10,000 tenants a full read takes a sixth of a second and more: once a
    second, it would take that share of the relay's passes; it comes at most a
    tenth of the time."""
    from hybrid_jobs.relay.wake import FULL_READ_SHARE

    seen = _Seen()
    seen.read(100, 10_000, near=None, at=10.0, took=0.3)
    assert seen.params(10.0 + FULL_READ_SECONDS + 0.5)["near"] is True
    assert seen.params(10.0 + 0.3 / FULL_READ_SHARE + 0.01)["near"] is False
    # a quick one: once a second
    seen.read(100, 10_000, near=None, at=20.0, took=0.01)
    assert seen.params(20.0 + FULL_READ_SECONDS + 0.01)["near"] is False
