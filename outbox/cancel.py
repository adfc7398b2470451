"""Asking for a job to be cancelled, inside the caller's transaction."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from hybrid_jobs.outbox.enqueue import psycopg_connection
from hybrid_jobs.outbox.ids import actor
from hybrid_jobs.outbox.policies import refuse
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.schema.queries import JOB_REQUEST_CANCEL
from hybrid_jobs.schema.states import JobState

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def request_cancel(
    session: Session,
    job_id: uuid.UUID,
    *,
    force: bool = False,
    override_policy: bool = False,
    by: str | None = None,
) -> JobState | None:
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

    A running job whose type does not allow it (its handler's
    ``cancel_running=False``, see :mod:`outbox.policies`) is left running: this
    raises :class:`~outbox.policies.NotAllowed`, having changed nothing, unless
    ``override_policy``, which asks it to stop all the same and records ``by``
    (else the database role) as ``cancel_override_by`` on the job. A waiting job is
    cancelled whatever its type's policy.
    """
    if not isinstance(override_policy, bool):
        raise TypeError(f"override_policy must be a bool, not {type(override_policy).__name__}")
    params = {"job_id": job_id, "force": force, "override": override_policy, "by": actor(by)}
    conn = psycopg_connection(session)
    row = conn.exec_driver_sql(JOB_REQUEST_CANCEL, params).first()
    if row is None:
        return refuse(conn, job_id, "cancel")
    return JobState(row[0])


request_cancel_async = async_twin(request_cancel)
