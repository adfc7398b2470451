"""The relay's plan for a recurring schedule's due occurrences (catch-up modes,
grace, DST), without a database; firing them is tests/test_schedules.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hybrid_jobs.outbox.recurrence import recurrence
from hybrid_jobs.relay.schedules import Decision, plan_fires


def test_the_catchup_rules_at_their_boundaries() -> None:
    """The pure plan, to the microsecond: 14:00 and 15:00 due, handled at `now`."""
    hourly = recurrence(None, timedelta(hours=1), "UTC")
    two, three = (datetime(2026, 5, 1, h, tzinfo=UTC) for h in (14, 15))

    def runs(catchup: str, now: datetime, start: datetime = two) -> list[datetime]:
        plan = plan_fires(hourly, start, now, catchup=catchup, max_catchup=10, grace=60, window=100)
        return [d.at for d in plan.decisions if d.skip_reason is None]

    at_grace = three + timedelta(seconds=60)
    past_grace = at_grace + timedelta(microseconds=1)
    assert runs("skip", at_grace) == [three], "60 s late is on time"
    assert runs("skip", past_grace) == [], "60 s and a microsecond is missed"
    assert runs("latest", past_grace) == [three]
    assert runs("all", past_grace) == [two, three]
    assert runs("all", at_grace) == [two, three]
    # No gap: the one due occurrence runs, whatever the mode.
    for catchup in ("skip", "latest", "all"):
        assert runs(catchup, three, start=three) == [three]
        assert runs(catchup, three - timedelta(microseconds=1), start=three) == []
    # Several due within the grace, after a 30 s gap: one runs, not seven.
    every5 = recurrence(None, timedelta(seconds=5), "UTC")
    half = three + timedelta(seconds=30)
    for catchup in ("skip", "latest"):
        plan = plan_fires(
            every5, three, half, catchup=catchup, max_catchup=10, grace=60, window=100
        )
        assert [d.at for d in plan.decisions if d.skip_reason is None] == [half]
        assert len(plan.decisions) == 7
    plan = plan_fires(every5, three, half, catchup="all", max_catchup=10, grace=60, window=100)
    assert all(d.skip_reason is None for d in plan.decisions) and len(plan.decisions) == 7
    # A day behind, "latest" runs the newest however late, "skip" none.
    day = three + timedelta(days=1, minutes=30)
    assert runs("latest", day) == [datetime(2026, 5, 2, 15, tzinfo=UTC)]
    assert runs("skip", day) == []


def test_the_walk_crosses_dst_as_next_after_does() -> None:
    """The relay's plan over New York's fall-back, from the stored instant on."""
    z = datetime(2026, 10, 31, 5, 30, tzinfo=UTC)
    daily = recurrence("30 1 * * *", None, "America/New_York")
    plan = plan_fires(
        daily, z, datetime(2026, 11, 3, 12, tzinfo=UTC), catchup="all", max_catchup=10,
        grace=60, window=100,
    )  # fmt: skip
    assert plan.decisions == [
        Decision(datetime(2026, 10, 31, 5, 30, tzinfo=UTC), None),
        Decision(datetime(2026, 11, 1, 5, 30, tzinfo=UTC), None),  # 01:30 EDT, once
        Decision(datetime(2026, 11, 2, 6, 30, tzinfo=UTC), None),
        Decision(datetime(2026, 11, 3, 6, 30, tzinfo=UTC), None),
    ]
    assert plan.next_fire_at == datetime(2026, 11, 4, 6, 30, tzinfo=UTC)
    hourly = recurrence("0 * * * *", None, "America/New_York")
    now = datetime(2026, 11, 1, 8, 0, 30, tzinfo=UTC)
    plan = plan_fires(
        hourly, datetime(2026, 11, 1, 4, tzinfo=UTC), now, catchup="latest", max_catchup=10,
        grace=60, window=100,
    )  # fmt: skip
    hours = [datetime(2026, 11, 1, h, tzinfo=UTC) for h in (4, 5, 6, 7, 8)]
    assert plan.decisions == [
        *(Decision(h, "catchup") for h in hours[:4]),  # 00:00 EDT to 02:00 EST
        Decision(hours[4], None),  # the newest: 03:00 EST, on time
    ]
