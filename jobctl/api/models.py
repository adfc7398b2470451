"""The API's own documents: request bodies, and the wrappers of lists. Everything
else it serves is a service-layer dataclass as it is (jobctl.service.models)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from hybrid_jobs import defaults
from hybrid_jobs.jobctl.service.models import ScheduleView, TenantView, WorkerView
from hybrid_jobs.outbox.validation import (
    MAX_ATTEMPTS_LIMIT,
    MAX_KEY_LIMIT,
    MAX_PARENTS,
    check_depth,
)
from hybrid_jobs.schema import names
from hybrid_jobs.schema.tables import (
    MAX_DEDUP_KEY_LENGTH,
    MAX_JOB_TYPE_LENGTH,
    MAX_KEY_LENGTH,
    MAX_SCHEDULE_NAME_LENGTH,
    MAX_TAG_LENGTH,
    MAX_TAGS,
    MAX_WEBHOOK_URL_LENGTH,
    MAX_WEIGHT,
    QUEUE_NAME_PATTERN,
    TAG_PATTERN,
)


def _text(value: str) -> str:
    # What PostgreSQL's text cannot hold, refused here rather than by the database.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    return value


def _name(value: str) -> str:
    # The producer API's rule for names (schema.names), also what is refused there.
    names.text("value", _text(value), 10_000)
    return value


def _payload(value: Any) -> Any:
    check_depth("payload", value)
    return value


# Instants a job may be put off to: any time a program means (a year 1 with a +14:00
# offset is a date Python cannot read back).
EARLIEST: Final = datetime(1970, 1, 1, tzinfo=UTC)
LATEST: Final = datetime(9000, 1, 1, tzinfo=UTC)


def _instant(value: datetime) -> datetime:
    if not EARLIEST <= value <= LATEST:
        raise ValueError("must be between 1970-01-01 and 9000-01-01")
    return value


QueueName = Annotated[
    str,
    Field(pattern=QUEUE_NAME_PATTERN, max_length=100, examples=["default"]),
]
JobType = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_JOB_TYPE_LENGTH,
        pattern=names.NO_CONTROLS_PATTERN,
        examples=["send_email"],
    ),
    AfterValidator(_name),
]
ScheduleName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_SCHEDULE_NAME_LENGTH, pattern=names.NO_CONTROLS_PATTERN),
    AfterValidator(_name),
]
Tag = Annotated[
    str, Field(pattern=TAG_PATTERN, max_length=MAX_TAG_LENGTH, examples=["customer:42"])
]
Limit = Annotated[int, Field(ge=0, le=2**31 - 1)]
# A span as a JSON number of seconds (outbox takes a timedelta), under ten years as
# outbox's debounce checks.
Seconds = Annotated[float, Field(ge=0, lt=10 * 365 * 86400, allow_inf_nan=False, examples=[2.0])]


class EnqueueBody(BaseModel):
    """A job to enqueue; the fields mean what outbox.enqueue's arguments mean."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    job_type: JobType
    payload: Annotated[Any, AfterValidator(_payload)] = Field(default_factory=dict)
    """Any JSON value the handler understands: at most MAX_PAYLOAD_BYTES as JSON, and
    nested at most MAX_PAYLOAD_DEPTH (100) objects and arrays deep. null is stored as
    JSON null (the handler gets None); absent: an empty object."""
    dedup_key: (
        Annotated[str, Field(min_length=1, max_length=MAX_DEDUP_KEY_LENGTH), AfterValidator(_text)]
        | None
    ) = None
    """As outbox.enqueue's: a job of this job_type with this key already enqueued (and
    not yet deleted by retention) is answered instead (200), and nothing is written.
    Shared with the producers' dedup keys; the Idempotency-Key header is not."""
    queue: QueueName = "default"
    tenant: QueueName | None = None
    """Whose job it is, for caps, fair share and backpressure."""
    priority: int = Field(default=0, ge=-32768, le=32767)
    """Higher runs first."""
    run_after: Annotated[AwareDatetime, AfterValidator(_instant)] | None = None
    """Not before this instant (with its UTC offset); null: now."""
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS_LIMIT)
    """The attempt budget; null: the handler's, else 5."""
    needs_approval: bool = False
    """It waits (APPROVAL_REQUIRED) until approved (POST /v1/jobs/{id}/approve) or
    rejected (.../reject); takes no run_after."""

    expires: Annotated[AwareDatetime, AfterValidator(_instant)] | None = None
    """A deadline (with its UTC offset): no attempt starts after it, and a job still
    waiting then ends CANCELLED with code EXPIRED; null: none."""
    rate_limit: QueueName | None = None
    """The rate limit whose token the job takes when it starts (outbox.set_rate_limit);
    null: its handler's, if any."""

    debounce: Seconds | None = None
    """Seconds, with dedup_key: while the job with that key has not started, an
    enqueue with the key replaces its payload (200, the same job) and moves its start
    to this long from now; once it has started, an enqueue makes a new job. Takes no
    run_after, key or needs_approval."""
    debounce_max: Seconds | None = None
    """Seconds: a debounced job starts at most this long after its first enqueue,
    however often it is replaced; null: no bound. Needs debounce, and at least it."""

    key: (
        Annotated[str, Field(min_length=1, max_length=MAX_KEY_LENGTH), AfterValidator(_text)] | None
    ) = None
    """The entity the job is about: at most key_limit jobs with one key hold a lease
    at once, across queues and job types."""
    key_limit: int | None = Field(default=None, ge=1, le=MAX_KEY_LIMIT)
    """How many jobs with its key may run at once; null: 1. Needs a key."""
    ordered: bool | Literal["strict"] = False
    """true: jobs of its key start in enqueue order, one after the other, past one
    that FAILED or was CANCELLED; "strict": the key waits behind a FAILED one until
    it is replayed. Needs a key, and a key_limit of 1 (ordered jobs of a key run
    one at a time)."""
    after: list[uuid.UUID] = Field(default_factory=list, max_length=MAX_PARENTS)
    """Ids of jobs (each once) it waits for: it starts once every one has SUCCEEDED
    (DEPENDENCY meanwhile). An unknown id is refused (422). Takes no run_after,
    debounce or needs_approval."""
    on_parent_failure: Literal["cancel", "run"] = "cancel"
    """When a parent ends FAILED or CANCELLED: "cancel" ends the job (and what
    waits for it) CANCELLED with code PARENT_FAILED; "run" counts it as done."""
    resource: (
        Annotated[str, Field(min_length=1, max_length=MAX_KEY_LENGTH), AfterValidator(_text)] | None
    ) = None
    """An exclusive target the job acts on ("deploy:prod"): at most one job with it
    holds a lease at once; a lease that expires leaves it UNCERTAIN until resolved
    (jobctl resources resolve). Takes no key."""
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    """Labels to find the job by (GET /v1/jobs?tag=...): at most 16, each 1-64
    letters, digits and _ . : / = -, starting with a letter or digit."""
    meta: dict[str, Any] | None = None
    """A small JSON object shown with the job and searchable by key and value
    (GET /v1/jobs?meta.customer=42): at most 4096 bytes as JSON."""
    weight: Annotated[int, Field(ge=1, le=MAX_WEIGHT)] = 1
    """How many of its consumer's slots, of its tenant's cap and of its type's
    concurrency limit one lease of it takes (enqueue's weight=)."""
    payload_ref: uuid.UUID | None = None
    """A stored input (outbox.store_input) the job runs on, in place of a payload:
    its handler reads the input's content as the payload. Give no payload with it;
    an input that does not exist, or was redacted, is refused (422)."""
    on_complete_url: Annotated[str, Field(max_length=MAX_WEBHOOK_URL_LENGTH)] | None = None
    """A URL the relay calls, signed, when the job ends (enqueue's on_complete_url=):
    http or https, with a host, no credentials."""


class CancelBody(BaseModel):
    """How to cancel a job (optional)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    force: bool = False
    """Do not leave a running job to its handler: at its worker's next heartbeat an
    async handler is interrupted, and the job ends CANCELLED whatever the handler does
    next. A job whose cancel was requested already is made forced."""
    override_policy: bool = False
    """Ask a running job to stop even though its type does not allow it
    (cancel_running=False); recorded as who overrode it. Without it, such a job gets
    409 and is left running."""


class RetryBody(BaseModel):
    """How to retry a job (optional)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    override_policy: bool = False
    """Retry it even though its type does not allow replay (replay=False); the
    replay is recorded as forced. Without it, such a job gets 409."""


class RejectBody(BaseModel):
    """Why a job is rejected (optional)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    reason: Annotated[str, Field(min_length=1, max_length=2000), AfterValidator(_text)] | None = (
        None
    )
    """Kept as the job's last_error_message (default: "rejected")."""


class RedactBody(BaseModel):
    """Why a stored input's content is erased (an erasure request, say): recorded with
    who asked and when."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    reason: Annotated[str, Field(min_length=1, max_length=1000), AfterValidator(_text)]
    """Kept with the input as its redaction_reason, and named by the error of each
    job that had not started on it."""


class EditBody(BaseModel):
    """What to change of a job that has not started yet: only the fields present
    change (at least one). Every value is absolute, so repeating the request is
    harmless: it sets the same values, or is refused (409) once the job has started."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    payload: Annotated[Any, AfterValidator(_payload)] = None
    """Its new payload, checked as at enqueue; null stores JSON null."""
    priority: int = Field(default=0, ge=-32768, le=32767)
    """Higher runs first; its wake-up moves up or down the queue with it."""
    run_after: Annotated[AwareDatetime, AfterValidator(_instant)] = EARLIEST
    """Not before this instant (with its UTC offset): its wake-up is due then.
    Refused (409) for a job that waits for approval or for its parents, and (422) at
    or past its deadline (expires)."""
    max_attempts: int = Field(default=1, ge=1, le=MAX_ATTEMPTS_LIMIT)
    """The whole attempt budget, counting the attempts made: it must leave one."""

    @model_validator(mode="after")
    def _something(self) -> EditBody:
        if not self.model_fields_set:
            raise ValueError("nothing to edit: give payload, priority, run_after or max_attempts")
        return self


class TenantLimits(BaseModel):
    """A tenant's limits, all of them (a field left out means no limit, weight 1)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_running: Limit | None = None
    """Its jobs running at once; null: no cap."""
    weight: float = Field(default=1.0, gt=0, le=1000)
    """Its share of a busy queue against the other tenants."""
    max_queued: Limit | None = None
    """Waiting jobs past which enqueue refuses more (429); null: no limit."""
    runners: Literal["shared", "dedicated"] = "shared"
    """"dedicated": only consumers started with `--tenant` naming it take its jobs
    (they wait as NO_AUTHORIZED_RUNNER while none is live); "shared": any."""


class QueueLimitRequest(BaseModel):
    """A queue's concurrency limit, across every consumer."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    limit: int = Field(ge=1, le=defaults.MAX_QUEUE_LIMIT)
    """At most this many of the queue's jobs hold a lease at once."""


class RetryRequest(BaseModel):
    """Which failed (and, if asked, cancelled) jobs to put back in their queue: the
    jobs named by `ids`, or those matching every filter given, or, with `all`, every
    one. One of the three is required: an empty body retries nothing."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    ids: list[uuid.UUID] | None = Field(default=None, min_length=1, max_length=1000)
    """These jobs (each must be FAILED or CANCELLED; the answer says what became of
    each)."""
    queue: QueueName | None = None
    job_type: JobType | None = None
    error_code: (
        Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_name)] | None
    ) = None
    """The jobs' last_error_code."""
    finished_after: Annotated[AwareDatetime, AfterValidator(_instant)] | None = None
    all: bool = False
    """Every failed job, in every queue (up to `limit`): no filter, said on purpose."""
    include_cancelled: bool = False
    """Retry CANCELLED jobs too; without it a filter (or all) leaves them alone,
    since someone cancelled them on purpose."""
    limit: int = Field(default=1000, ge=1, le=100_000)
    """At most this many, oldest finished first (not with ids)."""
    dry_run: bool = False
    """Count what would be retried; change nothing."""
    override_policy: bool = False
    """Retry jobs whose type does not allow replay too, each recorded as forced;
    without it they are passed over (counted in `not_allowed`, or `not_allowed` on
    each of `ids`)."""

    @model_validator(mode="after")
    def _one_way(self) -> RetryRequest:
        filtered = any(
            v is not None for v in (self.queue, self.job_type, self.error_code, self.finished_after)
        )
        if self.ids is not None and (filtered or self.all):
            raise ValueError("give ids, or filters, or all: one of them")
        if self.all and filtered:
            raise ValueError("all means every failed job: leave the filters out, or all")
        if self.ids is None and not filtered and not self.all:
            raise ValueError(
                "say which jobs: ids, a filter (queue, job_type, error_code, finished_after),"
                " or all: true for every failed job"
            )
        return self


class ScheduleList(BaseModel):
    schedules: list[ScheduleView]


class TenantList(BaseModel):
    tenants: list[TenantView]


class WorkerList(BaseModel):
    workers: list[WorkerView]


class Health(BaseModel):
    status: str = "ok"
