"""Rate limits, global and exact, set and read inside the caller's transaction.

::

    outbox.set_rate_limit(session, "stripe", rate=100, per=timedelta(seconds=1))
    outbox.enqueue(session, "charge", {...}, rate_limit="stripe")
    # or: @consumers.handler("charge", rate_limit="stripe")

A job under a rate limit takes a token of its bucket in the claim that starts it;
across any number of consumers, the starts in any window of length t are at most
``burst + rate / per * t``. A job that finds no token spends no attempt: it waits
as RATE_LIMITED and is woken when its token is due. A name ending in ``:*``
(``"sms:*"``) sets the limit of every name with that prefix (``"sms:acme"``), each
with a bucket of its own; a name's own limit goes before a prefix's, and a longer
prefix before a shorter. A job whose name has no limit is not limited.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from hybrid_jobs.outbox.enqueue import psycopg_connection
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.schema import names
from hybrid_jobs.schema.queries import RATE_LIMIT_REMOVE, RATE_LIMIT_SET, RATE_LIMITS

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


@dataclass(frozen=True)
class RateLimit:
    name: str
    rate: float
    per_seconds: float
    burst: float
    # An exact name's bucket now (a prefix's: its burst, what a new name starts
    # with), and when a claim last took from it (None: never).
    tokens: float
    refilled_at: datetime | None
    # Names with a bucket: for a prefix, those under it (counted up to 10000).
    buckets: int

    @property
    def next_token_in_seconds(self) -> float:
        """How long until the bucket holds a whole token (0: it has one)."""
        return max(0.0, (1 - self.tokens) * self.per_seconds / self.rate)


def _params(name: str, rate: float, per: timedelta, burst: float | None) -> dict[str, Any]:
    checked = names.rate_limit(name, pattern=True)
    for label, value in (("rate", rate), ("burst", burst)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise TypeError(f"{label} must be a number, not {type(value).__name__}")
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError("rate must be a positive number")
    if not isinstance(per, timedelta):
        raise TypeError(f"per must be a timedelta, not {type(per).__name__}")
    seconds = per.total_seconds()
    if not seconds > 0:
        raise ValueError("per must be positive")
    # Without a burst, one period's worth may start at once.
    tokens = max(1.0, float(rate)) if burst is None else float(burst)
    if not (math.isfinite(tokens) and tokens >= 1):
        raise ValueError("burst must be at least 1")
    return {"name": checked, "rate": float(rate), "per_seconds": seconds, "burst": tokens}


def set_rate_limit(
    session: Session,
    name: str,
    *,
    rate: float,
    per: timedelta = timedelta(seconds=1),
    burst: float | None = None,
) -> None:
    """Create or change the limit ``name`` (or, ending in ``:*``, of every name with
    that prefix): ``rate`` starts per ``per``, and at most ``burst`` at once
    (default: ``rate``, at least 1). Through the session's transaction; never
    commits."""
    values = _params(name, rate, per, burst)
    conn = psycopg_connection(session)
    conn.exec_driver_sql(RATE_LIMIT_SET, values)


set_rate_limit_async = async_twin(set_rate_limit)


def remove_rate_limit(session: Session, name: str) -> bool:
    """Remove a limit and its buckets; whether there was one. Its jobs are then not
    limited (unless a prefix's limit covers their name)."""
    key = names.rate_limit(name, pattern=True)
    conn = psycopg_connection(session)
    return bool(conn.exec_driver_sql(RATE_LIMIT_REMOVE, {"name": key}).scalar())


remove_rate_limit_async = async_twin(remove_rate_limit)


def rate_limits(session: Session) -> list[RateLimit]:
    """Every limit, with its bucket's tokens now."""
    conn = psycopg_connection(session)
    return [RateLimit(*row) for row in conn.exec_driver_sql(RATE_LIMITS).all()]


rate_limits_async = async_twin(rate_limits)
