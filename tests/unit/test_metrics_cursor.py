"""The metrics collector's high-water mark over rows committed late, on rows made
up in the test (the statement it reads is run in tests/test_metrics.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from hybrid_jobs.jobctl.metrics.cursor import Cursor, Seen


def _at(seconds: float) -> datetime:
    return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)


def _rows(cursor: Cursor, table: dict[str, float], now: float) -> Iterator[Seen[str]]:
    """What the statement would return from ``table`` (key -> timestamp) at ``now``."""
    params = cursor.params(_at(now))
    low, mark, limit = params["low"], params["cursor"], params["limit"]
    yield from (Seen(True, k, _at(t), k) for k, t in table.items() if low <= _at(t) <= mark)
    ahead = sorted((t, k) for k, t in table.items() if _at(t) > mark)[:limit]
    yield from (Seen(False, k, _at(t), k) for t, k in ahead)


def test_cursor_counts_late_rows_once_and_catches_up_in_steps() -> None:
    cursor = Cursor(overlap=timedelta(seconds=60), limit=3)
    table = {"old": 0.0}
    assert cursor.take(_rows(cursor, table, 100), _at(100)) == [], "the first round notes only"

    table |= {"a": 101, "b": 102}
    assert cursor.take(_rows(cursor, table, 110), _at(110)) == ["a", "b"]
    # "c" was written at 105 but committed only now, behind the mark: still counted
    table |= {"c": 105, "d": 111}
    assert cursor.take(_rows(cursor, table, 120), _at(120)) == ["c", "d"]
    assert cursor.take(_rows(cursor, table, 130), _at(130)) == []

    # After an outage, seven new rows: three per round, oldest first.
    table |= {f"n{i}": 131 + i for i in range(7)}
    got = [cursor.take(_rows(cursor, table, 500), _at(500)) for _ in range(3)]
    assert got == [["n0", "n1", "n2"], ["n3", "n4", "n5"], ["n6"]]
    # The keys it must remember are only those within the overlap of the mark.
    assert set(cursor.counted) <= {k for k, t in table.items() if _at(t) >= _at(500 - 60)}


def test_cursor_ties_at_the_limit_are_not_lost() -> None:
    """A batch written by one statement shares one timestamp; a limit that cuts
    through it leaves the rest for the next round's overlap read."""
    cursor = Cursor(overlap=timedelta(seconds=60), limit=2)
    cursor.take(_rows(cursor, {}, 0), _at(0))
    table = {k: 5.0 for k in "abcde"}
    counted: list[str] = []
    for now in (10, 11, 12):
        counted += cursor.take(_rows(cursor, table, now), _at(now))
    assert sorted(counted) == list("abcde")


def test_uuid_keys_are_only_keys() -> None:
    # job ids serve as keys of the overlap set; the cursor never exports them
    cursor = Cursor(overlap=timedelta(seconds=1), limit=10)
    key = uuid.uuid4()
    cursor.take([], _at(0))
    assert cursor.take([Seen(False, (key, 1), _at(1), "x")], _at(2)) == ["x"]
    assert cursor.take([Seen(True, (key, 1), _at(1), "x")], _at(2.5)) == []
