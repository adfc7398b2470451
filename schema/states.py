"""The job state machine: the states, and which transitions are legal.

The same machine is enforced three times: by the CHECK constraint on ``jobs.state``
(migration 0001), by the guarded UPDATEs in :mod:`schema.queries` (each names the
states it may leave), and by this table, which the model-based test checks every
applied transition against. ``docs/state_machine.md`` draws it.

FAILED and CANCELLED are final for the system: no worker, relay or sweeper statement
leaves them. Only an operator's replay (``outbox.retry_job``) does, back to QUEUED.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    RETRY_WAIT = "RETRY_WAIT"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCEL_REQUESTED = "CANCEL_REQUESTED"
    CANCELLED = "CANCELLED"


CLAIMABLE = frozenset({JobState.QUEUED, JobState.RETRY_WAIT})
LEASED = frozenset({JobState.RUNNING, JobState.CANCEL_REQUESTED})
TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
# What an operator may put back in the queue (outbox.retry_job). A success is not
# replayed: enqueue a new job instead.
REPLAYABLE = frozenset({JobState.FAILED, JobState.CANCELLED})

# Every transition a statement in schema/queries/ can make, and nothing else.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    # claim; a cancel request on a job nobody holds cancels it outright
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED}),
    JobState.RETRY_WAIT: frozenset({JobState.RUNNING, JobState.CANCELLED}),
    # outcomes reported by the lease holder, the sweeper, a graceful give-back,
    # a cancel request
    JobState.RUNNING: frozenset(
        {
            JobState.SUCCEEDED,
            JobState.RETRY_WAIT,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.QUEUED,
            JobState.CANCEL_REQUESTED,
        }
    ),
    # the worker finishes anyway, gives up, acknowledges the cancel, or its lease
    # lapses (the sweeper cancels); a give-back during shutdown cancels too, since
    # nobody wants the job run again
    JobState.CANCEL_REQUESTED: frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    # an operator's replay only (see OPERATOR_ONLY)
    JobState.FAILED: frozenset({JobState.QUEUED}),
    JobState.CANCELLED: frozenset({JobState.QUEUED}),
}

# The transitions above that only an operator's action makes.
OPERATOR_ONLY: frozenset[tuple[JobState, JobState]] = frozenset(
    (state, JobState.QUEUED) for state in REPLAYABLE
)


def is_legal(before: JobState, after: JobState, *, by_operator: bool = False) -> bool:
    """Whether one statement may take a job from ``before`` to ``after``; the
    replay transitions count only for an operator's statement."""
    if before == after:
        return True
    if after not in TRANSITIONS[before]:
        return False
    return by_operator or (before, after) not in OPERATOR_ONLY
