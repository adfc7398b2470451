"""Editing a job that has not started yet, inside the caller's SQLAlchemy transaction.

::

    with Session(engine) as session, session.begin():
        outbox.update_job(session, job_id, priority=10, run_after=timedelta(minutes=5))

What it promises:

- Only a job that waits to run is changed: QUEUED (held for approval or for its
  parents too) or RETRY_WAIT. Once a claim has taken it (RUNNING,
  CANCEL_REQUESTED) or it has ended, the edit is refused with
  :class:`JobNotEditable`, which says what the job is, and nothing changes.
- One guarded statement: a claim racing the edit either starts the job with the
  old values (and the edit is refused) or, after it, with the new ones; never with
  some of each.
- Only what is given changes; ``payload=None`` stores JSON null. A job on a stored
  input (``payload_ref``) takes no payload: it runs on the input's content.
- The job's wake-up follows: a new ``run_after`` replaces its wake-ups with one due
  then (it runs neither earlier nor never), a new ``priority`` moves its pending
  wake-up up or down the relay's order. The relay hears of it at commit.
- Arguments are checked as enqueue checks them, before anything is written.
- ``updated_at`` records when. Nothing here commits.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from hybrid_jobs.outbox.enqueue import psycopg_connection
from hybrid_jobs.outbox.explain import JobNotFound
from hybrid_jobs.outbox.ids import job_id_arg
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.outbox.validation import (
    JsonDefault,
    check_max_attempts,
    check_priority,
    encode_payload,
    max_payload_bytes,
    start_arg,
)
from hybrid_jobs.schema.queries import JOB_EDIT, JOB_EDIT_HAND_ON, JOB_EDIT_REFUSAL
from hybrid_jobs.schema.states import CLAIMABLE, LEASED, JobState

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


class Unset:
    """The default of a field not to change (None is a value: a JSON null payload)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = Unset()


class JobNotEditable(Exception):
    """The job cannot be edited as asked: it has started (RUNNING, CANCEL_REQUESTED)
    or ended, or, for a new ``run_after``, its start belongs to what holds it (an
    approval, its parents). ``state`` is what it is now; nothing was changed."""

    def __init__(self, job_id: uuid.UUID, state: JobState, why: str) -> None:
        super().__init__(f"job {job_id} cannot be edited: {why}")
        self.job_id = job_id
        self.state = state


def _params(
    payload: Any,
    priority: int | Unset,
    run_after: datetime | timedelta | Unset,
    max_attempts: int | Unset,
    json_default: JsonDefault | None,
) -> dict[str, Any]:
    """The statement's parameters, each checked as enqueue checks it (None: not given)."""
    params: dict[str, Any] = {
        "payload": None,
        "priority": None,
        "run_after": None,
        "delay_seconds": None,
        "max_attempts": None,
    }
    if not isinstance(payload, Unset):
        params["payload"] = encode_payload(payload, max_payload_bytes(), json_default)
    if not isinstance(priority, Unset):
        params["priority"] = check_priority(priority)
    if not isinstance(run_after, Unset):
        if run_after is None:
            raise TypeError("run_after must be a datetime or a timedelta, not None")
        params["run_after"], params["delay_seconds"] = start_arg(run_after)
    if not isinstance(max_attempts, Unset):
        params["max_attempts"] = check_max_attempts(max_attempts)
    if all(value is None for value in params.values()):
        raise ValueError("nothing to edit: give payload, priority, run_after or max_attempts")
    return params


def _refusal(job_id: uuid.UUID, params: dict[str, Any], row: Any) -> Exception:
    """Why the guarded statement changed nothing, from the job as it is now."""
    if row is None:
        return JobNotFound(job_id)
    state, approval, parents_pending, attempts, expires_at, payload_ref = row
    state = JobState(state)
    if state in LEASED:
        return JobNotEditable(job_id, state, f"it has started (it is {state})")
    if state not in CLAIMABLE:
        return JobNotEditable(job_id, state, f"it has ended ({state})")
    if params["payload"] is not None and payload_ref is not None:
        return JobNotEditable(
            job_id,
            state,
            f"it runs on stored input {payload_ref} (payload_ref), whose content is its"
            " payload: a payload cannot be set (enqueue a job on another input instead)",
        )
    moving = params["run_after"] is not None or params["delay_seconds"] is not None
    if moving and approval == "REQUIRED":
        return JobNotEditable(
            job_id, state, "it waits for approval, which makes it due: run_after cannot be set"
        )
    if moving and parents_pending > 0:
        return JobNotEditable(
            job_id,
            state,
            "it waits for its parents, whose end makes it due: run_after cannot be set",
        )
    wanted = params["max_attempts"]
    if wanted is not None and attempts >= wanted:
        return ValueError(
            f"max_attempts ({wanted}) must be more than the {attempts} attempts the job"
            " has made, or it could never run again"
        )
    if moving and expires_at is not None:
        return ValueError(
            f"run_after is not before expires ({expires_at.isoformat()}): no attempt"
            " starts at or after the deadline, so the job could never run"
        )
    # It was claimed and has been put back to wait between the statement and this read.
    return JobNotEditable(job_id, state, f"it changed while it was edited (now {state}): try again")


def update_job(
    session: Session,
    job_id: uuid.UUID | str,
    *,
    payload: Any = UNSET,
    priority: int | Unset = UNSET,
    run_after: datetime | timedelta | Unset = UNSET,
    max_attempts: int | Unset = UNSET,
    json_default: JsonDefault | None = None,
) -> datetime:
    """Change a job that has not started yet; only the fields given change (see the
    module's docstring). Returns the job's ``run_after`` afterwards.

    ``payload`` is any JSON value (``None`` stores JSON null) and ``json_default``
    means what enqueue's does; ``priority``: higher runs first; ``run_after``: an
    aware datetime, or a timedelta from the database's now; ``max_attempts``: the
    whole attempt budget, counting the attempts made (it must leave at least one).
    For a job of an ordered key, a later ``run_after`` keeps the key's later jobs
    waiting behind it, as it would at enqueue; an earlier one still waits its turn.

    Raises ``TypeError``/``ValueError`` for an unacceptable argument (nothing
    written), :class:`JobNotEditable` once the job has started or ended, or for a
    ``run_after`` of a job held for approval or for its parents, and
    :class:`outbox.JobNotFound` for an unknown id. Never commits.
    """
    ident = job_id_arg(job_id)
    params = _params(payload, priority, run_after, max_attempts, json_default)
    params["job_id"] = ident
    conn = psycopg_connection(session)
    row = conn.exec_driver_sql(JOB_EDIT, params).first()
    if row is None:
        found = conn.exec_driver_sql(JOB_EDIT_REFUSAL, {"job_id": ident}).first()
        raise _refusal(ident, params, found)
    if params["run_after"] is not None or params["delay_seconds"] is not None:
        # Later than now, it passes the turn of a freed key or resource on.
        conn.exec_driver_sql(JOB_EDIT_HAND_ON, {"job_id": ident})
    edited_run_after: datetime = row[1]
    return edited_run_after


update_job_async = async_twin(update_job)
