"""Concurrency limits per queue, read and written inside the caller's transaction.

::

    consumer --app app --queue-limit reports=4
    ...
    outbox.queue_limits(session)  # [QueueLimit("reports", 4, 1, 0, ...)]
    outbox.set_queue_limit(session, "reports", 8)
    outbox.remove_queue_limit(session, "reports")

A queue's limit bounds how many of its jobs hold a lease at once, across every
consumer, whatever their types; consumers record theirs when they start (the last
to write wins). A job past it waits as QUEUE_CONCURRENCY_LIMIT and is woken when a
lease of its queue ends (docs/guides/concurrency-limits.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from hybrid_jobs import defaults
from hybrid_jobs.outbox.concurrency_limits import MAX_WAITING_COUNTED
from hybrid_jobs.outbox.enqueue import psycopg_connection
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.schema import names
from hybrid_jobs.schema.queries import (
    QUEUE_LIMIT_LIST,
    QUEUE_LIMIT_RECORD_MANY,
    QUEUE_LIMIT_REMOVE,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


@dataclass(frozen=True)
class QueueLimit:
    queue: str
    # At most this many of its jobs hold a lease at once.
    limit: int
    # Leases that hold a slot of it now.
    running: int
    # Jobs turned down for it that wait (QUEUE_CONCURRENCY_LIMIT), counted up to
    # MAX_WAITING_COUNTED.
    waiting: int
    updated_at: datetime
    # The consumer, or the operator, that wrote the limit last.
    updated_by: str


def queue_limits(session: Session) -> list[QueueLimit]:
    """Every queue's concurrency limit, with its running and waiting jobs now."""
    conn = psycopg_connection(session)
    rows = conn.exec_driver_sql(QUEUE_LIMIT_LIST, {"limit": MAX_WAITING_COUNTED}).all()
    return [QueueLimit(*row) for row in rows]


queue_limits_async = async_twin(queue_limits)


def set_queue_limit(session: Session, queue: str, limit: int, *, by: str | None = None) -> bool:
    """Give ``queue`` a concurrency limit of ``limit`` leases, across every consumer
    (``by``: who, else the database role); whether it changed. A raised limit
    wakes as many of the jobs waiting for it as it now has free slots. A consumer
    started later with its own ``--queue-limit`` for the queue writes over it."""
    name = names.queue(queue)
    if isinstance(limit, bool) or not 1 <= limit <= defaults.MAX_QUEUE_LIMIT:
        raise ValueError(f"a queue limit must be an int from 1 to {defaults.MAX_QUEUE_LIMIT}")
    conn = psycopg_connection(session)
    given = json.dumps([{"queue": name, "max_running": limit}])
    rows = conn.exec_driver_sql(QUEUE_LIMIT_RECORD_MANY, {"limits": given, "worker": by}).all()
    return bool(rows)


set_queue_limit_async = async_twin(set_queue_limit)


def remove_queue_limit(session: Session, queue: str) -> bool:
    """Remove ``queue``'s concurrency limit; whether it had one. Every job waiting
    for it is woken. A consumer started later with ``--queue-limit`` for the queue
    records one again; the jobs that started under the removed limit and still run
    count against it."""
    conn = psycopg_connection(session)
    found = conn.exec_driver_sql(QUEUE_LIMIT_REMOVE, {"queue": names.queue(queue)}).all()
    return bool(found)


remove_queue_limit_async = async_twin(remove_queue_limit)
