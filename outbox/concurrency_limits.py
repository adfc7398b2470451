"""Concurrency limits per job type, read inside the caller's transaction.

::

    @consumers.handler("render_report", global_limit=4)
    ...
    outbox.concurrency_limits(session)  # [ConcurrencyLimit("render_report", 4, 1, 0, ...)]

A handler's ``global_limit`` bounds how many of its type's jobs hold a lease at
once, across every consumer; consumers record it when they start (the last to start
wins). A job past it waits as CONCURRENCY_LIMIT and is woken when a lease of its
type ends (docs/guides/concurrency-limits.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final

from hybrid_jobs.outbox.enqueue import psycopg_connection
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.schema.queries import CONCURRENCY_LIMIT_LIST

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

# The waiting jobs counted per limit, at most (a count, not a scan of a backlog).
MAX_WAITING_COUNTED: Final = 10_000


@dataclass(frozen=True)
class ConcurrencyLimit:
    job_type: str
    # At most this many of its jobs hold a lease at once (the handler's global_limit).
    global_limit: int
    # Leases that hold a slot of it now.
    running: int
    # Jobs turned down for it that wait (CONCURRENCY_LIMIT), counted up to
    # MAX_WAITING_COUNTED.
    waiting: int
    updated_at: datetime
    # The consumer that recorded the limit last.
    updated_by: str


def concurrency_limits(session: Session) -> list[ConcurrencyLimit]:
    """Every job type's concurrency limit, with its running and waiting jobs now."""
    conn = psycopg_connection(session)
    rows = conn.exec_driver_sql(CONCURRENCY_LIMIT_LIST, {"limit": MAX_WAITING_COUNTED}).all()
    return [ConcurrencyLimit(*row) for row in rows]


concurrency_limits_async = async_twin(concurrency_limits)
