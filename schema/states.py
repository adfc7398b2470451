"""The job state machine: the states, every statement that moves a job between
them, and so the legal transitions.

The same machine is enforced three times: by the CHECK constraint on ``jobs.state``
(migration 0001), by the guarded UPDATEs in :mod:`schema.queries` (each names the
states it may leave), and by :data:`OPERATIONS`, the index below of which statement
makes which edge and who runs it, which the model-based test checks every applied
transition against, statement by statement. ``docs/design/state-machine.md`` draws the
machine and tabulates the index (``python -m hybrid_jobs.schema.docs`` writes the table).

FAILED and CANCELLED are final for the system: no worker, relay or sweeper statement
leaves them. Only an operator's replay (``outbox.retry_job``) does, back to QUEUED.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final


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


class DelayReason(StrEnum):
    """``jobs.delay_reason``: why a consumer last turned a due job down
    (``JOB_CLAIM_MANY``); the claim that takes it clears it. DEPENDENCY alone is
    written at enqueue, for a job held until its parents are done, and SNOOZED by the
    outcome of an attempt whose handler raised ``Snooze``."""

    QUEUE_PAUSED = "QUEUE_PAUSED"
    NO_HANDLER = "NO_HANDLER"  # no handler for its type in the consumer it met
    TENANT_CAP = "TENANT_CAP"  # its tenant had no free slot
    RATE_LIMITED = "RATE_LIMITED"  # its rate limit had no token for it
    KEY_BUSY = "KEY_BUSY"  # key_limit jobs of its key held a lease
    KEY_ORDER = "KEY_ORDER"  # an earlier ordered job of its key had not finished
    # Set at enqueue (after=), cleared by the end of its last parent: it waits,
    # held not due, for parents that have not all succeeded.
    DEPENDENCY = "DEPENDENCY"
    # its tenant is dedicated (tenant_limits.runners) and the consumer it met does
    # not name it (consumer --tenant)
    NO_AUTHORIZED_RUNNER = "NO_AUTHORIZED_RUNNER"
    RESOURCE_BUSY = "RESOURCE_BUSY"  # another job's lease held its resource
    RESOURCE_UNCERTAIN = "RESOURCE_UNCERTAIN"  # its resource's holder vanished: unresolved
    SNOOZED = "SNOOZED"  # its handler said "not yet": it waits for run_after, attempt refunded
    # its job type's concurrency limit (a handler's global_limit) had no free slot
    CONCURRENCY_LIMIT = "CONCURRENCY_LIMIT"
    # its queue's concurrency limit (consumer --queue-limit) had no free slot
    QUEUE_CONCURRENCY_LIMIT = "QUEUE_CONCURRENCY_LIMIT"
    # its weight is above the whole concurrency of the consumer it met
    WEIGHT_OVER_CONCURRENCY = "WEIGHT_OVER_CONCURRENCY"


class HeldReason(StrEnum):
    """``fair_shares.held_reason``: why the relay's last pass with room held a
    tenant's due wake-ups back (``OUTBOX_WAKE_QUEUE``); NULL when it did not."""

    QUEUE_PAUSED = "QUEUE_PAUSED"
    TENANT_CAP = "TENANT_CAP"  # no free slot beyond its wake-ups in flight
    WINDOW = "WINDOW"  # the queue's window was full, or this tenant got what room there was
    FAIR_SHARE = "FAIR_SHARE"  # other tenants went first (priority or share) and left none


@dataclass(frozen=True)
class Wait:
    """A reason a QUEUED or RETRY_WAIT job waits that is kept on its row: where it is
    kept, who writes it and what ends it (``docs/design/state-machine.md`` tabulates them,
    generated; ``outbox.explain`` reports each under the same code, with the rest
    it reads from other tables)."""

    code: str
    kept: str
    set_by: str
    ends: str


# Every DelayReason, and the approval, which is a column of its own. A job waiting
# for any of them stays in its state: none is a state of the machine.
WAITS: Final[tuple[Wait, ...]] = (
    Wait(
        "APPROVAL_REQUIRED",
        "`approval = 'REQUIRED'`, held (`run_after` never due, no wake-up)",
        "enqueue (`needs_approval=True`), or a replay of a rejected job",
        "`JOB_APPROVE` (due now, a wake-up), or `JOB_REJECT` (CANCELLED, `REJECTED`)",
    ),
    Wait(
        DelayReason.DEPENDENCY,
        "`parents_pending > 0`, held; `delay_reason` `DEPENDENCY`",
        "enqueue (`after=`), or a replay of a child whose parents are not all settled",
        "the end of its last parent (trigger `jobs_release_dependants`): due, woken;"
        " a parent FAILED or CANCELLED under `on_parent_failure='cancel'`:"
        " QUEUED → CANCELLED, `PARENT_FAILED`",
    ),
    Wait(
        DelayReason.SNOOZED,
        "`delay_reason`, since `delay_since`; not due until `run_after`, its wake-up due then",
        "`JOB_FINISH_MANY`, for an attempt whose handler raised `Snooze` (attempt refunded)",
        "`run_after` passing: its wake-up brings a claim, which clears it",
    ),
    Wait(
        DelayReason.RESOURCE_BUSY,
        "`delay_reason`, and `resource_holds` names the holder",
        "`JOB_CLAIM_MANY`, turning it down",
        "the holder's clean end (`JOB_FINISH_MANY`, `JOB_GIVE_BACK_MANY`) wakes the next",
    ),
    Wait(
        DelayReason.RESOURCE_UNCERTAIN,
        "`delay_reason`; the hold has `uncertain_since`",
        "`JOB_CLAIM_MANY`, turning it down while the holder's expired lease is unresolved",
        "`RESOURCE_RESOLVE` (an operator, or a handler's `reconcile=` hook): a wake-up",
    ),
    Wait(
        DelayReason.NO_AUTHORIZED_RUNNER,
        "`delay_reason`; a wake-up only if a live consumer naming the tenant could take it",
        "`JOB_CLAIM_MANY` on a consumer not naming its dedicated tenant",
        "that wake-up, or, parked, a consumer naming the tenant (`consumer --tenant`)"
        " starting: `JOB_WAKE_PARKED`",
    ),
    Wait(
        DelayReason.NO_HANDLER,
        "`delay_reason`; a wake-up only if a live consumer with the handler could take it",
        "`JOB_CLAIM_MANY` on a consumer without a handler for its type",
        "that wake-up, or, parked, a consumer with the handler starting: `JOB_WAKE_PARKED`",
    ),
    Wait(
        DelayReason.QUEUE_PAUSED,
        "`delay_reason`",
        "`JOB_CLAIM_MANY` while its queue is paused",
        "a fresh wake-up, which the relay holds back until `QUEUE_RESUME`",
    ),
    Wait(
        DelayReason.TENANT_CAP,
        "`delay_reason`",
        "`JOB_CLAIM_MANY` while its tenant has no free slot",
        "a fresh wake-up, which the relay sends once the tenant has a free slot",
    ),
    Wait(
        DelayReason.RATE_LIMITED,
        "`delay_reason`; its wake-up is due when its token is",
        "`JOB_CLAIM_MANY` finding no token of its rate limit",
        "its token is due: the wake-up written with the refusal",
    ),
    Wait(
        DelayReason.KEY_BUSY,
        "`delay_reason`, and `key_usage` counts the key's leases",
        "`JOB_CLAIM_MANY` while `key_limit` jobs of its key hold a lease",
        "the end of one of those leases wakes the next",
    ),
    Wait(
        DelayReason.KEY_ORDER,
        "`delay_reason`",
        "`JOB_CLAIM_MANY` while an earlier ordered job of its key has not finished",
        "that job's end (or its replay, under `strict`) wakes the next",
    ),
    Wait(
        DelayReason.CONCURRENCY_LIMIT,
        "`delay_reason`, and `concurrency_limits` counts its type's leases",
        "`JOB_CLAIM_MANY` while its type's `global_limit` jobs hold a lease",
        "the end of one of those leases wakes the next",
    ),
    Wait(
        DelayReason.QUEUE_CONCURRENCY_LIMIT,
        "`delay_reason`, and `queue_limits` counts its queue's leases",
        "`JOB_CLAIM_MANY` while its queue's limit (`consumer --queue-limit`) of jobs hold a lease",
        "the end of one of those leases wakes the next",
    ),
    Wait(
        DelayReason.WEIGHT_OVER_CONCURRENCY,
        "`delay_reason`; its wake-up due again after the refusal backstop",
        "`JOB_CLAIM_MANY` on a consumer whose `--concurrency` is below the job's weight",
        "a consumer with room for its weight claiming it (the wake-up tries again), or"
        " an operator cancelling it",
    ),
)

# (before, after); None is no row: before the enqueue, after retention deleted it.
Edge = tuple[JobState | None, JobState | None]


@dataclass(frozen=True)
class Operation:
    """One statement that moves jobs: its name in :mod:`schema.queries`, the
    functions that run it (``module:qualname``, each reaching the statement itself
    or through the consumer's or producer's store), and when it makes each edge it
    makes. A statement that writes jobs without moving one (heartbeat, progress,
    a claim's refusal) has no operation: it must never change a state."""

    statement: str
    callers: tuple[str, ...]
    moves: Mapping[Edge, str]


_NEW = _GONE = None
_QUEUED = JobState.QUEUED
_RUNNING = JobState.RUNNING
_RETRY_WAIT = JobState.RETRY_WAIT
_SUCCEEDED = JobState.SUCCEEDED
_FAILED = JobState.FAILED
_CANCEL_REQUESTED = JobState.CANCEL_REQUESTED
_CANCELLED = JobState.CANCELLED
_REPLAYS: tuple[Edge, ...] = ((_FAILED, _QUEUED), (_CANCELLED, _QUEUED))

# Every statement that moves a job, as Oban's engine lists a job's lifecycle: one
# entry per operation. Nothing else in this project changes jobs.state, but for the
# trigger jobs_release_dependants (migration 0015), which runs inside whichever of
# these ends a parent and makes only an edge listed already: QUEUED -> CANCELLED,
# code PARENT_FAILED, for the jobs waiting for a parent that ended FAILED or
# CANCELLED under on_parent_failure 'cancel'; and for the SQL function
# hybrid_jobs_enqueue (migration 0027), which the user's SQL calls (no code of this
# project does) and which makes only (new) -> QUEUED, inserting what
# JOB_INSERT_MANY inserts for one job.
OPERATIONS: Final[tuple[Operation, ...]] = (
    Operation(
        "JOB_INSERT_MANY",
        ("outbox.enqueue:enqueue_many", "relay.schedules:_enqueue"),
        {(_NEW, _QUEUED): "enqueued, with its wake-up, in the producer's or scheduler's commit"},
    ),
    Operation(
        "JOB_INSERT_PLAIN_MANY",
        ("outbox.enqueue:enqueue_many", "relay.schedules:_enqueue"),
        {(_NEW, _QUEUED): "a batch with no tags and no after= enqueued, by the shorter insert"},
    ),
    Operation(
        "JOB_COPY",
        ("outbox.bulk:copy_jobs",),
        {(_NEW, _QUEUED): "a large batch of plain jobs enqueued by COPY"},
    ),
    Operation(
        "JOB_COPY_TAGGED",
        ("outbox.bulk:copy_jobs",),
        {(_NEW, _QUEUED): "a large batch of plain jobs, some with tags, enqueued by COPY"},
    ),
    Operation(
        "JOB_INSERT_UNIQUE_MANY",
        ("outbox.enqueue:insert_jobs", "outbox.enqueue:_holders"),
        {(_NEW, _QUEUED): "a batch with a key held under a scope (unique=) enqueued"},
    ),
    Operation(
        "JOB_INSERT_REF_MANY",
        ("outbox.enqueue:insert_jobs",),
        {(_NEW, _QUEUED): "a batch with a job on a stored input (payload_ref=) enqueued"},
    ),
    Operation(
        "JOB_INSERT_UNIQUE_REF_MANY",
        ("outbox.enqueue:insert_jobs",),
        {(_NEW, _QUEUED): "a batch with a stored input and a scoped key enqueued"},
    ),
    Operation(
        "JOB_DEBOUNCE_MANY",
        ("outbox.enqueue:enqueue_many",),
        {(_NEW, _QUEUED): "a debounced enqueue whose key no unstarted job holds"},
    ),
    Operation(
        "JOB_CLAIM_MANY",
        (
            "consumers.claimer:Claimer._claim",
            "consumers.testing:JobRunner.run_due",
        ),
        {
            (_QUEUED, _RUNNING): "a woken consumer claims it: generation+1, attempt+1, lease",
            (_RETRY_WAIT, _RUNNING): "a woken consumer claims it once its run_after has passed",
            (_QUEUED, _CANCELLED): "woken past its deadline (expires): code EXPIRED, never started",
            (_RETRY_WAIT, _CANCELLED): "woken for a retry past its deadline: code EXPIRED",
        },
    ),
    Operation(
        "JOB_CLAIM_PLAIN_MANY",
        (
            "consumers.claimer:Claimer._claim",
            "consumers.testing:JobRunner.run_due",
        ),
        {
            (_QUEUED, _RUNNING): "a woken consumer claims a plain job (no key, resource, "
            "deadline or rate limit) by the shorter claim",
            (_RETRY_WAIT, _RUNNING): "a plain job's retry, claimed by the shorter claim",
        },
    ),
    Operation(
        "JOB_FINISH_MANY",
        (
            "consumers.reporter:Reporter.record",
            "consumers.testing:JobRunner._record",
        ),
        {
            (_RUNNING, _SUCCEEDED): "the holder's handler returned",
            (_RUNNING, _RETRY_WAIT): "the holder's attempt failed with attempts left",
            (_RUNNING, _QUEUED): "the handler raised Snooze: due later, the attempt refunded",
            (_RUNNING, _FAILED): "Permanent, or a failed last attempt",
            (_RUNNING, _CANCELLED): "the handler raised Cancel",
            (_CANCEL_REQUESTED, _SUCCEEDED): "the handler finished anyway",
            (_CANCEL_REQUESTED, _FAILED): "the handler raised Permanent",
            (_CANCEL_REQUESTED, _CANCELLED): "the handler stopped: Cancel, Snooze, or any "
            "retryable error",
        },
    ),
    Operation(
        "JOB_FINISH_PLAIN_MANY",
        (
            "consumers.reporter:Reporter.record",
            "consumers.testing:JobRunner._record",
        ),
        {
            (_RUNNING, _SUCCEEDED): "a plain lease's (no key, no resource) handler returned, "
            "recorded by the shorter outcome",
            (_RUNNING, _RETRY_WAIT): "a plain lease's attempt failed with attempts left",
            (_RUNNING, _QUEUED): "a plain lease's handler raised Snooze",
            (_RUNNING, _FAILED): "a plain lease's Permanent, or its failed last attempt",
            (_RUNNING, _CANCELLED): "a plain lease's handler raised Cancel",
            (_CANCEL_REQUESTED, _SUCCEEDED): "a plain lease's handler finished anyway",
            (_CANCEL_REQUESTED, _FAILED): "a plain lease's handler raised Permanent",
            (_CANCEL_REQUESTED, _CANCELLED): "a plain lease's handler stopped",
        },
    ),
    Operation(
        "JOB_FINISH_MANY_IN_TX",
        ("consumers.job:Job.transaction",),
        {
            (_RUNNING, _SUCCEEDED): "job.transaction() commits with the handler's writes",
            (_CANCEL_REQUESTED, _SUCCEEDED): "job.transaction() commits; a cancel was requested",
        },
    ),
    Operation(
        "JOB_GIVE_BACK_MANY",
        ("consumers.worker:Consumer._give_back",),
        {
            (_RUNNING, _QUEUED): "a graceful stop hands it back, the attempt refunded",
            (_CANCEL_REQUESTED, _CANCELLED): "a graceful stop: nobody wants it run again",
        },
    ),
    Operation(
        "JOB_SWEEP_EXPIRED",
        ("relay.maintenance:sweep_expired",),
        {
            (_RUNNING, _RETRY_WAIT): "the lease expired without a report, attempts left",
            (_RUNNING, _FAILED): "the lease expired without a report on the last attempt",
            (_CANCEL_REQUESTED, _CANCELLED): "the lease expired while a cancel was requested",
        },
    ),
    Operation(
        "JOB_EXPIRE_WAITING",
        ("relay.maintenance:expire_waiting",),
        {
            (_QUEUED, _CANCELLED): "past its deadline while nobody wakes it: code EXPIRED",
            (_RETRY_WAIT, _CANCELLED): "past its deadline while it waits for a retry: EXPIRED",
        },
    ),
    Operation(
        "JOB_REQUEST_CANCEL",
        ("outbox.cancel:request_cancel",),
        {
            (_QUEUED, _CANCELLED): "a cancel request: nobody holds it, its wake-ups go",
            (_RETRY_WAIT, _CANCELLED): "a cancel request while it waits for a retry",
            (_RUNNING, _CANCEL_REQUESTED): "a cancel request: its worker sees it at a heartbeat"
            " (forced: and interrupts the handler)",
        },
    ),
    Operation(
        "JOB_REJECT",
        ("outbox.approval:reject",),
        {(_QUEUED, _CANCELLED): "an operator rejects it while it waits for approval"},
    ),
    Operation(
        "JOB_REPLAY",
        ("outbox.replay:retry_job",),
        dict.fromkeys(_REPLAYS, "an operator replays it: a fresh budget, a wake-up, a record"),
    ),
    Operation(
        "JOB_REPLAY_MATCHING",
        ("outbox.replay:retry_jobs",),
        dict.fromkeys(_REPLAYS, "an operator replays the oldest that match a filter"),
    ),
    Operation(
        "JOB_RETENTION_DELETE",
        ("relay.retention:delete_finished",),
        dict.fromkeys(
            ((_SUCCEEDED, _GONE), (_FAILED, _GONE), (_CANCELLED, _GONE)),
            "retention deletes it, finished longer than relay --keep-finished, unless a"
            " waiting job waits on it (a FAILED strict head, a parent of an unfinished child)",
        ),
    ),
)


def edges_of(statement: str) -> frozenset[Edge]:
    """The edges the named statement makes (none: it must leave every state as it
    found it)."""
    return frozenset(e for op in OPERATIONS if op.statement == statement for e in op.moves)


# Every transition a statement in schema/queries/ can make, and nothing else.
TRANSITIONS: Final[dict[JobState, frozenset[JobState]]] = {
    state: frozenset(
        after
        for op in OPERATIONS
        for before, after in op.moves
        if before == state and after is not None
    )
    for state in JobState
}

# The transitions above that only an operator's action makes.
OPERATOR_ONLY: frozenset[tuple[JobState, JobState]] = frozenset(
    (state, JobState.QUEUED) for state in REPLAYABLE
)
