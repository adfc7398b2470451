"""Recurring schedules: list them, pause, resume, and trigger one now."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.service import queries
from hybrid_jobs.jobctl.service.errors import NotFound, invalid_argument
from hybrid_jobs.jobctl.service.jobs import get_job
from hybrid_jobs.jobctl.service.models import JobView, LastFire, ScheduleView
from hybrid_jobs.jobctl.service.sql import fetch_all, fetch_one
from hybrid_jobs.outbox.validation import read_json as readable

T = TypeVar("T")


def _view(row: tuple[Any, ...]) -> ScheduleView:
    # queries.SCHEDULE_GET's columns: the schedule's, then its newest fire's.
    (name, job_type, payload_text, cron, every_seconds, timezone, queue, tenant, priority) = row[:9]
    payload, whole = readable(payload_text)
    (max_attempts, catchup, paused, next_fire_at, last_fire_at, created_at, updated_at) = row[9:16]
    scheduled_for, fired_at, outcome, skip_reason, job_id = row[16:]
    last = None
    if scheduled_for is not None:
        last = LastFire(scheduled_for, fired_at, outcome, skip_reason, job_id)
    return ScheduleView(
        name,
        job_type,
        payload,
        cron,
        every_seconds,
        timezone,
        queue,
        tenant,
        priority,
        max_attempts,
        catchup,
        paused,
        next_fire_at,
        last_fire_at,
        created_at,
        updated_at,
        last,
        () if whole else ("payload",),
    )


async def list_schedules(session: AsyncSession) -> list[ScheduleView]:
    """Every schedule, by name, with its newest fire. Reads only."""
    return [_view(row) for row in await fetch_all(session, queries.SCHEDULES_LIST)]


async def get_schedule(session: AsyncSession, name: str) -> ScheduleView | None:
    row = await fetch_one(session, queries.SCHEDULE_GET, {"name": name})
    return None if row is None else _view(row)


async def _after(session: AsyncSession, name: str) -> ScheduleView:
    found = await get_schedule(session, name)
    if found is None:
        raise NotFound(f"no schedule named {name!r}")
    return found


async def _named(
    change: Callable[[AsyncSession, str], Awaitable[T | None]], session: AsyncSession, name: str
) -> T:
    """What ``change`` (an outbox call on the schedule ``name``) returns; its refusal
    of the name as Invalid, and no answer (None or False) as NotFound."""
    try:
        found = await change(session, name)
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc, "name") from None
    if found is None or found is False:
        raise NotFound(f"no schedule named {name!r}")
    return found


async def pause_schedule(session: AsyncSession, name: str) -> ScheduleView:
    """Stop firing it until resumed (outbox.pause_schedule_async). Never commits."""
    await _named(outbox.pause_schedule_async, session, name)
    return await _after(session, name)


async def resume_schedule(session: AsyncSession, name: str) -> ScheduleView:
    """Fire it again from its next occurrence after now (outbox.resume_schedule_async).
    Never commits."""
    await _named(outbox.resume_schedule_async, session, name)
    return await _after(session, name)


async def trigger_schedule(session: AsyncSession, name: str) -> JobView:
    """Enqueue one job now from its template (outbox.trigger_schedule_async); the
    timetable is left as it is. Raises outbox.Backpressure like an enqueue. Never
    commits."""
    job_id = await _named(outbox.trigger_schedule_async, session, name)
    job = await get_job(session, job_id)
    assert job is not None
    return job
