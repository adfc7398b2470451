"""Approving or rejecting a job enqueued with ``needs_approval``, inside the
caller's SQLAlchemy transaction.

::

    with Session(engine) as session, session.begin():
        job_id = outbox.enqueue(session, "deploy", {"to": "prod"}, needs_approval=True)
    # ... it waits as APPROVAL_REQUIRED (outbox.explain), never claimed ...
    with Session(engine) as session, session.begin():
        outbox.approve(session, job_id, by="alice")     # due now, woken at commit
        # or: outbox.reject(session, job_id, by="alice", reason="not on a Friday")

Such a job is enqueued without a wake-up and held never due (``run_after`` is
far in the future), so no claim, re-waker, orphan walk or test runner takes it.
Approval is one guarded statement (still QUEUED, not decided yet) that makes it
due and writes its wake-up; rejection one that cancels it (``last_error_code``
``REJECTED``, the reason as its message). Both record who (``by``, else the
database role and ``application_name``) and when, shown by ``outbox.explain``.
A second decision, or one on a job that never needed one, is refused with
:class:`NotAwaitingApproval`, which says what the job is. Replaying a rejected
job (``outbox.retry_job``) puts it back to wait for approval again.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hybrid_jobs.outbox.enqueue import psycopg_connection
from hybrid_jobs.outbox.explain import JobNotFound
from hybrid_jobs.outbox.ids import actor, job_id_arg
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.schema import names
from hybrid_jobs.schema.queries import JOB_APPROVAL, JOB_APPROVE, JOB_REJECT
from hybrid_jobs.schema.states import JobState

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

MAX_REASON_LENGTH = 2000


class NotAwaitingApproval(Exception):
    """The job does not wait for approval (any more): it was approved or rejected
    already, cancelled, or never needed approval. ``state`` and ``approval``
    (None, APPROVED, REJECTED, REQUIRED) say what it is now."""

    def __init__(
        self,
        job_id: uuid.UUID,
        state: JobState,
        approval: str | None,
        by: str | None,
        at: datetime | None,
    ) -> None:
        if approval in ("APPROVED", "REJECTED"):
            why = f"was {approval.lower()} already, by {by} at {at:%Y-%m-%d %H:%M:%S%z}"
        elif approval is None:
            why = "was not enqueued with needs_approval"
        else:
            why = f"is {state}"
        super().__init__(f"job {job_id} does not wait for approval: it {why}")
        self.job_id = job_id
        self.state = state
        self.approval = approval
        self.by = by
        self.at = at


def _refusal(job_id: uuid.UUID, row: Any) -> Exception:
    if row is None:
        return JobNotFound(job_id)
    return NotAwaitingApproval(job_id, JobState(row[0]), row[1], row[2], row[3])


def _reason(value: object) -> str | None:
    return None if value is None else names.text("reason", value, MAX_REASON_LENGTH)


def approve(session: Session, job_id: uuid.UUID | str, *, by: str | None = None) -> None:
    """Let a job that waits for approval run: it is due now and woken when the
    caller commits. Raises :class:`NotAwaitingApproval` (nothing changed) when it
    does not wait for approval, :class:`outbox.JobNotFound` for an unknown id."""
    ident = job_id_arg(job_id)
    params = {"job_id": ident, "by": actor(by)}
    conn = psycopg_connection(session)
    if conn.exec_driver_sql(JOB_APPROVE, params).first() is None:
        raise _refusal(ident, conn.exec_driver_sql(JOB_APPROVAL, {"job_id": ident}).first())


def reject(
    session: Session, job_id: uuid.UUID | str, *, by: str | None = None, reason: str | None = None
) -> JobState:
    """Cancel a job that waits for approval, for good: CANCELLED, with
    ``last_error_code`` REJECTED and ``reason`` as its message. Returns
    CANCELLED; refuses like :func:`approve`."""
    ident = job_id_arg(job_id)
    params = {"job_id": ident, "by": actor(by), "reason": _reason(reason)}
    conn = psycopg_connection(session)
    row = conn.exec_driver_sql(JOB_REJECT, params).first()
    if row is None:
        raise _refusal(ident, conn.exec_driver_sql(JOB_APPROVAL, {"job_id": ident}).first())
    return JobState(row[0])


approve_async = async_twin(approve)
reject_async = async_twin(reject)
