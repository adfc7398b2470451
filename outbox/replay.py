"""Replaying failed and cancelled jobs, inside the caller's SQLAlchemy transaction.

::

    with Session(engine) as session, session.begin():
        outbox.retry_job(session, job_id, by="alice")            # one job
        outbox.retry_jobs(session, queue="mail", error_code="SMTP_DOWN")  # by filter

A replay moves a FAILED or CANCELLED job back to QUEUED, due now, with a wake-up,
in one guarded statement. What it promises:

- Only FAILED and CANCELLED jobs move; a job in any other state (waiting, running,
  succeeded) is left exactly as it was.
- The history stays: ``attempt_count`` and every ``job_attempts`` row are kept, and
  the next attempt carries on the numbering (a job that failed its 5th attempt runs
  its 6th).
- A fresh attempt budget of the job's own size: ``max_attempts`` becomes
  ``attempt_count`` plus the budget the job had for its last run (its
  ``max_attempts`` less the attempts made before its previous replay, if any). A
  job that failed after 5 of 5 attempts gets 5 more, and so on at every replay. A job
  no handler ever claimed (cancelled while waiting, ``max_attempts`` still unset)
  keeps it unset: its handler's budget applies at claim, as for a new job.
- What belonged to the finished run is cleared (``finished_at``, ``result``,
  ``progress``, ``delay_reason``, ``cancel_requested_at``); ``last_error_code`` and
  ``last_error_message`` stay until a new attempt replaces them.
- A job that ended because it was not started by its deadline (CANCELLED, code
  ``EXPIRED``) loses that deadline (``expires_at`` becomes unset): kept, it would
  be ended again by the relay's next round, never started. Any other job keeps
  its ``expires_at``, passed or not.
- A job's finished resumable steps (``job.step``) are kept: the replayed job
  resumes at its first unfinished step. ``reset_steps=True`` clears them, in the
  same transaction, so that it starts over from its first step.
- A ``job_replays`` row records who asked (``by``, else the database role and the
  session's ``application_name``, as ``"role (app)"``), when (the database clock),
  from which state, and after how many attempts.
- A job whose type does not allow replay (its handler's ``replay=False``, see
  :mod:`outbox.policies`) is left as it is: ``retry_job`` raises
  :class:`~outbox.policies.NotAllowed`, ``retry_jobs`` passes it over and counts it
  (``not_allowed``). ``override_policy=True`` replays it all the same, and its
  ``job_replays`` row says ``forced``.
- The relay hears of the wake-up when the caller commits. Nothing here commits.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from hybrid_jobs import defaults
from hybrid_jobs.outbox.enqueue import psycopg_connection
from hybrid_jobs.outbox.ids import actor, job_id_arg
from hybrid_jobs.outbox.policies import refuse
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.schema import names
from hybrid_jobs.schema.queries import JOB_REPLAY, JOB_REPLAY_MATCHING, JOB_STEP_CLEAR
from hybrid_jobs.schema.states import REPLAYABLE, JobState

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

MAX_REPLAY_BATCH = defaults.MAX_REPLAY_BATCH
MAX_ERROR_CODE_LENGTH = 200
# The states a replay moves a job out of, and retry_jobs' default.
REPLAYABLE_STATES: Final = REPLAYABLE


class Replayed(int):
    """How many jobs :func:`retry_jobs` replayed (an int), and ``not_allowed``: how
    many matching jobs it passed over because their type does not allow replay
    (counted up to ``MAX_REPLAY_BATCH`` per queue; 0 with ``override_policy``)."""

    not_allowed: int

    def __new__(cls, replayed: int, not_allowed: int = 0) -> Replayed:
        self = super().__new__(cls, replayed)
        self.not_allowed = not_allowed
        return self


def _states(states: Collection[JobState | str]) -> list[str]:
    if isinstance(states, str):
        raise TypeError("states must be a collection of states, not a str")
    found = []
    for state in states:
        if state not in REPLAYABLE_STATES:
            raise ValueError(f"states may hold FAILED and CANCELLED only, not {state!r}")
        found.append(str(JobState(state)))
    if not found:
        raise ValueError("states must name FAILED, CANCELLED or both")
    return sorted(set(found))


def _flag(name: str, value: bool) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def _filters(
    queue: str | None,
    job_type: str | None,
    error_code: str | None,
    finished_after: datetime | None,
    limit: int,
    by: str | None,
    states: Collection[JobState | str],
) -> dict[str, Any]:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if not 1 <= limit <= MAX_REPLAY_BATCH:
        raise ValueError(f"limit must be between 1 and {MAX_REPLAY_BATCH}")
    if finished_after is not None:
        if not isinstance(finished_after, datetime):
            raise TypeError(
                f"finished_after must be a datetime, not {type(finished_after).__name__}"
            )
        if finished_after.tzinfo is None or finished_after.utcoffset() is None:
            raise ValueError(
                "finished_after must be timezone-aware (a naive datetime is ambiguous)"
            )
    return {
        "queue": None if queue is None else names.queue(queue),
        "job_type": None if job_type is None else names.job_type(job_type),
        "error_code": (
            None
            if error_code is None
            else names.text("error_code", error_code, MAX_ERROR_CODE_LENGTH)
        ),
        "finished_after": finished_after,
        "limit": limit,
        "by": actor(by),
        "states": _states(states),
    }


def retry_job(
    session: Session,
    job_id: uuid.UUID | str,
    *,
    by: str | None = None,
    reset_steps: bool = False,
    override_policy: bool = False,
) -> JobState | None:
    """Replay one FAILED or CANCELLED job (see the module's docstring).

    Returns the job's state afterwards: QUEUED if it was replayed, its unchanged
    state if it was in any other one, None for an unknown id. ``job_id`` is a UUID
    or its text (anything else raises ``ValueError``/``TypeError`` naming it);
    ``by`` names who asked (at most 200 characters); ``reset_steps`` clears the
    job's finished steps, so it starts over instead of resuming. Raises
    :class:`~outbox.policies.NotAllowed`, having changed nothing, when the job's
    type does not allow replay, unless ``override_policy`` (recorded as forced).
    Never commits.
    """
    ident = job_id_arg(job_id)
    params = {
        "job_id": ident,
        "by": actor(by),
        "override": _flag("override_policy", override_policy),
    }
    conn = psycopg_connection(session)
    replayed = conn.exec_driver_sql(JOB_REPLAY, params).first()
    if replayed is not None:
        if reset_steps:
            conn.exec_driver_sql(JOB_STEP_CLEAR, {"job_ids": [replayed[0]]})
        return JobState.QUEUED
    return refuse(conn, ident, "replay")


retry_job_async = async_twin(retry_job)


def retry_jobs(
    session: Session,
    *,
    queue: str | None = None,
    job_type: str | None = None,
    error_code: str | None = None,
    finished_after: datetime | None = None,
    limit: int = 1000,
    by: str | None = None,
    states: Collection[JobState | str] = REPLAYABLE_STATES,
    reset_steps: bool = False,
    override_policy: bool = False,
) -> Replayed:
    """Replay the FAILED and CANCELLED jobs (``states``: only those of the states given) that
    match every filter given (None: any): of ``queue``, of ``job_type``, whose
    ``last_error_code`` is ``error_code``, finished after ``finished_after`` (an aware
    datetime); the oldest finished first, at most ``limit`` (1 to 100000) in one
    statement. Returns how many were replayed. Rows another transaction holds right now
    are skipped (call again for them). Filters are checked before anything is written.
    ``reset_steps`` clears the replayed jobs' finished steps (see :func:`retry_job`).
    Jobs whose type does not allow replay are passed over (``limit`` counts the
    others) and counted in the answer's ``not_allowed``, unless ``override_policy``
    replays them too (recorded as forced). Never commits.
    """
    params = _filters(queue, job_type, error_code, finished_after, limit, by, states)
    params["override"] = _flag("override_policy", override_policy)
    conn = psycopg_connection(session)
    replayed, not_allowed = conn.exec_driver_sql(JOB_REPLAY_MATCHING, params).one()
    if reset_steps and replayed:
        conn.exec_driver_sql(JOB_STEP_CLEAR, {"job_ids": replayed})
    return Replayed(len(replayed), not_allowed or 0)


retry_jobs_async = async_twin(retry_jobs)
