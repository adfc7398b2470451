"""Asking for a job to be cancelled, inside the caller's transaction."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from hybrid_jobs.outbox.enqueue import psycopg_connection
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.schema.queries import JOB_REQUEST_CANCEL, JOB_STATE
from hybrid_jobs.schema.states import JobState

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def request_cancel(session: Session, job_id: uuid.UUID, *, force: bool = False) -> JobState | None:
    """Cancel a job that is waiting; ask a running one to stop.

    Returns the job's state afterwards: CANCELLED (it had not started, or was
    waiting for a retry), CANCEL_REQUESTED (it is running: its handler sees
    ``job.cancel_requested`` at the next heartbeat and may stop, or finish anyway),
    the final state of a job that had already finished, or None for an unknown id.
    Like enqueue, it writes through the session's transaction and never commits.

    ``force=True`` does not leave a running job to its handler's good will: at the
    next heartbeat of the worker holding it (within the consumer's heartbeat
    interval, a third of the lease by default) an async handler is interrupted
    (``CancelledError`` at its current ``await``; its ``finally`` blocks run), and
    the lease ends CANCELLED through the fence. A plain function cannot be
    interrupted in its thread: its lease ends CANCELLED when it returns (its result
    discarded), and under ``consumer --processes`` its process is replaced if it has
    not returned within ``--force-cancel-grace``. A job whose cancel was requested
    already is made forced. A waiting job is cancelled at once, force or not. An
    attempt whose outcome was reached before its worker learned of the force keeps
    that outcome.
    """
    conn = psycopg_connection(session)
    row = conn.exec_driver_sql(JOB_REQUEST_CANCEL, {"job_id": job_id, "force": force}).first()
    if row is None:
        row = conn.exec_driver_sql(JOB_STATE, {"job_id": job_id}).first()
    return None if row is None else JobState(row[0])


request_cancel_async = async_twin(request_cancel)
