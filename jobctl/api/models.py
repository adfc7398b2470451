"""The API's own documents: request bodies, and the wrappers of lists. Everything
else it serves is a service-layer dataclass as it is (jobctl.service.models)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Final

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

from jobctl.service.models import ScheduleView, TenantView, WorkerView
from outbox.validation import MAX_ATTEMPTS_LIMIT
from schema.tables import MAX_JOB_TYPE_LENGTH, MAX_SCHEDULE_NAME_LENGTH, QUEUE_NAME_PATTERN


def _text(value: str) -> str:
    # What PostgreSQL's text cannot hold, refused here rather than by the database.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
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
    Field(min_length=1, max_length=MAX_JOB_TYPE_LENGTH, examples=["send_email"]),
    AfterValidator(_text),
]
ScheduleName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_SCHEDULE_NAME_LENGTH),
    AfterValidator(_text),
]
Limit = Annotated[int, Field(ge=0, le=2**31 - 1)]


class EnqueueBody(BaseModel):
    """A job to enqueue; the fields mean what outbox.enqueue's arguments mean."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    job_type: JobType
    payload: Any = Field(default_factory=dict)
    """Any JSON value the handler understands (at most MAX_PAYLOAD_BYTES as JSON)."""
    queue: QueueName = "default"
    tenant: QueueName | None = None
    """Whose job it is, for caps, fair share and backpressure."""
    priority: int = Field(default=0, ge=-32768, le=32767)
    """Higher runs first."""
    run_after: Annotated[AwareDatetime, AfterValidator(_instant)] | None = None
    """Not before this instant (with its UTC offset); null: now."""
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS_LIMIT)
    """The attempt budget; null: the handler's, else 5."""


class TenantLimits(BaseModel):
    """A tenant's limits, all of them (a field left out means no limit, weight 1)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_running: Limit | None = None
    """Its jobs running at once; null: no cap."""
    weight: float = Field(default=1.0, gt=0, le=1000)
    """Its share of a busy queue against the other tenants."""
    max_queued: Limit | None = None
    """Waiting jobs past which enqueue refuses more (429); null: no limit."""


class RetryFilter(BaseModel):
    """Which failed and cancelled jobs to retry: those that match every field given."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    queue: QueueName | None = None
    job_type: JobType | None = None
    error_code: (
        Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_text)] | None
    ) = None
    """The jobs' last_error_code."""
    finished_after: Annotated[AwareDatetime, AfterValidator(_instant)] | None = None
    limit: int = Field(default=1000, ge=1, le=100_000)
    """At most this many, oldest finished first."""
    dry_run: bool = False
    """Count what would be retried; change nothing."""


class ScheduleList(BaseModel):
    schedules: list[ScheduleView]


class TenantList(BaseModel):
    tenants: list[TenantView]


class WorkerList(BaseModel):
    workers: list[WorkerView]


class Health(BaseModel):
    status: str = "ok"
