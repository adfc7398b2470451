"""When a recurring schedule fires: pure time logic, no database.

A schedule is a cron expression in an IANA time zone, or a fixed interval. Its
occurrences are UTC instants; :meth:`Recurrence.next_after` gives the first one after a
given instant, and is all the relay needs to walk a schedule forward.

Cron entries keep Debian cron's daylight-saving rule (the one users of cron expect):

- a *fixed-time* entry (neither the minute nor the hour field starts with ``*``, say
  ``30 2 * * *``) fires once per matching wall-clock time: in a repeated local hour
  (autumn) at its first occurrence only, and in a skipped local hour (spring) once, at
  the transition;
- any other entry (``0 * * * *``, ``*/15 * * * *``, ``0 */2 * * *``) fires at every
  real instant whose local time matches, so both repeated 01:xx hours and none of the
  skipped ones.

Six-field entries (seconds first) follow the same rule, decided by their minute and
hour fields. The cron library (cronsim) only answers "which wall-clock times match";
turning a wall-clock time into an instant is done here, so the rule does not depend on
the library's DST handling (checked on croniter 7.0 and cronsim 2.8: croniter fires a
repeated 01:30 twice and wants seconds last; cronsim applies the Debian rule to
five-field entries only, and its stepping through real instants misses
``0 */2 * * *`` at Lord Howe's half-hour shift).

``every`` occurrences are the multiples of the interval since the Unix epoch, in UTC:
every relay computes the same instants, before and after a restart, whatever the zone.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo, available_timezones

from cronsim import CronSim, CronSimError

CATCHUP_MODES: Final = ("skip", "latest", "all")
MIN_EVERY: Final = timedelta(seconds=1)
# An upper bound keeps every instant computable (datetime stops at year 9999) and
# catches a unit mistake (an interval in microseconds where seconds were meant).
MAX_EVERY: Final = timedelta(days=3660)
MAX_CRON_LENGTH: Final = 200

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)
_FIELDS: Final = "minute hour day-of-month month day-of-week"
# cronsim's field names in its error messages, in the order of a six-field entry.
_CRONSIM_FIELDS: Final = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")
_ALIASES: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# A bound on the matches passed over while looking for the next instant (the
# wall-clock times left in a repeated hour, offset changes): a guard against a bug
# looping forever, far above what any real zone needs.
_MAX_SKIPPED: Final = 200_000


class NeverFires(ValueError):
    """A cron expression that matches no time in the next 50 years."""


@dataclass(frozen=True)
class Recurrence:
    """A validated schedule rule: exactly one of ``cron`` and ``every``."""

    cron: str | None
    every: timedelta | None
    timezone: str

    @property
    def every_seconds(self) -> float | None:
        return None if self.every is None else self.every.total_seconds()

    def next_after(self, instant: datetime) -> datetime:
        """The first occurrence strictly after ``instant`` (aware), as a UTC datetime.

        Raises :class:`NeverFires` if a cron expression has no occurrence within 50
        years of ``instant``.
        """
        if instant.tzinfo is None or instant.utcoffset() is None:
            raise ValueError("next_after needs a timezone-aware instant")
        after = instant.astimezone(UTC)
        if self.every is not None:
            return _every_next(self.every, after)
        assert self.cron is not None
        return _cron_next(self.cron, ZoneInfo(self.timezone), after)

    @classmethod
    def from_row(cls, cron: str | None, every_seconds: float | None, timezone: str) -> Recurrence:
        """The rule of a stored schedule (validated when it was written)."""
        every = None
        if every_seconds is not None:
            # Stored as double precision seconds; round back to whole microseconds.
            every = timedelta(microseconds=round(every_seconds * 1_000_000))
        return cls(cron, every, timezone)


def recurrence(cron: object, every: object, timezone: object) -> Recurrence:
    """Validate a schedule's rule; raises ``TypeError``/``ValueError`` naming the argument."""
    zone_name = check_timezone(timezone)
    if (cron is None) == (every is None):
        got = "neither" if cron is None else "both"
        raise ValueError(f"give exactly one of cron= and every= (got {got})")
    if every is not None:
        return Recurrence(None, _check_every(every), zone_name)
    return Recurrence(_check_cron(cron), None, zone_name)


def check_timezone(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"timezone must be a str (an IANA zone name), not {type(value).__name__}")
    # ZoneInfo alone would also take files that are no zone names ("localtime",
    # "posixrules"), which differ from one machine to the next.
    if value not in _zone_names():
        raise ValueError(
            f"timezone {value!r} is not a known IANA time zone (such as 'UTC' or 'Europe/Berlin')"
        )
    return value


@functools.cache
def _zone_names() -> frozenset[str]:
    # Reads the zone database's directory once; a few milliseconds. Some systems put
    # a "localtime" link there, which names whatever zone the machine is set to.
    return frozenset(available_timezones()) - {"localtime"}


def check_catchup(value: object) -> str:
    if value not in CATCHUP_MODES:
        raise ValueError(f"catchup must be one of 'skip', 'latest', 'all', not {value!r}")
    assert isinstance(value, str)
    return value


def _check_every(value: object) -> timedelta:
    if not isinstance(value, timedelta):
        raise TypeError(f"every must be a datetime.timedelta, not {type(value).__name__}")
    if value < MIN_EVERY:
        raise ValueError(f"every must be at least 1 second, not {value.total_seconds():g} s")
    if value > MAX_EVERY:
        raise ValueError(f"every must be at most {MAX_EVERY.days} days")
    return value


def _check_cron(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"cron must be a str, not {type(value).__name__}")
    if len(value) > MAX_CRON_LENGTH:
        raise ValueError(f"cron is {len(value)} characters long; the limit is {MAX_CRON_LENGTH}")
    expr = " ".join(value.split())
    expr = _ALIASES.get(expr.lower(), expr)
    fields = expr.split(" ") if expr else []
    if len(fields) not in (5, 6):
        raise ValueError(
            f"cron {value!r} has {len(fields)} fields; expected five ({_FIELDS}) "
            "or six with seconds first"
        )
    try:
        sim = CronSim(expr, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise ValueError(f"cron {value!r} is invalid: {_describe(exc, fields)}") from None
    try:
        next(sim)
    except StopIteration:
        raise NeverFires(f"cron {value!r} never fires") from None
    return expr


def _describe(exc: CronSimError, fields: list[str]) -> str:
    """cronsim says "Bad minute"; say which text that was, too."""
    message = str(exc)
    named = list(_CRONSIM_FIELDS if len(fields) == 6 else _CRONSIM_FIELDS[1:])
    for name, text in zip(named, fields, strict=True):
        if message.lower() == f"bad {name}":
            return f"bad {name} field {text!r}"
    return message


def _every_next(every: timedelta, after: datetime) -> datetime:
    # Whole microseconds: exact, and the database's timestamp resolution.
    step = every // _MICROSECOND
    elapsed = (after - _EPOCH) // _MICROSECOND
    return _EPOCH + timedelta(microseconds=(elapsed // step + 1) * step)


def _is_fixed_time(expr: str) -> bool:
    fields = expr.split(" ")
    minute, hour = fields[-5], fields[-4]
    return not minute.startswith("*") and not hour.startswith("*")


def _cron_next(expr: str, zone: ZoneInfo, after: datetime) -> datetime:
    """The library boundary: nothing else in the code base sees cronsim.

    cronsim is asked only which wall-clock times match (naive datetimes, no zone);
    which instant a wall-clock time means is decided here. (Its own stepping through
    real instants misses ``0 */2 * * *`` after Lord Howe's half-hour shift.)
    """
    try:
        if _is_fixed_time(expr):
            return _fixed_next(expr, zone, after)
        return _real_next(expr, zone, after)
    except StopIteration:
        raise NeverFires(f"cron {expr!r} has no occurrence within 50 years") from None


def _fixed_next(expr: str, zone: ZoneInfo, after: datetime) -> datetime:
    """Each matching wall-clock time fires once: at its first occurrence if the
    hour repeats, at the transition if the hour is skipped."""
    matches = CronSim(expr, after.astimezone(zone).replace(tzinfo=None))
    for _ in range(_MAX_SKIPPED):
        candidate = _wall_to_instant(next(matches), zone)
        # Started in the second pass of a repeated hour, the wall-clock times left in
        # that hour first occurred before ``after``; several skipped wall-clock
        # times share one transition instant. Neither may fire again.
        if candidate > after:
            return candidate
    raise RuntimeError(f"cron {expr!r}: no occurrence after {after.isoformat()} found")


def _real_next(expr: str, zone: ZoneInfo, after: datetime) -> datetime:
    """The first real instant after ``after`` whose local time matches.

    Between two offset changes local time is UTC plus a constant, so the next
    wall-clock match is the next instant; if the offset changes before that
    candidate, search again from the change, in the new offset.
    """
    start, offset = after, _offset(zone, after)
    wall = (after + offset).replace(tzinfo=None)
    for _ in range(_MAX_SKIPPED):
        candidate = (next(CronSim(expr, wall)) - offset).replace(tzinfo=UTC)
        change = _next_change(zone, start, candidate, offset)
        if change is None:
            return candidate
        start, offset = change, _offset(zone, change)
        # cronsim yields times after the one it starts from; the change itself counts.
        wall = (change + offset).replace(tzinfo=None) - timedelta(seconds=1)
    raise RuntimeError(f"cron {expr!r}: no occurrence after {after.isoformat()} found")


# Offset changes are months apart; looking every few hours cannot step over a pair.
_CHANGE_PROBE: Final = timedelta(hours=6)


def _offset(zone: ZoneInfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    assert offset is not None
    return offset


def _next_change(
    zone: ZoneInfo, start: datetime, end: datetime, offset: timedelta
) -> datetime | None:
    """The first instant in (start, end] whose UTC offset is not ``offset``."""
    probe = start
    while probe < end:
        upper = min(probe + _CHANGE_PROBE, end)
        if _offset(zone, upper) != offset:
            # Transitions fall on whole seconds: search the seconds in (probe, upper].
            low, high = math.floor(probe.timestamp()) + 1, math.ceil(upper.timestamp())
            while low < high:
                mid = (low + high) // 2
                if _offset(zone, datetime.fromtimestamp(mid, UTC)) != offset:
                    high = mid
                else:
                    low = mid + 1
            return datetime.fromtimestamp(low, UTC)
        probe = upper
    return None


def _wall_to_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The instant a fixed-time entry fires for a wall-clock time: its first
    occurrence if the hour repeats, the transition if the hour is skipped."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first
    return _gap_end(wall, zone)


def _gap_end(wall: datetime, zone: ZoneInfo) -> datetime:
    """The instant a skipped span of local time ends (the clocks jump past ``wall``).

    Read with the offset from before the jump, ``wall`` lands after the transition;
    with the offset from after it, before. The transition is the first instant in
    between whose local time is past ``wall``; transitions fall on whole seconds.
    """
    low = math.floor(wall.replace(tzinfo=zone, fold=1).timestamp())
    high = math.ceil(wall.replace(tzinfo=zone, fold=0).timestamp())
    while low < high:
        mid = (low + high) // 2
        if datetime.fromtimestamp(mid, zone).replace(tzinfo=None) > wall:
            high = mid
        else:
            low = mid + 1
    return datetime.fromtimestamp(low, UTC)
