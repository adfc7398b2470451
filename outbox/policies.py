"""What a job type allows: whether its failed and cancelled jobs may be replayed,
whether a running job of it may be asked to stop, and what its cancellation promises.

A handler declares it (``@consumers.handler("capture_payment", replay=False,
cancel_running=False, on_cancel="compensate")``); each consumer records its
handlers' policies in ``job_type_policies`` when it starts, the last to start
winning. The statements of :func:`outbox.retry_job`, :func:`outbox.retry_jobs` and
:func:`outbox.request_cancel` read it there, so every surface (the API, ``jobctl``,
the dashboard, your own code) is held to it without loading the handlers. A type
without a row allows everything.

``override_policy=True`` on those calls does what the policy forbids, and is
recorded: ``job_replays.forced`` for a replay, ``jobs.cancel_override_by`` for a
cancel request.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal

from hybrid_jobs.outbox.enqueue import psycopg_connection
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.schema import names
from hybrid_jobs.schema.queries import JOB_TYPE_POLICY, JOB_TYPE_POLICY_REFUSAL
from hybrid_jobs.schema.states import REPLAYABLE, JobState

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

MAX_ON_CANCEL_LENGTH: Final = 200

Action = Literal["replay", "cancel"]


@dataclass(frozen=True)
class JobTypePolicy:
    """What a job type allows, as its handler declares it."""

    job_type: str
    replay: bool = True
    """Whether its FAILED and CANCELLED jobs may be replayed (retry_job, retry_jobs,
    the API's and the dashboard's Retry, ``jobctl jobs retry``)."""
    cancel_running: bool = True
    """Whether a running job of it may be asked to stop. A waiting one may always
    be cancelled: it has not started."""
    on_cancel: str | None = None
    """What a cancellation of it promises, in words for operators ("compensate": its
    handler undoes what it did; "none": what it did stays done); None: nothing said."""
    updated_at: datetime | None = None
    """When a consumer last changed it (None for a declaration not recorded yet)."""
    updated_by: str | None = None
    """The consumer (worker id) that last changed it."""

    @property
    def allows_all(self) -> bool:
        """Whether it restricts nothing and says nothing: such a type has no row."""
        return self.replay and self.cancel_running and self.on_cancel is None

    def as_row(self) -> dict[str, Any]:
        """The declaration as JOB_TYPE_POLICY_RECORD_MANY takes it."""
        return {
            "job_type": self.job_type,
            "replay": self.replay,
            "cancel_running": self.cancel_running,
            "on_cancel": self.on_cancel,
        }


def declared(
    job_type: str, *, replay: bool, cancel_running: bool, on_cancel: str | None
) -> JobTypePolicy:
    """A handler's declaration, checked: TypeError/ValueError naming the argument."""
    for name, value in (("replay", replay), ("cancel_running", cancel_running)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    if on_cancel is not None:
        on_cancel = names.text("on_cancel", on_cancel, MAX_ON_CANCEL_LENGTH)
    return JobTypePolicy(names.job_type(job_type), replay, cancel_running, on_cancel)


class NotAllowed(Exception):
    """The job's type does not allow this (its handler's ``replay=False`` or
    ``cancel_running=False``): nothing was changed. ``override_policy=True`` does it
    anyway, recorded."""

    def __init__(self, job_id: uuid.UUID, action: Action, state: JobState, policy: JobTypePolicy):
        self.job_id = job_id
        self.action = action
        self.state = state
        self.policy = policy
        what = "may not be replayed" if action == "replay" else "may not be cancelled running"
        promise = "" if policy.on_cancel is None else f"; on cancel: {policy.on_cancel}"
        super().__init__(
            f"job {job_id} ({policy.job_type}, {state}) {what}: its type's policy forbids it"
            f"{promise} (override_policy overrides it, recorded)"
        )


def _policy(row: Any) -> JobTypePolicy:
    return JobTypePolicy(*row)


def job_type_policy(session: Session, job_type: str) -> JobTypePolicy:
    """What ``job_type`` allows, as the consumers last recorded it; a type with no
    policy recorded allows everything (``updated_at`` None). Reads only, and takes
    any str: the type of a stored job is shown whatever it holds, and a name no
    handler could have finds no policy."""
    if not isinstance(job_type, str):
        raise TypeError(f"job_type must be a str, not {type(job_type).__name__}")
    conn = psycopg_connection(session)
    row = conn.exec_driver_sql(JOB_TYPE_POLICY, {"job_type": job_type}).first()
    return JobTypePolicy(job_type) if row is None else _policy(row)


job_type_policy_async = async_twin(job_type_policy)


def refuse(conn: Connection, job_id: uuid.UUID, action: Action) -> JobState | None:
    """After a replay or cancel request that changed nothing: raise
    :class:`NotAllowed` if the job's type's policy is why; else the job's state
    (None: no such job)."""
    row = conn.exec_driver_sql(JOB_TYPE_POLICY_REFUSAL, {"job_id": job_id}).first()
    if row is None:
        return None
    state = JobState(row[0])
    if row[1] is not None:
        policy = _policy(row[1:7])
        if action == "replay" and not policy.replay and state in REPLAYABLE:
            raise NotAllowed(job_id, action, state, policy)
        if action == "cancel" and not policy.cancel_running and state == JobState.RUNNING:
            raise NotAllowed(job_id, action, state, policy)
    return state
