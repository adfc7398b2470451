"""Why is my job waiting? Every reason at once, read from the tables.

::

    with Session(engine) as session:
        why = outbox.explain(session, job_id)
    print(why.summary)          # QUEUED: queue 'mail' is paused (by alice); ...
    for b in why.blockers:
        print(b.code, b.facts)  # QUEUE_PAUSED {'paused_at': ..., 'paused_by': 'alice'}

:func:`explain` returns the job's state and every blocker that holds now, not only
the first (a job can be not yet due *and* in a paused queue *and* without a
consumer), each with a code and the facts behind it:

====================  ===================================================================
code                  facts
====================  ===================================================================
APPROVAL_REQUIRED     enqueued_at: enqueued with needs_approval, it runs once approved
                      (outbox.approve, jobctl jobs approve), never before
DEPENDENCY            pending (parents not settled yet), waiting_for (those parents, up
                      to 100: job_id and state), on_parent_failure, since: enqueued
                      with after=, it is woken when the last parent succeeds
NOT_DUE               run_after, in_seconds (a QUEUED job enqueued for later)
RETRY_BACKOFF         until, in_seconds, last_error_code, last_error_message, attempt
SNOOZED               until, in_seconds, snoozed_at, snoozes (how many times its
                      handler snoozed it, counted up to 10000): its handler raised
                      consumers.Snooze; it is woken at until, its attempt refunded
WAKEUP_PENDING        sent (false), due_since, outbox_lag_seconds (the age of its queue's
                      oldest due wake-up the relay has not sent), missing (no wake-up at
                      all: the relay's re-waker gives it one)
QUEUE_PAUSED          paused_at, paused_by
TENANT_CAP            tenant, running, max_running, and weight for a heavy job: its
                      tenant's free slots (max_running less running) are fewer than
                      the slots the job takes
KEY_ORDER             key, ahead (the job of its key it waits for: ordered, enqueued
                      before it, still waiting or running, or FAILED under "strict"),
                      ahead_state, strict
KEY_BUSY              key, running, key_limit, held_by (the job holding the key
                      longest): as many jobs with its key hold a lease as it allows;
                      it starts when one of them ends
CONCURRENCY_LIMIT     job_type, running, global_limit (and weight): the slots its type's
                      leases hold leave fewer free than its weight, across every
                      consumer; it starts when enough of them end
QUEUE_CONCURRENCY_LIMIT  queue, running, queue_limit (and weight): the slots its
                      queue's leases hold leave fewer free than its weight, across
                      every consumer; it starts when enough of them end
WEIGHT_OVER_CONCURRENCY  weight, largest_concurrency: no live consumer with its
                      handler has a --concurrency as large as its weight (the
                      largest, None when none is live), so none can ever claim it
RESOURCE_BUSY         resource, held_by, held_since: another job's lease holds its
                      exclusive resource; it starts when that lease ends cleanly
RESOURCE_UNCERTAIN    resource, job (whose lease expired holding it), since: that job's
                      worker vanished mid-work, so nothing of the resource starts
                      until outbox.resolve_resource (jobctl resources resolve)
BACKLOG               ahead (wake-ups of its queue that go before it: in flight, or
                      pending with a higher priority or the same priority and older;
                      counted up to 10000, ahead_at_least says the count was cut),
                      in_flight, pending_ahead, drain_per_s (the queue's attempts ended
                      per second over the last minute, or since it began draining if
                      later), estimated_start_in_seconds
                      (ahead / drain_per_s, Little's law; None while nothing drains),
                      held_reason and held_since (why the relay last held the tenant's
                      wake-ups back in this queue: WINDOW, FAIR_SHARE, TENANT_CAP)
NO_RELAY              relays_live (0), last_seen_at (when a relay was last heard of, or
                      None): its wake-up is not sent, and no relay runs to send it
RELAY_DISCONNECTED    relays_live: relays run, none is connected to RabbitMQ, so none
                      sends its wake-up
NO_CONSUMER           queue, live_workers (0): no live consumer serves its queue
NO_HANDLER            job_type, workers_on_queue, parked: consumers serve the queue, none
                      has a handler for its type
NO_AUTHORIZED_RUNNER  tenant, handlers_on_queue, parked: its tenant is dedicated
                      (runners="dedicated") and no live consumer with its handler names
                      it (consumer --tenant); it starts when one does
RATE_LIMITED          rate_limit, next_token_at (when its wake-up is due: its token's
                      turn), tokens, refilled_at (its bucket as the last claim left it):
                      a claim found no token for it
EXPIRED               expires_at: its deadline passed before it started, so it never
                      will (the next claim or the relay's sweep ends it CANCELLED)
CANCEL_REQUESTED      requested_at, forced: it runs, and was asked to stop (forced: its
                      worker interrupts the handler at its next heartbeat)
INPUT_REDACTED        input_id, redacted_at, redacted_by, reason: the stored input it
                      runs on (enqueue's payload_ref) was redacted, so the consumer
                      that takes it fails it at once (last_error_code INPUT_REDACTED)
                      without calling its handler; once failed, that code and its
                      message are the job's last_error
LEASE_EXPIRED         worker, expired_at, expired_seconds_ago, last_heartbeat_at,
                      sweeper_moves_to: it is RUNNING (or CANCEL_REQUESTED) on a lease
                      that ran out, so its worker is gone or stalled; the relay's sweeper
                      ends the attempt and moves the job on (RETRY_WAIT, FAILED with no
                      attempt left, CANCELLED if cancel was asked)
====================  ===================================================================

A waiting job that is due and has no blocker is next in line. A running job has no
blockers while its lease holds; ``lease`` says who holds it, until when, its last
heartbeat and progress.
A finished job has its ``outcome`` (its final state), ``finished_at`` and
``last_error``. A job enqueued with needs_approval has its ``approval``: status
(REQUIRED, APPROVED, REJECTED), by and at (who decided, when).

It is cheap: key lookups and short index ranges, bounded by the queue's backlog
(and at most 10000 entries ahead), never by the history of finished jobs. Reasons
are read at one instant and can change the next; an estimate is an estimate.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final

from hybrid_jobs.outbox.enqueue import psycopg_connection
from hybrid_jobs.outbox.ids import job_id_arg
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.outbox.validation import read_json
from hybrid_jobs.schema.queries import (
    INPUT_REDACTION,
    JOB_EXPLAIN,
    JOB_EXPLAIN_BACKLOG,
    JOB_PARENTS_PENDING,
    JOB_SNOOZES,
    WORKER_TTL_SECONDS,
)
from hybrid_jobs.schema.states import CLAIMABLE, LEASED, TERMINAL, DelayReason, HeldReason, JobState

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

# Wake-ups ahead are counted up to this many; beyond, "at least".
AHEAD_CAP: Final = 10_000
# The drain rate: the queue's attempts that ended within this many seconds, among
# at most DRAIN_SAMPLE of the newest attempts of all queues.
DRAIN_WINDOW: Final = 60.0
DRAIN_SAMPLE: Final = 2000


class Why(StrEnum):
    APPROVAL_REQUIRED = "APPROVAL_REQUIRED"
    DEPENDENCY = "DEPENDENCY"
    NOT_DUE = "NOT_DUE"
    RETRY_BACKOFF = "RETRY_BACKOFF"
    SNOOZED = "SNOOZED"
    WAKEUP_PENDING = "WAKEUP_PENDING"
    QUEUE_PAUSED = "QUEUE_PAUSED"
    TENANT_CAP = "TENANT_CAP"
    BACKLOG = "BACKLOG"
    NO_RELAY = "NO_RELAY"
    RELAY_DISCONNECTED = "RELAY_DISCONNECTED"
    NO_CONSUMER = "NO_CONSUMER"
    NO_HANDLER = "NO_HANDLER"
    NO_AUTHORIZED_RUNNER = "NO_AUTHORIZED_RUNNER"
    CANCEL_REQUESTED = "CANCEL_REQUESTED"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    RATE_LIMITED = "RATE_LIMITED"
    EXPIRED = "EXPIRED"
    KEY_ORDER = "KEY_ORDER"
    KEY_BUSY = "KEY_BUSY"
    CONCURRENCY_LIMIT = "CONCURRENCY_LIMIT"
    QUEUE_CONCURRENCY_LIMIT = "QUEUE_CONCURRENCY_LIMIT"
    WEIGHT_OVER_CONCURRENCY = "WEIGHT_OVER_CONCURRENCY"
    RESOURCE_BUSY = "RESOURCE_BUSY"
    RESOURCE_UNCERTAIN = "RESOURCE_UNCERTAIN"
    INPUT_REDACTED = "INPUT_REDACTED"


class JobNotFound(LookupError):
    """No job has this id (it never existed, or retention deleted it)."""

    def __init__(self, job_id: uuid.UUID) -> None:
        super().__init__(f"no job {job_id}: it never existed, or it finished and was deleted")
        self.job_id = job_id


@dataclass(frozen=True)
class Blocker:
    code: str
    facts: dict[str, Any]


@dataclass(frozen=True)
class LastError:
    code: str | None
    message: str | None


@dataclass(frozen=True)
class Explanation:
    job_id: uuid.UUID
    job_type: str
    state: JobState
    queue: str
    tenant: str | None
    priority: int
    # Attempts made (counted at claim) and the budget (None: the handler decides).
    attempt: int
    max_attempts: int | None
    run_after: datetime
    last_error: LastError | None
    # For a finished job: its final state, and when.
    outcome: JobState | None
    finished_at: datetime | None
    # For a running job: worker, generation, started_at, lease_expires_at,
    # last_heartbeat_at, progress, progress_at.
    lease: dict[str, Any] | None
    blockers: list[Blocker]
    summary: str
    # The database's clock when it was read.
    checked_at: datetime = field(repr=False)
    # For a job enqueued with needs_approval: status (REQUIRED, APPROVED,
    # REJECTED), by, at.
    approval: dict[str, Any] | None = None

    @property
    def codes(self) -> list[str]:
        return [b.code for b in self.blockers]

    def blocker(self, code: str) -> Blocker | None:
        return next((b for b in self.blockers if b.code == code), None)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: datetimes in ISO 8601, ids as text."""
        value = _jsonable(
            {
                "job_id": self.job_id,
                "job_type": self.job_type,
                "state": self.state,
                "queue": self.queue,
                "tenant": self.tenant,
                "priority": self.priority,
                "attempt": self.attempt,
                "max_attempts": self.max_attempts,
                "run_after": self.run_after,
                "last_error": None
                if self.last_error is None
                else {"code": self.last_error.code, "message": self.last_error.message},
                "outcome": self.outcome,
                "finished_at": self.finished_at,
                "lease": self.lease,
                "blockers": [{"code": b.code, "facts": b.facts} for b in self.blockers],
                "summary": self.summary,
                "checked_at": self.checked_at,
                "approval": self.approval,
            }
        )
        assert isinstance(value, dict)
        return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, StrEnum):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _seconds(later: datetime, earlier: datetime) -> float:
    return round((later - earlier).total_seconds(), 3)


# ------------------------------------------------------------------- reading


def _is_due_waiting(job: Mapping[str, Any]) -> bool:
    return job["state"] in CLAIMABLE and job["run_after"] <= job["db_now"]


def _params(job_id: uuid.UUID) -> dict[str, Any]:
    return {"job_id": job_id, "worker_ttl": WORKER_TTL_SECONDS}


def _backlog_params(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The second statement's parameters, when the job is due, waits in a queue
    that is not paused and has a wake-up; else None (nothing queues before it)."""
    if not _is_due_waiting(job) or job["paused_at"] is not None or job["wakeup_id"] is None:
        return None
    return {
        "queue": job["queue"],
        "priority": job["priority"],
        "now": job["db_now"],
        "due": job["wakeup_due"],
        "wakeup_id": job["wakeup_id"],
        "sent_at": job["wakeup_sent_at"],
        "pending": job["wakeup_sent_at"] is None,
        "cap": AHEAD_CAP,
        "drain_window": DRAIN_WINDOW,
        "drain_sample": DRAIN_SAMPLE,
    }


def explain(session: Session, job_id: uuid.UUID | str) -> Explanation:
    """Why the job ``job_id`` (a UUID or its text) is where it is: see the module's
    docstring. Raises :class:`JobNotFound` (a ``LookupError``) for an unknown id, and
    ``ValueError`` naming ``job_id`` for text that is not a UUID. Reads only."""
    key = job_id_arg(job_id)
    conn = psycopg_connection(session)
    row = conn.exec_driver_sql(JOB_EXPLAIN, _params(key)).first()
    if row is None:
        raise JobNotFound(key)
    job = row._asdict()
    if job.get("parents_pending") and job["state"] == JobState.QUEUED:
        parents = conn.exec_driver_sql(JOB_PARENTS_PENDING, {"job_id": key}).all()
        job["waiting_for"] = [{"job_id": p[0], "state": p[1]} for p in parents]
    if _snoozed(job):
        job["snoozes"] = conn.exec_driver_sql(
            JOB_SNOOZES, {"job_id": key, "limit": AHEAD_CAP}
        ).scalar()
    if job.get("payload_ref") is not None and job["state"] in CLAIMABLE:
        redaction = conn.exec_driver_sql(INPUT_REDACTION, {"input_id": job["payload_ref"]})
        job["input_redaction"] = redaction.first()
    backlog = None
    if (more := _backlog_params(job)) is not None:
        backlog = conn.exec_driver_sql(JOB_EXPLAIN_BACKLOG, more).one()._asdict()
    return _explanation(job, backlog)


explain_async = async_twin(explain)


# ------------------------------------------------------------------- deciding


def _blockers(job: Mapping[str, Any], backlog: Mapping[str, Any] | None) -> list[Blocker]:
    """Every blocker that holds for the job now, in a fixed order: its own time,
    its queue and tenant, its turn, then the consumers."""
    state = JobState(job["state"])
    if state in LEASED:
        found = []
        if state == JobState.CANCEL_REQUESTED:
            facts = {
                "requested_at": job["cancel_requested_at"],
                "forced": job.get("cancel_forced_at") is not None,
            }
            found.append(Blocker(Why.CANCEL_REQUESTED, facts))
        return found + _lapsed(job)
    if state not in CLAIMABLE:
        return []
    return _redacted(job) + _waiting(job, backlog)


def _redacted(job: Mapping[str, Any]) -> list[Blocker]:
    """The input it runs on was redacted: it can only fail. First, as it matters
    more than anything else that holds it."""
    found = job.get("input_redaction")
    if found is None:
        return []
    at, by, reason = found
    facts = {"input_id": job["payload_ref"], "redacted_at": at, "redacted_by": by, "reason": reason}
    return [Blocker(Why.INPUT_REDACTED, facts)]


def _waiting(job: Mapping[str, Any], backlog: Mapping[str, Any] | None) -> list[Blocker]:
    state = JobState(job["state"])
    if job.get("parents_pending") and state == JobState.QUEUED:
        # Held never due until its last parent ends: no wake-up, relay or consumer counts.
        facts = {
            "pending": job["parents_pending"],
            "waiting_for": job.get("waiting_for", []),
            "on_parent_failure": job["on_parent_failure"],
            "since": job["delay_since"],
        }
        return [Blocker(Why.DEPENDENCY, facts), *_expired(job)]
    if job["approval"] == "REQUIRED":
        # Held never due until approved: no wake-up, relay or consumer counts yet.
        return [Blocker(Why.APPROVAL_REQUIRED, {"enqueued_at": job["created_at"]}), *_held(job)]
    parked = job["delay_reason"] in (DelayReason.NO_HANDLER, DelayReason.NO_AUTHORIZED_RUNNER)
    keyed = _key(job) + _resource(job) + _concurrency(job) + _queue_limit(job)
    found = (
        _too_heavy(job) + _expired(job) + _not_yet(job) + _held(job) + _rate_limited(job) + keyed
    )
    if _is_due_waiting(job) and job["paused_at"] is None:
        # one waiting for its key or resource has no wake-up: the end of the lease
        # ahead (or the resolution) wakes it
        found += _waiting_turn(job, backlog, parked or bool(keyed))
    return found + _relays(job) + _consumers(job, parked)


def _expired(job: Mapping[str, Any]) -> list[Blocker]:
    expires = job["expires_at"]
    if expires is None or expires > job["db_now"]:
        return []
    return [Blocker(Why.EXPIRED, {"expires_at": expires})]


def _rate_limited(job: Mapping[str, Any]) -> list[Blocker]:
    """Turned down by its last claim for want of a token: it is woken when its
    token is due (its wake-up's time)."""
    if job["delay_reason"] != DelayReason.RATE_LIMITED:
        return []
    facts = {
        "rate_limit": job["rate_limit"],
        "next_token_at": job["wakeup_due"] if job["wakeup_sent_at"] is None else None,
        "tokens": job["rate_tokens"],
        "refilled_at": job["rate_refilled_at"],
    }
    return [Blocker(Why.RATE_LIMITED, facts)]


def _lapsed(job: Mapping[str, Any]) -> list[Blocker]:
    """A leased job whose lease ran out: its worker is gone (killed, partitioned) or
    stalled, and nobody has swept it yet."""
    now, expires = job["db_now"], job["lease_expires_at"]
    if expires is None or expires > now:
        return []
    if job["state"] == JobState.CANCEL_REQUESTED:
        then = "CANCELLED"
    elif job["max_attempts"] is not None and job["attempt_count"] >= job["max_attempts"]:
        then = "FAILED"
    else:
        then = "RETRY_WAIT"
    facts = {
        "worker": job["lease_owner"],
        "expired_at": expires,
        "expired_seconds_ago": _seconds(now, expires),
        "last_heartbeat_at": job["owner_seen_at"],
        "sweeper_moves_to": then,
    }
    return [Blocker(Why.LEASE_EXPIRED, facts)]


def _relays(job: Mapping[str, Any]) -> list[Blocker]:
    """A waiting job whose wake-up is not out (pending, or missing and due for the
    re-waker) needs a relay to send it, and that relay needs RabbitMQ."""
    if job["wakeup_id"] is not None and job["wakeup_sent_at"] is not None:
        return []
    if job["relays_live"] == 0:
        facts = {"relays_live": 0, "last_seen_at": job["relay_seen_at"]}
        return [Blocker(Why.NO_RELAY, facts)]
    if job["relays_publishing"] == 0:
        return [Blocker(Why.RELAY_DISCONNECTED, {"relays_live": job["relays_live"]})]
    return []


def _snoozed(job: Mapping[str, Any]) -> bool:
    """Not due because its handler snoozed it (the reason stays until a claim)."""
    return bool(
        job["state"] == JobState.QUEUED
        and job["delay_reason"] == DelayReason.SNOOZED
        and job["run_after"] > job["db_now"]
    )


def _not_yet(job: Mapping[str, Any]) -> list[Blocker]:
    """Not due: enqueued for later, snoozed by its handler, or backing off after a
    failed attempt."""
    now, run_after = job["db_now"], job["run_after"]
    if run_after <= now:
        return []
    if _snoozed(job):
        facts = {
            "until": run_after,
            "in_seconds": _seconds(run_after, now),
            "snoozed_at": job["delay_since"],
            "snoozes": job.get("snoozes"),
        }
        return [Blocker(Why.SNOOZED, facts)]
    if job["state"] == JobState.RETRY_WAIT:
        facts = {
            "until": run_after,
            "in_seconds": _seconds(run_after, now),
            "last_error_code": job["last_error_code"],
            "last_error_message": job["last_error_message"],
            "attempt": job["attempt_count"],
        }
        return [Blocker(Why.RETRY_BACKOFF, facts)]
    return [Blocker(Why.NOT_DUE, {"run_after": run_after, "in_seconds": _seconds(run_after, now)})]


def _held(job: Mapping[str, Any]) -> list[Blocker]:
    """Held by an operator (the queue's pause) or by the tenant's cap (from the
    live count of slots in use, not from the last refusal)."""
    found = []
    if job["paused_at"] is not None:
        facts = {"paused_at": job["paused_at"], "paused_by": job["paused_by"]}
        found.append(Blocker(Why.QUEUE_PAUSED, facts))
    weight = job.get("weight", 1)
    if job["max_running"] is not None and job["running"] + weight > job["max_running"]:
        facts = {
            "tenant": job["tenant"],
            "running": job["running"],
            "max_running": job["max_running"],
            **_weighed(weight),
        }
        found.append(Blocker(Why.TENANT_CAP, facts))
    return found


def _key(job: Mapping[str, Any]) -> list[Blocker]:
    """Waiting for its key: behind an earlier ordered job of the key, or the key
    holds as many leases as it allows (from the live leases, not the last refusal)."""
    if job.get("key") is None:
        return []
    if job["key_ahead"] is not None:
        facts = {
            "key": job["key"],
            "ahead": job["key_ahead"],
            "ahead_state": job["key_ahead_state"],
            "strict": job["key_order"] == "strict",
        }
        return [Blocker(Why.KEY_ORDER, facts)]
    # The strictest limit of the key's holders and its own governs (the claim's rule).
    limit = min(job["key_limit"], job.get("key_running_limit") or job["key_limit"])
    if job["key_running"] >= limit:
        facts = {
            "key": job["key"],
            "running": job["key_running"],
            "key_limit": limit,
            "held_by": job["key_holder"],
        }
        return [Blocker(Why.KEY_BUSY, facts)]
    return []


def _concurrency(job: Mapping[str, Any]) -> list[Blocker]:
    """Turned down for its type's concurrency limit, which is still full (from the
    limit's count now, not the last refusal)."""
    if job["delay_reason"] != DelayReason.CONCURRENCY_LIMIT or job["limit_max_running"] is None:
        return []
    weight = job.get("weight", 1)
    if job["limit_running"] + weight <= job["limit_max_running"]:
        return []
    facts = {
        "job_type": job["job_type"],
        "running": job["limit_running"],
        "global_limit": job["limit_max_running"],
        **_weighed(weight),
    }
    return [Blocker(Why.CONCURRENCY_LIMIT, facts)]


def _queue_limit(job: Mapping[str, Any]) -> list[Blocker]:
    """Turned down for its queue's concurrency limit, which is still full (from the
    limit's count now, not the last refusal)."""
    if (
        job["delay_reason"] != DelayReason.QUEUE_CONCURRENCY_LIMIT
        or job["queue_limit_max_running"] is None
    ):
        return []
    weight = job.get("weight", 1)
    if job["queue_limit_running"] + weight <= job["queue_limit_max_running"]:
        return []
    facts = {
        "queue": job["queue"],
        "running": job["queue_limit_running"],
        "queue_limit": job["queue_limit_max_running"],
        **_weighed(weight),
    }
    return [Blocker(Why.QUEUE_CONCURRENCY_LIMIT, facts)]


def _weighed(weight: int) -> dict[str, int]:
    """A heavy job's weight, for the facts of a blocker that counts slots; a job of
    weight 1 has none to show."""
    return {"weight": weight} if weight > 1 else {}


def _too_heavy(job: Mapping[str, Any]) -> list[Blocker]:
    """Heavier than every live consumer with its handler can hold (from the
    consumers live now: one started since with room enough will take it)."""
    weight = job.get("weight", 1)
    largest = job.get("largest_concurrency")
    if weight == 1 or job["handlers_on_queue"] == 0 or (largest is not None and largest >= weight):
        return []
    return [
        Blocker(Why.WEIGHT_OVER_CONCURRENCY, {"weight": weight, "largest_concurrency": largest})
    ]


def _resource(job: Mapping[str, Any]) -> list[Blocker]:
    """Waiting for its resource: held by another job's lease, or left uncertain by an
    expired one (its own, too), from the hold now, not the last refusal."""
    if job.get("resource") is None or job["resource_holder"] is None:
        return []
    if job["resource_uncertain_since"] is not None:
        facts = {
            "resource": job["resource"],
            "job": job["resource_holder"],
            "since": job["resource_uncertain_since"],
        }
        return [Blocker(Why.RESOURCE_UNCERTAIN, facts)]
    facts = {
        "resource": job["resource"],
        "held_by": job["resource_holder"],
        "held_since": job["resource_held_since"],
    }
    return [Blocker(Why.RESOURCE_BUSY, facts)]


def _consumers(job: Mapping[str, Any], parked: bool) -> list[Blocker]:
    """Nobody live to run it: no consumer on its queue, none with its handler, or,
    for a dedicated tenant, none of those naming the tenant."""
    if job["workers_on_queue"] == 0:
        return [Blocker(Why.NO_CONSUMER, {"queue": job["queue"], "live_workers": 0})]
    if job["handlers_on_queue"] == 0:
        facts = {
            "job_type": job["job_type"],
            "workers_on_queue": job["workers_on_queue"],
            "parked": parked,
        }
        return [Blocker(Why.NO_HANDLER, facts)]
    if job.get("dedicated") and job["runners_on_queue"] == 0:
        facts = {
            "tenant": job["tenant"],
            "handlers_on_queue": job["handlers_on_queue"],
            "parked": parked,
        }
        return [Blocker(Why.NO_AUTHORIZED_RUNNER, facts)]
    return []


def _waiting_turn(
    job: Mapping[str, Any], backlog: Mapping[str, Any] | None, parked: bool
) -> list[Blocker]:
    """A due job in a running queue: its wake-up not sent yet, and the wake-ups
    that go before it."""
    now, pending = job["db_now"], job["wakeup_sent_at"] is None
    if job["wakeup_id"] is None:
        # Parked for a handler nobody runs (or a runner nobody starts): NO_HANDLER
        # (NO_AUTHORIZED_RUNNER) says so. Otherwise the
        # re-waker gives a due job without a wake-up one within its interval.
        if parked:
            return []
        facts = {"sent": False, "due_since": job["run_after"], "outbox_lag_seconds": None}
        return [Blocker(Why.WAKEUP_PENDING, facts | {"missing": True})]
    assert backlog is not None, "a due job with a wake-up has its backlog read"
    found: list[Blocker] = []
    if pending:
        oldest = backlog["oldest_due"] or job["wakeup_due"]
        found.append(
            Blocker(
                Why.WAKEUP_PENDING,
                {
                    "sent": False,
                    "due_since": job["wakeup_due"],
                    "outbox_lag_seconds": max(0.0, _seconds(now, oldest)),
                    "missing": False,
                },
            )
        )
    in_flight, pending_ahead = int(backlog["in_flight"]), int(backlog["pending_ahead"])
    ahead = in_flight + pending_ahead
    # Why the relay last held the tenant's wake-ups back, while its own waits in
    # the backlog. A tenant's cap has its own blocker (TENANT_CAP, from the live
    # count); a window or fair share with nothing counted ahead still means a turn
    # to wait for.
    held = job["held_reason"] if pending else None
    if ahead == 0 and held not in (HeldReason.WINDOW, HeldReason.FAIR_SHARE):
        return found
    drain = round(int(backlog["drained"]) / _drain_span(now, backlog), 3)
    counted = min(ahead, AHEAD_CAP)
    found.append(
        Blocker(
            Why.BACKLOG,
            {
                "ahead": counted,
                "ahead_at_least": ahead > AHEAD_CAP,
                "in_flight": in_flight,
                "pending_ahead": pending_ahead,
                "drain_per_s": drain,
                "estimated_start_in_seconds": round(counted / drain, 1) if drain > 0 else None,
                "held_reason": held,
                "held_since": job["held_since"] if held is not None else None,
            },
        )
    )
    return found


def _drain_span(now: datetime, backlog: Mapping[str, Any]) -> float:
    """The seconds the drain count covers: the window, or less when the queue
    started draining more recently (a young queue's rate is not diluted over a
    minute it was idle), or when the sample of attempts ran out before the window
    did; at least a second, so one quick attempt does not make a wild rate."""
    span = DRAIN_WINDOW
    if backlog["first_start"] is not None:
        span = min(span, (now - backlog["first_start"]).total_seconds())
    if backlog["sampled"] >= DRAIN_SAMPLE and backlog["since"] is not None:
        span = min(span, (now - backlog["since"]).total_seconds())
    return max(span, 1.0)


def _lease(job: Mapping[str, Any]) -> dict[str, Any] | None:
    if job["state"] not in LEASED:
        return None
    return {
        "worker": job["lease_owner"],
        "generation": job["lease_generation"],
        "started_at": job["started_at"],
        "lease_expires_at": job["lease_expires_at"],
        "lease_expires_in_seconds": _seconds(job["lease_expires_at"], job["db_now"]),
        "last_heartbeat_at": job["owner_seen_at"],
        # As text: a handler's progress may nest past what json.loads reads.
        "progress": read_json(job["progress"])[0],
        "progress_at": job["progress_at"],
    }


_PHRASES: dict[Why, Callable[[dict[str, Any]], str]] = {
    Why.APPROVAL_REQUIRED: lambda f: "waits for approval (outbox.approve, jobctl jobs approve)",
    Why.DEPENDENCY: lambda f: (
        f"waits for {f['pending']} parent job(s) to succeed: "
        + ", ".join(f"{p['job_id']} ({p['state']})" for p in f["waiting_for"][:5])
        + (" ..." if len(f["waiting_for"]) > 5 else "")
    ),
    Why.NOT_DUE: lambda f: f"not due for {f['in_seconds']:.0f} s",
    Why.RETRY_BACKOFF: lambda f: (
        f"retrying in {f['in_seconds']:.0f} s after attempt {f['attempt']} failed"
        f" ({f['last_error_code']})"
    ),
    Why.SNOOZED: lambda f: (
        f"snoozed by its handler until {f['until']:%Y-%m-%d %H:%M:%S}"
        f" (in {f['in_seconds']:.0f} s)"
        + (f"; snoozed {f['snoozes']} time(s) so far" if f["snoozes"] is not None else "")
    ),
    Why.WAKEUP_PENDING: lambda f: (
        "no wake-up yet (the re-waker will send one)"
        if f["missing"]
        else f"its wake-up is not sent yet (queue's outbox lag {f['outbox_lag_seconds']:.1f} s)"
    ),
    Why.QUEUE_PAUSED: lambda f: f"its queue is paused (by {f['paused_by']})",
    Why.TENANT_CAP: lambda f: (
        f"tenant {f['tenant']!r} is at its cap ({f['running']}/{f['max_running']} running)"
        if f.get("weight", 1) == 1
        else f"the job weighs {f['weight']}, more than tenant {f['tenant']!r}'s whole cap"
        f" of {f['max_running']}: it cannot start until the cap is raised"
        if f["weight"] > f["max_running"]
        else f"tenant {f['tenant']!r} has {max(f['max_running'] - f['running'], 0)} free"
        f" slot(s) of its cap ({f['running']}/{f['max_running']} running),"
        f" and the job weighs {f['weight']}"
    ),
    Why.BACKLOG: lambda f: (
        f"{'at least ' if f['ahead_at_least'] else ''}{f['ahead']} ahead"
        + (
            f", start in about {f['estimated_start_in_seconds']:.0f} s"
            if f["estimated_start_in_seconds"] is not None
            else ", nothing drained in the last minute"
        )
        + (f" (held back: {f['held_reason']})" if f["held_reason"] else "")
    ),
    Why.NO_RELAY: lambda f: (
        "no relay is running to send its wake-up"
        + (
            f" (one was last seen {f['last_seen_at']:%Y-%m-%d %H:%M:%S})"
            if f["last_seen_at"] is not None
            else ""
        )
    ),
    Why.RELAY_DISCONNECTED: lambda f: (
        f"{f['relays_live']} relay(s) run, none connected to RabbitMQ: its wake-up waits"
    ),
    Why.KEY_ORDER: lambda f: (
        f"it waits behind job {f['ahead']} ({f['ahead_state']}) of key {f['key']!r}"
        + (" (strict order: until that one is replayed)" if f["ahead_state"] == "FAILED" else "")
    ),
    Why.KEY_BUSY: lambda f: (
        f"key {f['key']!r} is busy ({f['running']}/{f['key_limit']} running,"
        f" held by job {f['held_by']})"
    ),
    Why.CONCURRENCY_LIMIT: lambda f: (
        f"the job weighs {f['weight']}, more than job type {f['job_type']!r}'s whole"
        f" concurrency limit of {f['global_limit']}: it cannot start until the limit is"
        " raised (its handler's global_limit)"
        if f.get("weight", 1) > f["global_limit"]
        else f"job type {f['job_type']!r} is at its concurrency limit"
        f" ({f['running']}/{f['global_limit']} running across all consumers)"
        + (f", and the job weighs {f['weight']}" if f.get("weight", 1) > 1 else "")
    ),
    Why.QUEUE_CONCURRENCY_LIMIT: lambda f: (
        f"the job weighs {f['weight']}, more than queue {f['queue']!r}'s whole"
        f" concurrency limit of {f['queue_limit']}: it cannot start until the limit is"
        " raised (consumer --queue-limit)"
        if f.get("weight", 1) > f["queue_limit"]
        else f"queue {f['queue']!r} is at its concurrency limit"
        f" ({f['running']}/{f['queue_limit']} running across all consumers)"
        + (f", and the job weighs {f['weight']}" if f.get("weight", 1) > 1 else "")
    ),
    Why.WEIGHT_OVER_CONCURRENCY: lambda f: (
        f"the job weighs {f['weight']}, more than any live consumer with its handler can"
        " run at once"
        + (
            f" (the largest --concurrency is {f['largest_concurrency']})"
            if f["largest_concurrency"] is not None
            else ""
        )
        + ": run one with a --concurrency of at least its weight"
    ),
    Why.RESOURCE_BUSY: lambda f: (
        f"resource {f['resource']!r} is held by job {f['held_by']}"
        f" (since {f['held_since']:%Y-%m-%d %H:%M:%S})"
    ),
    Why.RESOURCE_UNCERTAIN: lambda f: (
        f"resource {f['resource']!r} is uncertain since {f['since']:%Y-%m-%d %H:%M:%S}:"
        f" the lease of job {f['job']} expired holding it; resolve it"
        " (outbox.resolve_resource) before anything of it starts"
    ),
    Why.NO_CONSUMER: lambda f: f"no live consumer serves queue {f['queue']!r}",
    Why.NO_HANDLER: lambda f: (
        f"none of the {f['workers_on_queue']} consumer(s) on its queue has a handler"
        f" for {f['job_type']!r}"
    ),
    Why.NO_AUTHORIZED_RUNNER: lambda f: (
        f"tenant {f['tenant']!r} is dedicated and none of the {f['handlers_on_queue']}"
        " consumer(s) with its handler names it (consumer --tenant)"
    ),
    Why.RATE_LIMITED: lambda f: (
        f"no token of rate limit {f['rate_limit']!r}"
        + (
            f" (its token is due at {f['next_token_at']:%H:%M:%S.%f})"
            if f["next_token_at"] is not None
            else ""
        )
    ),
    Why.EXPIRED: lambda f: (
        f"its deadline passed at {f['expires_at']:%Y-%m-%d %H:%M:%S}: it will not start"
    ),
    Why.CANCEL_REQUESTED: lambda f: (
        f"cancel requested (forced): asked to stop at {f['requested_at']:%Y-%m-%d %H:%M:%S},"
        " its worker interrupts the handler at its next heartbeat"
        if f.get("forced")
        else f"asked to stop at {f['requested_at']:%Y-%m-%d %H:%M:%S}"
    ),
    Why.INPUT_REDACTED: lambda f: (
        f"its stored input was redacted at {f['redacted_at']:%Y-%m-%d %H:%M:%S}"
        f" ({f['reason']}): it fails INPUT_REDACTED when a consumer takes it"
    ),
    Why.LEASE_EXPIRED: lambda f: (
        f"its lease expired {f['expired_seconds_ago']:.0f} s ago (worker {f['worker']}"
        f" is gone or stalled); the relay's sweeper will move it to {f['sweeper_moves_to']}"
    ),
}


def error_line(code: str | None, message: str | None) -> str:
    """An error as one line: its code, then its message unless the message already
    starts with the code (an exception's message is "OSError: ...")."""
    message = message or ""
    if code and not message.startswith(code):
        return f"{code}: {message}" if message else code
    return message


def _approval(job: Mapping[str, Any]) -> dict[str, Any] | None:
    if job["approval"] is None:
        return None
    return {"status": job["approval"], "by": job["approval_by"], "at": job["approval_at"]}


def _decided(job: Mapping[str, Any]) -> str:
    """Who approved or rejected it, and when, for the summary."""
    if job["approval"] not in ("APPROVED", "REJECTED"):
        return ""
    at = job["approval_at"]
    return f"; {job['approval'].lower()} by {job['approval_by']} at {at:%Y-%m-%d %H:%M:%S}"


def _summary(job: Mapping[str, Any], blockers: list[Blocker]) -> str:
    return _state_summary(job, blockers) + _decided(job)


def _state_summary(job: Mapping[str, Any], blockers: list[Blocker]) -> str:
    state = JobState(job["state"])
    attempts = f"{job['attempt_count']} attempt{'s' if job['attempt_count'] != 1 else ''}"
    if state in TERMINAL:
        text = f"{state} at {job['finished_at']:%Y-%m-%d %H:%M:%S} after {attempts}"
        if state != JobState.SUCCEEDED and job["last_error_code"]:
            text += f"; last error {error_line(job['last_error_code'], job['last_error_message'])}"
        return text
    reasons = "; ".join(_PHRASES[Why(b.code)](b.facts) for b in blockers)
    if state in LEASED:
        text = f"{state} on {job['lease_owner']} (attempt {job['attempt_count']})"
        return f"{text}: {reasons}" if reasons else text
    return f"{state}: {reasons}" if reasons else f"{state}: due and next in line"


def _explanation(job: Mapping[str, Any], backlog: Mapping[str, Any] | None) -> Explanation:
    state = JobState(job["state"])
    blockers = _blockers(job, backlog)
    error = None
    if job["last_error_code"] is not None or job["last_error_message"] is not None:
        error = LastError(job["last_error_code"], job["last_error_message"])
    return Explanation(
        job_id=job["job_id"],
        job_type=job["job_type"],
        state=state,
        queue=job["queue"],
        tenant=job["tenant"],
        priority=job["priority"],
        attempt=job["attempt_count"],
        max_attempts=job["max_attempts"],
        run_after=job["run_after"],
        last_error=error,
        outcome=state if state in TERMINAL else None,
        finished_at=job["finished_at"],
        lease=_lease(job),
        blockers=blockers,
        summary=_summary(job, blockers),
        checked_at=job["db_now"],
        approval=_approval(job),
    )
