"""``jobctl schedules``: list recurring schedules, pause, resume, trigger."""

from __future__ import annotations

from collections.abc import Callable

import click

from hybrid_jobs.jobctl.commands.common import database_option, read, write
from hybrid_jobs.jobctl.output import emit, json_option, table, when
from hybrid_jobs.jobctl.service import (
    jsonable,
    list_schedules,
    pause_schedule,
    resume_schedule,
    trigger_schedule,
)
from hybrid_jobs.jobctl.service.models import ScheduleView


@click.group()
def schedules() -> None:
    """Recurring schedules (outbox.schedule makes them; the relay fires them)."""


def _on_one(fn: Callable[..., None]) -> click.Command:
    """A ``jobctl schedules`` command on the one schedule its argument names."""
    return schedules.command()(click.argument("name")(database_option(json_option(fn))))


def _rule(s: ScheduleView) -> str:
    if s.cron is not None:
        return f"cron {s.cron} ({s.timezone})"
    return f"every {s.every_seconds:g}s"


@schedules.command("list")
@database_option
@json_option
def list_(database_url: str | None) -> None:
    """Every schedule: its rule, its job, when it fires next, and its last fire."""
    found = read(database_url, list_schedules)
    rows = [
        [
            s.name,
            _rule(s),
            f"{s.job_type} on {s.queue}",
            "paused" if s.paused else when(s.next_fire_at),
            "-"
            if s.last_fire is None
            else f"{when(s.last_fire.scheduled_for)} {s.last_fire.outcome}",
        ]
        for s in found
    ]
    text = table(["NAME", "RULE", "JOB", "NEXT", "LAST"], rows) if found else "no schedules"
    emit({"schedules": jsonable(found)}, text)


@_on_one
def pause(name: str, database_url: str | None) -> None:
    """Stop firing NAME until it is resumed."""
    found = write(database_url, lambda session: pause_schedule(session, name))
    emit(jsonable(found), f"{found.name}: paused")


@_on_one
def resume(name: str, database_url: str | None) -> None:
    """Fire NAME again, from its next occurrence after now (the ones missed while
    it was paused do not run)."""
    found = write(database_url, lambda session: resume_schedule(session, name))
    emit(jsonable(found), f"{found.name}: resumed, next fire {when(found.next_fire_at)}")


@_on_one
def trigger(name: str, database_url: str | None) -> None:
    """Enqueue one job now from NAME's template; its timetable stays as it is."""
    job = write(database_url, lambda session: trigger_schedule(session, name))
    emit(jsonable(job), f"{name}: enqueued job {job.id} ({job.job_type} on {job.queue})")
