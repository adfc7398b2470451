"""Reading a growing history a round at a time: a high-water mark with an overlap.

Rows carry the database time they were written at (``statement_timestamp()`` or
``now()``), but a row becomes visible only when its transaction commits, a moment
later. So every round re-reads the last ``overlap`` behind the mark (the ``late``
part) as well as what lies past it, and remembers the keys it counted within that
window: a row committed late is counted once it shows up, and no row twice. A row
whose transaction committed more than ``overlap`` after its timestamp is missed; the
daemons' statements time out after 30 s, which the default overlap covers.

A round takes at most ``limit`` rows past the mark, oldest first; when it had to
stop there, the mark moves only to the last row taken and the next round goes on
from it, so a long pause (the database was away) is caught up in steps, each within
the statement timeout.

The mark starts at the database clock of the first round, which only notes what is
there: counters start at zero when the collector starts (Prometheus handles resets),
rather than with the whole history in one increase.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, NamedTuple, TypeVar

Row = TypeVar("Row")


class Seen(NamedTuple, Generic[Row]):
    """One row as read: which part it came from, its key and its timestamp. (A
    tuple: a round makes one per row of its overlap, thousands of them.)"""

    late: bool
    key: Hashable
    at: datetime
    row: Row


@dataclass
class Cursor:
    overlap: timedelta
    limit: int
    # None until the first round has noted where the history stood.
    mark: datetime | None = None
    counted: dict[Hashable, datetime] = field(default_factory=dict)

    def params(self, now: datetime) -> dict[str, Any]:
        mark = self.mark or now
        return {"low": mark - self.overlap, "cursor": mark, "limit": self.limit}

    def take(self, rows: Iterable[Seen[Row]], now: datetime) -> list[Row]:
        """The rows not counted before, and the mark moved on. Call it only once the
        round's transaction has succeeded, with the clock that round read at."""
        baseline = self.mark is None
        fresh: list[Row] = []
        ahead = 0
        last: datetime | None = None
        for seen in rows:
            if not seen.late:
                ahead += 1
                last = seen.at if last is None else max(last, seen.at)
            if seen.key in self.counted:
                continue
            self.counted[seen.key] = seen.at
            if not baseline:
                fresh.append(seen.row)
        mark = self.mark or now
        if ahead >= self.limit and last is not None:
            self.mark = max(mark, last)  # stopped at the limit: go on from here
        else:
            self.mark = max(mark, now)
        horizon = self.mark - self.overlap
        self.counted = {k: at for k, at in self.counted.items() if at >= horizon}
        return fresh
