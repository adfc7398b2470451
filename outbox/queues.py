"""Pausing and resuming a queue, inside the caller's SQLAlchemy transaction.

::

    with Session(engine) as session, session.begin():
        outbox.pause_queue(session, "mail", by="alice")
    ...
    with Session(engine) as session, session.begin():
        outbox.resume_queue(session, "mail")

While a queue is paused (from the caller's commit on) none of its jobs is claimed
and none is woken: the relay sends none of its wake-ups, and a consumer that gets
one anyway (sent just before the pause) turns it down, records ``QUEUE_PAUSED`` on
the job and puts the wake-up back in the backlog, spending no attempt. Jobs already
running finish, and their retries wait like the rest. Enqueueing into a paused queue
works as usual. Resuming sends the relay a notification at commit, so the waiting
wake-ups go out at once, and records who resumed it (the last pause stays on record
beside it). ``queue_in_use`` says whether anything uses a queue, for callers that
refuse to pause a name nothing uses (a typo). Nothing here commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hybrid_jobs.outbox.enqueue import psycopg_connection
from hybrid_jobs.outbox.ids import actor
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.schema import names
from hybrid_jobs.schema.queries import QUEUE_IN_USE, QUEUE_PAUSE, QUEUE_PAUSED_LIST, QUEUE_RESUME

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


@dataclass(frozen=True)
class PausedQueue:
    queue: str
    paused_at: datetime
    # ``by`` as given, else "role (application_name)".
    paused_by: str


def _paused(row: Sequence[Any]) -> PausedQueue:
    queue, paused_at, paused_by = row
    return PausedQueue(queue, paused_at, paused_by)


def pause_queue(session: Session, queue: str, *, by: str | None = None) -> PausedQueue:
    """Pause ``queue`` (idempotent: pausing a paused queue keeps who paused it first,
    and when). ``by`` names who asked; by default the database role and the
    session's application_name. Returns the queue's pause as recorded."""
    params = {"queue": names.queue(queue), "by": actor(by)}
    conn = psycopg_connection(session)
    return _paused(conn.exec_driver_sql(QUEUE_PAUSE, params).one())


pause_queue_async = async_twin(pause_queue)


def resume_queue(session: Session, queue: str, *, by: str | None = None) -> bool:
    """Resume ``queue``; True if it was paused. Its waiting jobs are woken as soon
    as the caller commits. ``by`` names who asked (by default the database role and
    application_name), recorded as the queue's ``resumed_by``."""
    params = {"queue": names.queue(queue), "by": actor(by)}
    conn = psycopg_connection(session)
    return conn.exec_driver_sql(QUEUE_RESUME, params).first() is not None


resume_queue_async = async_twin(resume_queue)


def queue_in_use(session: Session, queue: str) -> bool:
    """Whether anything uses ``queue``: a job waiting, running, failed or cancelled in
    it, a wake-up for it, a consumer that serves it, a schedule that enqueues into
    it, or a pause (past or present). Reads only."""
    conn = psycopg_connection(session)
    return bool(conn.exec_driver_sql(QUEUE_IN_USE, {"queue": names.queue(queue)}).scalar())


queue_in_use_async = async_twin(queue_in_use)


def paused_queues(session: Session) -> list[PausedQueue]:
    """The queues paused now, with who paused them and when, by name."""
    conn = psycopg_connection(session)
    return [_paused(row) for row in conn.exec_driver_sql(QUEUE_PAUSED_LIST).all()]


paused_queues_async = async_twin(paused_queues)
