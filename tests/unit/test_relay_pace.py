"""The automatic window's slack (relay/pace.py): twice what the consumers take
during one decision, from the passes' smoothed send rate and decision time."""

from __future__ import annotations

from hybrid_jobs.relay.pace import RATE_SPAN, Pace


def _steady(pace: Pace, *, rate: float, decision: float, seconds: float) -> float:
    """Passes a decision long each, sending ``rate`` a second, for ``seconds``;
    returns when the last ended."""
    at = 0.0
    while at < seconds:
        at += decision
        pace.passed(at, round(rate * decision), decision)
    return at


def test_a_new_queue_gets_no_slack() -> None:
    assert Pace().slack(500) == 0


def test_slow_decisions_add_twice_what_is_taken_meanwhile() -> None:
    pace = Pace()
    _steady(pace, rate=3000, decision=0.04, seconds=5)
    assert 220 <= pace.slack(500) <= 260  # 2 x 3,000/s x 40 ms = 240


def test_quick_decisions_add_little_and_the_batch_bounds_it() -> None:
    quick = Pace()
    _steady(quick, rate=5000, decision=0.002, seconds=5)
    assert quick.slack(500) <= 25
    slow = Pace()
    _steady(slow, rate=5000, decision=0.2, seconds=20)
    assert slow.slack(500) == 500


def test_passes_that_found_no_room_to_look_leave_the_decision_time() -> None:
    pace = Pace()
    at = _steady(pace, rate=3000, decision=0.04, seconds=5)
    before = pace.decision
    for _ in range(50):  # quick passes that read nothing, between the real ones
        at += 0.001
        pace.passed(at, 0, None)
    assert pace.decision == before


def test_an_idle_queue_loses_its_slack() -> None:
    pace = Pace()
    at = _steady(pace, rate=3000, decision=0.04, seconds=5)
    for _ in range(20):
        at += RATE_SPAN * 5
        pace.passed(at, 0, 0.001)
    assert pace.slack(500) == 0
