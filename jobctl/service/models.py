"""What the service layer returns: frozen dataclasses, one per thing an operator
looks at. The CLI prints them, the HTTP API serves them as they are (FastAPI reads
their fields for the OpenAPI document; each attribute's docstring becomes its
description), and a dashboard can render them.

``jsonable(value)`` gives the JSON form the API sends, so ``jobctl ... --json``
prints the same documents.
"""

from __future__ import annotations

import ast
import inspect
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar

from hybrid_jobs.schema.states import JobState

# pydantic is imported by what serializes the models (the API, ``jsonable``), not by
# every ``jobctl`` command that imports them. Its ConfigDict is a TypedDict, a plain
# dict at run time: so it is named here, for the annotations below to resolve.
if TYPE_CHECKING:
    from pydantic import ConfigDict
else:
    ConfigDict = dict


@cache
def _attribute_docstrings(module: str) -> dict[str, dict[str, str]]:
    """Each class of ``module``: its attributes' docstrings (the string right after
    an annotated name), from one parse of the module's source."""
    found: dict[str, dict[str, str]] = {}
    for node in ast.walk(ast.parse(inspect.getsource(sys.modules[module]))):
        if isinstance(node, ast.ClassDef):
            docs = found.setdefault(node.name, {})
            for first, then in zip(node.body, node.body[1:], strict=False):
                if (
                    isinstance(first, ast.AnnAssign)
                    and isinstance(first.target, ast.Name)
                    and isinstance(then, ast.Expr)
                    and isinstance(then.value, ast.Constant)
                    and isinstance(then.value.value, str)
                ):
                    docs[first.target.id] = inspect.cleandoc(then.value.value)
    return found


def _describe(schema: dict[str, Any], cls: type[Any]) -> None:
    docs = _attribute_docstrings(cls.__module__).get(cls.__name__, {})
    for name, field in schema.get("properties", {}).items():
        if name in docs and "description" not in field:
            field["description"] = docs[name]


# Attribute docstrings become field descriptions in the OpenAPI document. Not
# pydantic's use_attribute_docstrings: on Python < 3.13 it parses the whole module
# again for every dataclass (inspect.getsourcelines), a second and more of CPU at
# every start of the API; this parses it once, and only when a schema is asked for.
_DOCUMENTED: ConfigDict = {"json_schema_extra": _describe}


@dataclass(frozen=True)
class LastError:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    code: str | None
    """The error code of the last failed attempt (the exception's class, or
    LEASE_EXPIRED, SHUTDOWN, ...)."""
    message: str | None


@dataclass(frozen=True)
class Lease:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    worker: str
    """The consumer that holds the job (workers.worker_id)."""
    generation: int
    """The lease generation: every write of the holder carries it."""
    expires_at: datetime
    """Unless renewed by a heartbeat; the sweeper retries the job after this."""


@dataclass(frozen=True)
class JobSummary:
    """A job in a list: what fits on one line."""

    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    id: uuid.UUID
    """The job's id, a UUIDv7: ids sort in creation order."""
    job_type: str
    queue: str
    tenant: str | None
    state: JobState
    done: bool
    """True once the job is SUCCEEDED, FAILED or CANCELLED: it will not change again
    unless an operator retries it."""
    priority: int
    attempt: int
    """Attempts made so far, counted when each one started."""
    max_attempts: int | None
    """The attempt budget; null until a handler claims a job enqueued without one
    (the handler's budget applies, else 5)."""
    run_after: datetime
    """When the job may run (next): its start time, or the end of a retry's backoff."""
    created_at: datetime
    started_at: datetime | None
    """When the latest attempt started."""
    finished_at: datetime | None
    last_error_code: str | None
    delay_reason: str | None
    """Why a consumer last turned the job's wake-up down: TENANT_CAP, QUEUE_PAUSED,
    NO_HANDLER, NO_AUTHORIZED_RUNNER, RATE_LIMITED, KEY_BUSY or KEY_ORDER (cleared
    when it starts)."""
    tags: tuple[str, ...]
    """The labels it was enqueued with (enqueue's tags=); searchable."""
    meta: Any
    """The JSON object it was enqueued with (enqueue's meta=), null for none;
    searchable by key and value. (Its text, a string, if stored nested past
    MAX_PAYLOAD_DEPTH.)"""


@dataclass(frozen=True)
class Attempt:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    attempt: int
    generation: int
    worker: str
    outcome: str
    """The state the attempt left the job in; QUEUED: given back at a graceful stop,
    or snoozed by its handler (error_code SNOOZED), the attempt refunded."""
    ready_at: datetime | None
    """When the job became runnable for this attempt."""
    started_at: datetime
    finished_at: datetime
    error_code: str | None
    error_message: str | None
    traceback: str | None


@dataclass(frozen=True)
class Blocker:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    code: str
    """APPROVAL_REQUIRED, NOT_DUE, SNOOZED, RETRY_BACKOFF, WAKEUP_PENDING, QUEUE_PAUSED,
    TENANT_CAP, BACKLOG, NO_RELAY, RELAY_DISCONNECTED, NO_CONSUMER, NO_HANDLER,
    NO_AUTHORIZED_RUNNER, CANCEL_REQUESTED, LEASE_EXPIRED, KEY_BUSY or KEY_ORDER."""
    facts: dict[str, Any]
    """The figures behind it (see outbox.explain)."""


@dataclass(frozen=True)
class Approval:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    status: str
    """REQUIRED (it waits: approve or reject it), APPROVED or REJECTED."""
    by: str | None
    """Who approved or rejected it."""
    at: datetime | None
    """When."""


@dataclass(frozen=True)
class Why:
    """Why a job is where it is, from outbox.explain: every reason that holds now."""

    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    summary: str
    """One line for people."""
    blockers: tuple[Blocker, ...]
    """Empty for a job that is due and next in line, running, or finished."""


@dataclass(frozen=True)
class TypePolicy:
    """What a job type allows, as its handler declares it and the consumers last
    recorded it (outbox.job_type_policy)."""

    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    job_type: str
    replay: bool
    """Whether its FAILED and CANCELLED jobs may be retried."""
    cancel_running: bool
    """Whether a running job of it may be cancelled (a waiting one always may)."""
    on_cancel: str | None
    """What a cancel of it promises, in its handler's words ("compensate": the handler
    undoes what it did; "none": what it did stays done)."""
    updated_at: datetime | None
    """When a consumer last changed it."""
    updated_by: str | None
    """The consumer (worker id) that last changed it."""


@dataclass(frozen=True)
class InputView:
    """A stored input (outbox.store_input) as an operator sees it: never its content,
    sensitive or not; that it exists, its size, and whether it was redacted."""

    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    input_id: uuid.UUID
    size_bytes: int
    """Its size as stored JSON, kept after a redaction."""
    sensitive: bool
    """Marked sensitive by its producer."""
    created_at: datetime
    redacted_at: datetime | None
    """When its content was erased for good; null while it is there."""
    redacted_by: str | None
    redaction_reason: str | None
    jobs: int
    """How many jobs run on it (counted up to 10000)."""
    unfinished: int
    """How many of those have not finished (counted up to 10000)."""


@dataclass(frozen=True)
class JobView(JobSummary):
    """One job, whole: its row, its attempts, and why it waits."""

    payload: Any
    dedup_key: str | None
    updated_at: datetime
    cancel_requested_at: datetime | None
    cancel_forced_at: datetime | None
    """Set when the cancel was requested with force: the handler is interrupted."""
    last_error: LastError | None
    progress: Any
    """What the handler last reported with job.progress(...)."""
    progress_at: datetime | None
    result: Any
    """What the handler returned, once the job SUCCEEDED."""
    delay_since: datetime | None
    lease: Lease | None
    """Who holds the job while it is RUNNING or CANCEL_REQUESTED."""
    attempts: tuple[Attempt, ...]
    """The newest attempts (at most 100), oldest first."""
    why: Why | None
    """Why it waits (or runs, or ended)."""
    checked_at: datetime
    """The database's clock when this was read."""
    as_text: tuple[str, ...] = ()
    """The fields (payload, progress, result) whose stored JSON nests deeper than
    MAX_PAYLOAD_DEPTH (100), served as their JSON text, a string, so that the job
    can be read at all (written before enqueue bounded nesting, or by hand)."""
    approval: Approval | None = None
    """For a job enqueued with needs_approval: whether it waits for approval, or
    who approved or rejected it, and when; null otherwise."""
    key: str | None = None
    """The entity the job is about: at most key_limit jobs with it run at once."""
    key_limit: int | None = None
    key_order: str | None = None
    """'ordered' or 'strict': jobs of its key start one after the other, in order."""
    resource: str | None = None
    """The exclusive target it acts on: one lease of a job with it at a time."""
    parents: tuple[Dependency, ...] = ()
    """The jobs it waits for (enqueue's after=), in that order (at most 100)."""
    children: tuple[Dependency, ...] = ()
    """The jobs waiting for it (at most 100)."""
    steps: tuple[Step, ...] = ()
    """Its finished resumable steps (job.step), in the order they finished (at most
    100): a later attempt skips them."""
    policy: TypePolicy | None = None
    """What its type allows, as its handler declares it (replay, cancel_running,
    on_cancel: what a cancel of it promises); null when the type declares nothing,
    and allows everything."""
    input: InputView | None = None
    """The stored input it runs on (enqueue's payload_ref), whose content is never
    shown: its payload is then null. Null for a job that carries its payload."""


@dataclass(frozen=True)
class Dependency:
    """A job at the other end of a dependency (enqueue's after=)."""

    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    job_id: uuid.UUID
    job_type: str | None
    """None for a parent retention has deleted since (it had ended)."""
    state: str | None
    done: bool
    """Whether this parent's end has been counted for the child (it succeeded, or
    ended otherwise under on_parent_failure="run")."""


@dataclass(frozen=True)
class Step:
    """A finished resumable step of a job (job.step)."""

    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    name: str
    attempt: int
    """The attempt that finished it."""
    finished_at: datetime


@dataclass(frozen=True)
class JobPage:
    """A page of a job list, newest first, and where the next one starts."""

    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    jobs: tuple[JobSummary, ...]
    next: str | None
    """Pass as `after` for the next page; null at the end of the list. A page may hold
    fewer jobs than asked for, even none, and still have a next one (see
    scan_limited)."""
    scan_limited: bool
    """True when the list stopped at the number of jobs one page may read (filters
    over the history of finished jobs read at most that many per page): follow
    `next` to search further back."""


@dataclass(frozen=True)
class QueueStats:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    queue: str
    paused: bool
    paused_at: datetime | None
    paused_by: str | None
    queued: int
    retry_wait: int
    running: int
    cancel_requested: int
    oldest_runnable_age_seconds: float
    """How long the oldest job that could run now (QUEUED or RETRY_WAIT, due) has
    waited; 0 when none is due."""
    expired_leases: int
    """Running jobs whose lease expired and that the sweeper has not moved on yet."""
    outbox_pending: int
    """Due wake-ups not sent yet: the backlog beyond the queue's window, which the
    relay holds back by design (the table orders it), and any lag."""
    outbox_lag_seconds: float
    """Age of the oldest of those; 0 when there is none. It grows with any backlog:
    whether wake-ups go out at all is `relays_publishing`."""
    outbox_in_flight: int
    """Wake-ups sent and not yet taken up by a consumer."""
    succeeded: int
    """Jobs of the queue that SUCCEEDED within the window (see Stats)."""
    failed: int
    cancelled: int
    expired: int
    """Of those CANCELLED, the ones that expired (code EXPIRED): never started before
    their deadline (enqueue's expires). The metrics' jobs_expired counts every one
    retention keeps."""
    rate_limited: int
    """Waiting jobs turned down for want of a token of their rate limit
    (RATE_LIMITED): each is woken when its token is due."""
    waiting_for_key: int
    """Waiting jobs turned down for their key (KEY_BUSY or KEY_ORDER): each starts
    when the lease ahead of it ends. See jobctl keys for who holds the keys."""
    finished_per_second: float
    """Jobs finished per second over the window."""
    workers: int
    """Live consumers serving the queue."""
    concurrency: int
    """Their concurrency, added up."""


@dataclass(frozen=True)
class PublishFailure:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    queue: str
    reason: str
    """Why the relay cannot publish the queue's wake-ups: refused (RabbitMQ nacked
    them), unroutable, declare_refused, unconfirmed (no confirm in time), or
    decision_timeout. The relay backs that queue off alone; its wake-ups wait."""
    relays: int
    """Live relays that say so."""
    since: datetime
    """When the first of them started failing."""
    failures: int
    """Attempts that failed since then, over those relays."""
    detail: str
    """One relay's description of the failure."""


@dataclass(frozen=True)
class Stats:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    checked_at: datetime
    window_seconds: float
    """The span the finished counts and the throughput cover: the last minute, or
    less when more jobs than the sample holds finished in it."""
    queues: tuple[QueueStats, ...]
    relays_live: int
    """Relay processes whose heartbeat was seen in the last 30 seconds."""
    relays_publishing: int
    """Of those, the ones connected to RabbitMQ: 0 means no wake-up goes out."""
    publish_failing: tuple[PublishFailure, ...] = ()
    """Queues a live relay cannot publish to right now, and why: each is backed off
    alone while the others' wake-ups go out."""


@dataclass(frozen=True)
class LastFire:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    scheduled_for: datetime
    fired_at: datetime
    outcome: str
    """enqueued or skipped."""
    skip_reason: str | None
    job_id: uuid.UUID | None


@dataclass(frozen=True)
class ScheduleView:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    name: str
    job_type: str
    payload: Any
    cron: str | None
    every_seconds: float | None
    timezone: str
    queue: str
    tenant: str | None
    priority: int
    max_attempts: int | None
    catchup: str
    paused: bool
    next_fire_at: datetime
    last_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime
    last_fire: LastFire | None
    """The newest occurrence the relay decided, fired or skipped."""
    as_text: tuple[str, ...] = ()
    """["payload"] when the stored payload nests deeper than MAX_PAYLOAD_DEPTH and is
    served as its JSON text (see JobView.as_text)."""


@dataclass(frozen=True)
class Held:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    queue: str
    reason: str
    """Why the relay holds the tenant's wake-ups back in this queue: TENANT_CAP,
    WINDOW or FAIR_SHARE."""
    since: datetime | None


@dataclass(frozen=True)
class KeyHolder:
    """A job holding a lease on its key."""

    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    job_id: uuid.UUID
    job_type: str
    queue: str
    state: JobState
    worker: str
    """The consumer whose lease it is (workers.worker_id)."""
    started_at: datetime | None
    ordered: str | None
    """'ordered' or 'strict' for a job of an ordered key; null otherwise."""


@dataclass(frozen=True)
class BusyKey:
    """A key some job holds a lease on now."""

    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    key: str
    running: int
    """Leases of the key held now."""
    key_limit: int
    """How many may hold it at once (the limit its last claim applied)."""
    waiting: int
    """Jobs of the key waiting to run, counted up to Keys.waiting_cap."""
    holders: tuple[KeyHolder, ...]
    """The jobs holding it, longest held first (at most Keys.holders_shown)."""


@dataclass(frozen=True)
class HeldKey:
    """A key held behind a FAILED job of ordered="strict", until that job is
    replayed (retried) or cancelled: the jobs behind it wait (KEY_ORDER)."""

    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    key: str
    job_id: uuid.UUID
    """The failed job at the head of the key."""
    job_type: str
    queue: str
    failed_at: datetime | None
    error_code: str | None
    waiting: int
    """Jobs of the key waiting behind it, counted up to Keys.waiting_cap."""


@dataclass(frozen=True)
class Keys:
    """Busy keys and who holds them, and keys held behind a failed strict head."""

    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    busy: tuple[BusyKey, ...]
    """In key order, at most the limit asked for."""
    busy_total: int
    """How many keys are busy now, shown or not."""
    held: tuple[HeldKey, ...]
    holders_shown: int
    waiting_cap: int


@dataclass(frozen=True)
class TenantView:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    tenant: str
    max_running: int | None
    """Jobs of the tenant that may run at once; null: no cap."""
    weight: float
    """Its share of a busy queue against the other tenants."""
    max_queued: int | None
    """Waiting jobs past which enqueue refuses more; null: no limit."""
    running: int
    """Slots held now."""
    queued: int | None
    """Waiting jobs, as the relay last counted them, up to max_queued; null for a
    tenant without a max_queued (its waiting jobs are not counted)."""
    queued_at: datetime | None
    drain_per_s: float | None
    held: tuple[Held, ...]
    runners: str = "shared"
    """"dedicated": only consumers naming the tenant (consumer --tenant) take its
    jobs; "shared": any consumer of the queue."""


@dataclass(frozen=True)
class WorkerView:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    worker_id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    job_types: tuple[str, ...]
    concurrency: int
    prefetch: int
    started_at: datetime
    last_seen_at: datetime
    stopping: bool
    live: bool
    """Heard from within the last minute, not stopping, and no lease of it lapsed
    since."""
    lapsed: bool
    """A lease of it lapsed (the sweeper took it back) since it was last heard from:
    killed or frozen, most likely. It counts as gone until it is heard from again."""
    running: int
    """Jobs it holds a lease on now."""
    counts: dict[str, Any]
    """The process's own cumulative counters (claimed, succeeded, ...)."""
    tenants: tuple[str, ...] = ()
    """The dedicated tenants it may serve (consumer --tenant), besides shared ones."""

    @property
    def status(self) -> str:
        """stopping, live, lapsed (a lease of it lapsed since it was last heard
        from) or silent (not heard from within the TTL)."""
        if self.stopping:
            return "stopping"
        if self.live:
            return "live"
        return "lapsed" if self.lapsed else "silent"


@dataclass(frozen=True)
class Enqueued:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    job: JobView
    created: bool
    """False when the job was there already: its dedup_key found it."""
    replayed: bool = False
    """True when the Idempotency-Key named an earlier request, answered again."""


@dataclass(frozen=True)
class JobStateChange:
    """What a cancel, retry, approval or rejection did to one job."""

    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    id: uuid.UUID
    state: JobState | None
    """The job's state afterwards; null for an unknown id."""
    applied: bool
    """A cancel: the job is cancelled or asked to stop (also when it already was). A
    retry: it was FAILED or CANCELLED and is QUEUED again."""
    not_allowed: TypePolicy | None = None
    """Set when the job's type does not allow the change (its handler's replay=False,
    or cancel_running=False for a running job): that policy. Nothing was changed."""


@dataclass(frozen=True)
class QueueState:
    """A queue's pause, after a pause or a resume."""

    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    queue: str
    paused: bool
    paused_at: datetime | None
    """When the last pause began (kept after a resume)."""
    paused_by: str | None
    """Who paused it last (``by``, else the database role and application)."""
    changed: bool
    """Whether this request changed it (pausing a paused queue, or resuming a running
    one, changes nothing)."""
    resumed_at: datetime | None = None
    resumed_by: str | None = None
    """Who resumed it last, and when; null while it never was."""


@dataclass(frozen=True)
class BulkRetry:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    matched: int
    """Jobs retried (or, with dry_run, that would be): those the filter selected, at
    most the limit, or those of the ids that were FAILED or CANCELLED."""
    dry_run: bool
    """True: nothing was retried, `matched` is what would have been."""
    jobs: tuple[JobStateChange, ...] | None = None
    """For a retry by ids: what became of each (null for a retry by filter)."""
    not_allowed: int = 0
    """For a retry by filter: the matching jobs passed over because their type does
    not allow replay (0 with override_policy)."""


@dataclass(frozen=True)
class Check:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    service: str
    """postgresql or rabbitmq."""
    ok: bool
    address: str | None = None
    """host:port, never a credential; only for a caller with the token."""
    detail: str | None = None
    """Why it failed, empty when it answered; only for a caller with the token (the
    server's log has it too)."""
    seconds: float | None = None


@dataclass(frozen=True)
class Readiness:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    ready: bool
    checks: tuple[Check, ...]
    checked_at: float | None = None
    """Unix time of the check this answer comes from (answers are cached a second or
    two); only for a caller with the token."""

    def public(self) -> Readiness:
        """What anyone may see: which service answered, nothing of where or why."""
        return Readiness(self.ready, tuple(Check(c.service, c.ok) for c in self.checks))


@dataclass(frozen=True)
class WebhookCallView:
    """A call owed to a completion webhook: the job's end it reports, where it
    goes, and how its delivery went."""

    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    delivery_id: int
    """Sent as the Webhook-Id header: the same on every retry of the call."""
    job_id: uuid.UUID
    endpoint: str
    """Where the call goes: the URL's scheme, host and port. Its path and query are
    not shown, as they often carry a token."""
    state: str
    """PENDING (due, or being called), DELIVERED, or GAVE_UP after the relay's
    --webhook-max-attempts."""
    attempts: int
    """Calls made (a relay's claim counts one, even if it died mid-call)."""
    next_attempt_at: datetime | None
    """When a PENDING call is due next (while one is being made, when its lease
    ends)."""
    last_status: int | None
    """The last call's HTTP status; null when none came back (a timeout, a refused
    connection)."""
    last_error: str | None
    delivered_at: datetime | None
    gave_up_at: datetime | None
    created_at: datetime


@dataclass(frozen=True)
class RateLimitView:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    name: str
    """A rate limit's name; one ending in ':*' is a prefix, each name under it with
    a bucket of its own."""
    rate: float
    per_seconds: float
    """``rate`` tokens every ``per_seconds``."""
    burst: float
    """What the bucket holds at most."""
    tokens: float | None
    """What an exact name's bucket holds now; null for a prefix."""
    next_token_in_seconds: float | None
    """How long until the bucket holds a whole token (0: it has one); null for a
    prefix."""
    refilled_at: datetime | None
    """When a claim last took from the bucket; null: never, or a prefix."""
    buckets: int
    """Names with a bucket (for a prefix, those under it, counted up to 10,000)."""


@dataclass(frozen=True)
class ConcurrencyLimitView:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    job_type: str
    global_limit: int
    """At most this many of the type's jobs hold a lease at once, across every
    consumer (the handler's ``global_limit``)."""
    running: int
    """Slots held now (a job of weight N holds N)."""
    waiting: int
    """Jobs turned down for the limit that wait for a slot (CONCURRENCY_LIMIT),
    counted up to 10,000."""
    updated_at: datetime
    updated_by: str
    """The consumer that recorded the limit last (the last one to start)."""


@dataclass(frozen=True)
class QueueLimitView:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    queue: str
    limit: int
    """At most this many of the queue's jobs hold a lease at once, across every
    consumer, whatever their types."""
    running: int
    """Slots held now (a job of weight N holds N)."""
    waiting: int
    """Jobs turned down for the limit that wait for a slot
    (QUEUE_CONCURRENCY_LIMIT), counted up to 10,000."""
    updated_at: datetime
    updated_by: str
    """Who wrote the limit last: a consumer started with --queue-limit, or an
    operator."""


@dataclass(frozen=True)
class Limits:
    __pydantic_config__: ClassVar[ConfigDict] = _DOCUMENTED

    rate_limits: tuple[RateLimitView, ...]
    concurrency_limits: tuple[ConcurrencyLimitView, ...]
    """Per job type, by name."""
    queue_limits: tuple[QueueLimitView, ...]
    """Per queue, by name."""


def jsonable(value: Any) -> Any:
    """The JSON form of a service result (or a list of them), as the API sends it."""
    from pydantic import TypeAdapter

    return TypeAdapter(type(value)).dump_python(value, mode="json")
