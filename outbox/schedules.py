"""Recurring schedules, written inside the caller's SQLAlchemy transaction.

::

    with Session(engine) as session, session.begin():
        outbox.schedule(session, "nightly-report", "build_report", {"kind": "daily"},
                        cron="30 2 * * *", timezone="Europe/Berlin")

A schedule is created or updated by name; the relay fires its occurrences (see
:mod:`relay.schedules`). Like enqueue, nothing here commits, and every argument is
checked before anything is written. Times come from the database's clock.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from hybrid_jobs.outbox.enqueue import insert_jobs, psycopg_connection
from hybrid_jobs.outbox.recurrence import Recurrence, check_catchup, recurrence
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.outbox.validation import (
    JsonDefault,
    NewJob,
    check_tags,
    encode_meta,
    encode_payload,
    max_payload_bytes,
    plain_json,
    to_row,
)
from hybrid_jobs.schema import names
from hybrid_jobs.schema.queries import (
    SCHEDULE_CLOCK,
    SCHEDULE_DELETE,
    SCHEDULE_PAUSE,
    SCHEDULE_RESUME,
    SCHEDULE_RULE_FOR_UPDATE,
    SCHEDULE_TEMPLATE,
    SCHEDULE_UPSERT,
)
from hybrid_jobs.schema.tables import MAX_SCHEDULE_NAME_LENGTH

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

# A schedule's payload passed the producer's size limit when the schedule was
# written; a process with a smaller limit must not make the schedule unfireable.
NO_PAYLOAD_LIMIT: Final = sys.maxsize


@dataclass(frozen=True)
class JobTemplate:
    """What each occurrence of a schedule enqueues: the relay's fires and a manual
    :func:`trigger_schedule` build their job from it alike."""

    job_type: str
    payload: Any
    queue: str
    tenant: str | None
    priority: int
    max_attempts: int | None
    tags: Collection[str] = ()
    meta: Mapping[str, Any] | None = None

    def job(self, dedup_key: str | None = None) -> NewJob:
        return NewJob(
            self.job_type,
            self.payload,
            queue=self.queue,
            dedup_key=dedup_key,
            max_attempts=self.max_attempts,
            priority=self.priority,
            tenant=self.tenant,
            tags=self.tags,
            meta=self.meta,
        )


@dataclass(frozen=True)
class _Schedule:
    rule: Recurrence
    params: dict[str, Any]  # SCHEDULE_UPSERT's, all but next_fire_at

    def upsert(self, clock: datetime) -> dict[str, Any]:
        return self.params | {"next_fire_at": self.rule.next_after(clock)}


def _name(value: object) -> str:
    return names.text("name", value, MAX_SCHEDULE_NAME_LENGTH)


def _tenant(value: object) -> str | None:
    return None if value is None else names.tenant(value)


def _prepare(
    name: str,
    job_type: str,
    payload: Any,
    *,
    cron: str | None,
    every: timedelta | None,
    timezone: str,
    queue: str,
    tenant: str | None,
    priority: int,
    max_attempts: int | None,
    catchup: str,
    json_default: JsonDefault | None = None,
    tags: Collection[str] = (),
    meta: Mapping[str, Any] | None = None,
) -> _Schedule:
    rule = recurrence(cron, every, timezone)
    limit = max_payload_bytes()
    if json_default is not None:
        # stored as plain JSON: every occurrence enqueues what the handler will read
        payload = plain_json("payload", payload, json_default)
    # The job each occurrence enqueues must be acceptable now, not fail at every fire.
    job = NewJob(
        job_type,
        payload,
        queue,
        None,
        None,
        max_attempts,
        priority,
        tags=tags,
        meta=meta,
        json_default=json_default,
    )
    to_row(job, limit)
    return _Schedule(
        rule,
        {
            "name": _name(name),
            "job_type": job_type,
            "payload": encode_payload(payload, limit),
            "cron": rule.cron,
            "every_seconds": rule.every_seconds,
            "timezone": rule.timezone,
            "queue": queue,
            "tenant": _tenant(tenant),
            "priority": priority,
            "max_attempts": max_attempts,
            "catchup": check_catchup(catchup),
            "tags": check_tags(tags),
            "meta": encode_meta(meta, json_default),
        },
    )


def schedule(
    session: Session,
    name: str,
    job_type: str,
    payload: Any = None,
    *,
    cron: str | None = None,
    every: timedelta | None = None,
    timezone: str = "UTC",
    queue: str = "default",
    tenant: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    catchup: str = "latest",
    json_default: JsonDefault | None = None,
    tags: Collection[str] = (),
    meta: Mapping[str, Any] | None = None,
) -> datetime:
    """Create or update the schedule ``name``; returns its next fire instant (UTC).

    Give exactly one of ``cron`` (five fields, or six with seconds first, read in
    the IANA zone ``timezone``) and ``every`` (a timedelta of at least one second;
    occurrences are its multiples since the Unix epoch). Each occurrence enqueues
    ``job_type`` with ``payload`` on ``queue`` with ``priority`` and
    ``max_attempts``, meaning what they mean for :func:`outbox.enqueue`.
    ``catchup`` says what happens to occurrences missed while no relay ran:
    ``"skip"`` (only the newest runs, and only if it is at most a minute late),
    ``"latest"`` (the newest one runs, however late) or ``"all"`` (each runs, up to
    the relay's bound); the others are recorded as skipped. ``tenant`` is stored with the schedule.
    ``json_default`` encodes what JSON cannot hold, as for :func:`outbox.enqueue`,
    once, when the schedule is written. ``tags`` and ``meta`` are given to each
    occurrence's job, as :func:`outbox.enqueue`'s.

    A new rule (cron, every or timezone) starts from the first occurrence after the
    database's clock; an update that keeps the rule keeps the schedule's place.
    Raises ``TypeError``/``ValueError`` naming the argument, before writing
    anything. Writes through the session's transaction and never commits.
    """
    spec = _prepare(
        name,
        job_type,
        payload,
        cron=cron,
        every=every,
        timezone=timezone,
        queue=queue,
        tenant=tenant,
        priority=priority,
        max_attempts=max_attempts,
        catchup=catchup,
        json_default=json_default,
        tags=tags,
        meta=meta,
    )
    conn = psycopg_connection(session)
    clock = conn.exec_driver_sql(SCHEDULE_CLOCK).scalar_one()
    result: datetime = conn.exec_driver_sql(SCHEDULE_UPSERT, spec.upsert(clock)).scalar_one()
    return result


schedule_async = async_twin(schedule)


def unschedule(session: Session, name: str) -> bool:
    """Delete the schedule and its fire records; returns whether it existed. Jobs it
    enqueued already are left alone."""
    params = {"name": _name(name)}
    return psycopg_connection(session).exec_driver_sql(SCHEDULE_DELETE, params).first() is not None


unschedule_async = async_twin(unschedule)


def pause_schedule(session: Session, name: str) -> bool:
    """Stop firing the schedule until it is resumed; returns whether it exists."""
    params = {"name": _name(name)}
    return psycopg_connection(session).exec_driver_sql(SCHEDULE_PAUSE, params).first() is not None


pause_schedule_async = async_twin(pause_schedule)


def resume_schedule(session: Session, name: str) -> datetime | None:
    """Fire the schedule again, from its first occurrence after now: the ones that fell
    while it was paused are not run. Returns its next fire instant, or None if there
    is no such schedule. Resuming one that is not paused changes nothing."""
    params = {"name": _name(name)}
    conn = psycopg_connection(session)
    row = conn.exec_driver_sql(SCHEDULE_RULE_FOR_UPDATE, params).first()
    if row is None:
        return None
    resumed = params | {"next_fire_at": _resumed_at(row)}
    result: datetime = conn.exec_driver_sql(SCHEDULE_RESUME, resumed).scalar_one()
    return result


resume_schedule_async = async_twin(resume_schedule)


def _resumed_at(row: Sequence[Any]) -> datetime | None:
    # SCHEDULE_RULE_FOR_UPDATE's columns.
    cron, every_seconds, timezone, paused, clock = row
    if not paused:
        return None
    return Recurrence.from_row(cron, every_seconds, timezone).next_after(clock)


def trigger_schedule(session: Session, name: str) -> uuid.UUID | None:
    """Enqueue one job now from the schedule ``name``'s template, as an occurrence
    would; returns its id, or None if there is no such schedule.

    Off the schedule's timetable: ``next_fire_at`` and the fire ledger are left as
    they are, and a paused schedule can be triggered too. The job is an ordinary
    enqueue (no dedup key; a tenant's ``max_queued`` applies and raises
    :class:`outbox.Backpressure`). Writes through the session's transaction and
    never commits.
    """
    row = (
        psycopg_connection(session)
        .exec_driver_sql(SCHEDULE_TEMPLATE, {"name": _name(name)})
        .first()
    )
    if row is None:
        return None
    return insert_jobs(session, [JobTemplate(*row).job()], NO_PAYLOAD_LIMIT)[0]


trigger_schedule_async = async_twin(trigger_schedule)
