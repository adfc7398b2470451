"""Recurrence rules without a database: validation, and occurrences checked against
instants computed by hand.

America/New_York in 2026: clocks spring forward on Sunday 8 March at 02:00 EST
(07:00Z) to 03:00 EDT, and fall back on Sunday 1 November at 02:00 EDT (06:00Z) to
01:00 EST. So on 8 March local 02:00-02:59 never happens, and on 1 November local
01:00-01:59 happens twice: first as EDT (05:00Z-05:59Z), then as EST (06:00Z-06:59Z).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from hybrid_jobs.outbox.recurrence import (
    Recurrence,
    check_catchup,
    check_timezone,
    recurrence,
)

NY = "America/New_York"


def z(month: int, day: int, hour: int, minute: int = 0, second: int = 0) -> datetime:
    return datetime(2026, month, day, hour, minute, second, tzinfo=UTC)


def occurrences(rule: Recurrence, start: datetime, count: int) -> list[datetime]:
    out: list[datetime] = []
    t = start
    for _ in range(count):
        t = rule.next_after(t)
        out.append(t)
    return out


@pytest.mark.parametrize(
    ("cron", "start", "expected"),
    [
        pytest.param(
            "30 2 * * *",
            z(3, 7, 12),
            # 8 March 02:30 does not exist: once, at the transition (03:00 EDT).
            [z(3, 8, 7), z(3, 9, 6, 30), z(3, 10, 6, 30)],
            id="fixed-time-in-skipped-hour",
        ),
        pytest.param(
            "30 1 * * *",
            z(3, 7, 12),
            [z(3, 8, 6, 30), z(3, 9, 5, 30)],
            id="fixed-time-before-skipped-hour",
        ),
        pytest.param(
            "30 1 * * *",
            z(10, 31, 12),
            # 1 November 01:30 happens twice: the first (EDT) only.
            [z(11, 1, 5, 30), z(11, 2, 6, 30)],
            id="fixed-time-in-repeated-hour",
        ),
        pytest.param(
            "30 2 * * *",
            z(10, 31, 12),
            [z(11, 1, 7, 30), z(11, 2, 7, 30)],
            id="fixed-time-after-repeated-hour",
        ),
        pytest.param(
            "0 * * * *",
            z(3, 8, 4, 30),
            # 00:00 EST, 01:00 EST, then 03:00 EDT one real hour later.
            [z(3, 8, 5), z(3, 8, 6), z(3, 8, 7), z(3, 8, 8)],
            id="hourly-spring",
        ),
        pytest.param(
            "0 * * * *",
            z(11, 1, 3),
            # 00:00 EDT, 01:00 EDT, 01:00 EST, 02:00 EST, 03:00 EST.
            [z(11, 1, 4), z(11, 1, 5), z(11, 1, 6), z(11, 1, 7), z(11, 1, 8)],
            id="hourly-fall",
        ),
        pytest.param(
            "*/15 * * * *",
            z(3, 8, 6, 40),
            # 01:45 EST, then 03:00 EDT: nothing in the hour that does not exist.
            [z(3, 8, 6, 45), z(3, 8, 7), z(3, 8, 7, 15)],
            id="quarter-hourly-spring",
        ),
        pytest.param(
            "*/15 * * * *",
            z(11, 1, 4, 50),
            # Both 01:xx hours, every quarter, then 02:00 EST.
            [
                *(z(11, 1, 5, m) for m in (0, 15, 30, 45)),
                *(z(11, 1, 6, m) for m in (0, 15, 30, 45)),
                z(11, 1, 7),
            ],
            id="quarter-hourly-fall",
        ),
        pytest.param(
            "*/20 30 1 * * *",
            z(10, 31, 12),
            # Seconds first; a fixed time: the first 01:30 minute only.
            [z(11, 1, 5, 30, 0), z(11, 1, 5, 30, 20), z(11, 1, 5, 30, 40), z(11, 2, 6, 30)],
            id="seconds-fixed-time-in-repeated-hour",
        ),
        pytest.param(
            "15 30 2 * * *",
            z(3, 7, 12),
            [z(3, 8, 7), z(3, 9, 6, 30, 15)],
            id="seconds-fixed-time-in-skipped-hour",
        ),
        pytest.param(
            "30 */30 * * * *",
            z(11, 1, 5, 20),
            # Second 30 of every half hour, at every real instant.
            [z(11, 1, 5, 30, 30), z(11, 1, 6, 0, 30), z(11, 1, 6, 30, 30), z(11, 1, 7, 0, 30)],
            id="seconds-every-half-hour-fall",
        ),
    ],
)
def test_new_york_2026_transitions(cron: str, start: datetime, expected: list[datetime]) -> None:
    rule = recurrence(cron, None, NY)
    assert occurrences(rule, start, len(expected)) == expected


def test_starting_inside_the_repeated_hour_never_goes_back() -> None:
    """From the second 01:00 (EST), a daily 01:30 has fired already (at 01:30 EDT)."""
    rule = recurrence("30 1 * * *", None, NY)
    assert rule.next_after(z(11, 1, 6)) == z(11, 2, 6, 30)
    assert rule.next_after(z(11, 1, 5, 30)) == z(11, 2, 6, 30)
    assert rule.next_after(z(11, 1, 5, 29, 59)) == z(11, 1, 5, 30)


def test_half_hour_shift_fires_every_two_hours_at_real_instants() -> None:
    """Lord Howe falls back half an hour on 5 April 2026 at 02:00 (+11:00), that is at
    15:00Z, to 01:30 (+10:30). Local 02:00 then first happens at 15:30Z. (cronsim's
    own stepping misses it.)"""
    rule = recurrence("0 */2 * * *", None, "Australia/Lord_Howe")
    assert occurrences(rule, z(4, 4, 12), 3) == [z(4, 4, 13), z(4, 4, 15, 30), z(4, 4, 17, 30)]


def test_berlin_fixed_time_in_both_transitions() -> None:
    """Europe/Berlin 2026: 02:00 CET -> 03:00 CEST on 29 March (01:00Z); 03:00 CEST ->
    02:00 CET on 25 October (01:00Z), so 02:30 happens at 00:30Z and 01:30Z."""
    rule = recurrence("30 2 * * *", None, "Europe/Berlin")
    assert occurrences(rule, z(3, 28, 12), 2) == [z(3, 29, 1), z(3, 30, 0, 30)]
    assert occurrences(rule, z(10, 24, 12), 2) == [z(10, 25, 0, 30), z(10, 26, 1, 30)]


def test_cron_in_utc_and_aliases() -> None:
    assert recurrence("@daily", None, "UTC").next_after(z(5, 1, 13)) == z(5, 2, 0)
    assert recurrence("@hourly", None, "UTC").next_after(z(5, 1, 13)) == z(5, 1, 14)
    weekdays = recurrence("0 9 * * MON-FRI", None, "UTC")
    # 1 May 2026 is a Friday.
    assert occurrences(weekdays, z(5, 1, 10), 2) == [z(5, 4, 9), z(5, 5, 9)]


def test_next_after_is_strictly_after_and_takes_any_offset() -> None:
    rule = recurrence("0 * * * *", None, "UTC")
    assert rule.next_after(z(5, 1, 13)) == z(5, 1, 14)
    assert rule.next_after(z(5, 1, 12, 59, 59) + timedelta(microseconds=999_999)) == z(5, 1, 13)
    # 15:00 CEST is 13:00Z.
    berlin = datetime(2026, 5, 1, 15, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    assert rule.next_after(berlin) == z(5, 1, 14)
    with pytest.raises(ValueError, match="timezone-aware"):
        rule.next_after(datetime(2026, 5, 1))


def test_every_is_anchored_on_the_epoch_whatever_the_zone() -> None:
    seven = recurrence(None, timedelta(seconds=7), NY)
    t = seven.next_after(z(11, 1, 5, 59, 58))
    assert t.timestamp() % 7 == 0 and z(11, 1, 5, 59, 58) < t <= z(11, 1, 6, 0, 5)
    assert seven.next_after(t) == t + timedelta(seconds=7)
    assert recurrence(None, timedelta(seconds=7), "Asia/Tokyo").next_after(z(1, 1, 0)) == (
        seven.next_after(z(1, 1, 0))
    )
    hourly = recurrence(None, timedelta(hours=1), NY)
    # Real hours through the repeated hour: no DST rule applies to intervals.
    assert occurrences(hourly, z(11, 1, 4, 30), 3) == [z(11, 1, 5), z(11, 1, 6), z(11, 1, 7)]


def test_fractional_every_survives_the_database_round_trip() -> None:
    rule = recurrence(None, timedelta(seconds=1, microseconds=500_000), "UTC")
    again = Recurrence.from_row(None, rule.every_seconds, "UTC")
    assert again == rule
    assert occurrences(again, z(1, 1, 0), 2) == [
        z(1, 1, 0, 0, 1) + timedelta(microseconds=500_000),
        z(1, 1, 0, 0, 3),
    ]


@pytest.mark.parametrize(
    ("cron", "every", "timezone", "error", "message"),
    [
        ("61 * * * *", None, "UTC", ValueError, "bad minute field '61'"),
        ("* 24 * * *", None, "UTC", ValueError, "bad hour field '24'"),
        ("0 0 * * 8", None, "UTC", ValueError, "bad day-of-week field '8'"),
        ("61 0 0 * * *", None, "UTC", ValueError, "bad second field '61'"),
        ("* * * *", None, "UTC", ValueError, "has 4 fields; expected five"),
        ("* * * * * * *", None, "UTC", ValueError, "has 7 fields"),
        ("", None, "UTC", ValueError, "has 0 fields"),
        # 30 February: cronsim refuses a day no month of the list has.
        ("0 0 30 2 *", None, "UTC", ValueError, "bad day-of-month field '30'"),
        ("every minute", None, "UTC", ValueError, "cron 'every minute' has 2 fields"),
        (15, None, "UTC", TypeError, "cron must be a str, not int"),
        (None, timedelta(milliseconds=999), "UTC", ValueError, "every must be at least 1 second"),
        (None, timedelta(0), "UTC", ValueError, "every must be at least 1 second"),
        (None, timedelta(seconds=-5), "UTC", ValueError, "every must be at least 1 second"),
        (None, 60, "UTC", TypeError, "every must be a datetime.timedelta, not int"),
        (None, timedelta(days=4000), "UTC", ValueError, "every must be at most"),
        ("* * * * *", timedelta(seconds=5), "UTC", ValueError, "exactly one of cron= and every="),
        (None, None, "UTC", ValueError, r"exactly one of cron= and every= \(got neither\)"),
        ("* * * * *", None, "Mars/Olympus_Mons", ValueError, "timezone 'Mars/Olympus_Mons'"),
        ("* * * * *", None, "EST5EDT4", ValueError, "not a known IANA time zone"),
        ("* * * * *", None, "../../etc/passwd", ValueError, "not a known IANA time zone"),
        ("* * * * *", None, "localtime", ValueError, "not a known IANA time zone"),
        ("* * * * *", None, None, TypeError, "timezone must be a str"),
    ],
)
def test_invalid_rules_name_the_argument(
    cron: object, every: object, timezone: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        recurrence(cron, every, timezone)


def test_catchup_and_timezone_checks() -> None:
    assert [check_catchup(m) for m in ("skip", "latest", "all")] == ["skip", "latest", "all"]
    with pytest.raises(ValueError, match="catchup must be one of 'skip', 'latest', 'all'"):
        check_catchup("some")
    assert check_timezone("Europe/Berlin") == "Europe/Berlin"
