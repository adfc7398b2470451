"""The dashboard's pages: each one reads through the service layer (or the metrics
collector's cache), in one read-only snapshot, and renders a template."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Query, Request
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import Response

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.dashboard import render
from hybrid_jobs.jobctl.dashboard.actions import BULK_RETRY_LIMIT
from hybrid_jobs.jobctl.dashboard.auth import Viewer, viewer
from hybrid_jobs.jobctl.dashboard.charts import Charts, build
from hybrid_jobs.jobctl.dashboard.figures import Recent, figures
from hybrid_jobs.jobctl.metrics import Collector
from hybrid_jobs.jobctl.metrics.history import EMPTY, HistoryView
from hybrid_jobs.jobctl.output import held_for
from hybrid_jobs.jobctl.service import (
    Database,
    Invalid,
    JobFilter,
    get_job,
    list_jobs,
    list_keys,
    list_limits,
    list_schedules,
    list_tenants,
    list_workers,
    parse_job_id,
    queries,
    stats,
)
from hybrid_jobs.jobctl.service.jobs import ATTEMPTS_SHOWN
from hybrid_jobs.jobctl.service.models import JobPage, JobView
from hybrid_jobs.jobctl.service.sql import fetch_one
from hybrid_jobs.schema.states import CLAIMABLE, LEASED, REPLAYABLE, TERMINAL, JobState

router = APIRouter(include_in_schema=False)

PAGE_SIZE: Final = 50
Looker = Annotated[Viewer, Depends(viewer)]
# Filters come from a form: an empty field means "any".
Text = Annotated[str, Query(max_length=200)]


def _database(request: Request) -> Database:
    db: Database = request.app.state.database
    return db


def _recent(request: Request) -> Recent:
    # One per app, made on first use: the lifespan belongs to the API's module.
    found: Recent | None = getattr(request.app.state, "dashboard_recent", None)
    if found is None:
        found = request.app.state.dashboard_recent = Recent()
    return found


def _filter(
    state: Text = "", queue: Text = "", job_type: Text = "", tenant: Text = "", tag: Text = ""
) -> JobFilter:
    """The list's filter, from the page's query string (one tag: a chip's link, or
    the form's field)."""
    return JobFilter(
        JobState(state) if state in JobState.__members__ else None,
        queue.strip() or None,
        job_type.strip() or None,
        tenant.strip() or None,
        (tag.strip(),) if tag.strip() else (),
    )


Filter = Annotated[JobFilter, Depends(_filter)]
# A page token (see jobctl.service.jobs.list_jobs).
After = Annotated[str, Query(max_length=300)]


async def _clock(session: AsyncSession) -> datetime:
    """The database's clock, which every age on a page is measured from (the
    tables' times are its times, not this process's)."""
    row = await fetch_one(session, queries.STATS_CLOCK)
    assert row is not None
    now: datetime = row[0]
    return now


async def _page_of(
    request: Request, where: JobFilter, after: str
) -> tuple[JobPage | None, str, datetime]:
    """A page of jobs, or none and why (a filter or a page token it cannot use),
    and the clock."""
    async with _database(request).reading() as session:
        now = await _clock(session)
        try:
            found = await list_jobs(session, where, limit=PAGE_SIZE, after=after or None)
        except Invalid as exc:
            return None, str(exc), now
    return found, "", now


@router.get("/")
async def overview(request: Request, looker: Looker) -> Response:
    async with _database(request).reading() as session:
        found = await stats(session)
    collector: Collector | None = getattr(request.app.state, "collector", None)
    latency = figures(collector, _recent(request))
    return render.page(
        request,
        "overview.html",
        looker,
        stats=found,
        figures=latency,
        charts=_charts(request, collector),
        interval=collector.settings.interval if collector is not None else None,
        now=found.checked_at,
        queues=sorted({q.queue for q in found.queues} | set(latency.queues)),
        by_queue={q.queue: q for q in found.queues},
    )


def _charts(request: Request, collector: Collector | None) -> Charts:
    """From the collector's last round: its history, never a table. Built once
    per round (a page refreshes every few seconds, a round comes every 15 s, and
    a hundred queues' charts take a while to add up)."""
    if collector is None or not collector.running:
        return build(None)
    snapshot = collector.snapshot
    view = EMPTY if snapshot is None else snapshot.history
    cached: tuple[HistoryView, Charts] | None = getattr(request.app.state, "dashboard_charts", None)
    if cached is not None and cached[0] is view:
        return cached[1]
    found = build(view)
    request.app.state.dashboard_charts = (view, found)
    return found


@router.get("/jobs")
async def jobs(request: Request, looker: Looker, where: Filter, after: After = "") -> Response:
    return await _list_page(request, looker, "jobs.html", where, after, states=list(JobState))


@router.get("/failed")
async def failed(request: Request, looker: Looker, where: Filter, after: After = "") -> Response:
    # The failed jobs, or the cancelled ones: never another state's.
    shown = JobState.CANCELLED if where.state == JobState.CANCELLED else JobState.FAILED
    where = dataclasses.replace(where, state=shown)
    return await _list_page(
        request, looker, "failed.html", where, after, bulk_limit=BULK_RETRY_LIMIT
    )


async def _list_page(
    request: Request, looker: Viewer, template: str, where: JobFilter, after: str, **extra: Any
) -> Response:
    found, problem, now = await _page_of(request, where, after)
    return render.page(
        request,
        template,
        looker,
        page=found,
        problem=problem,
        where=where,
        after=after,
        now=now,
        **extra,
    )


@router.get("/jobs/{job_id}")
async def job(job_id: str, request: Request, looker: Looker) -> Response:
    ident = parse_job_id(job_id)
    found = None
    if ident is not None:
        async with _database(request).reading() as session:
            found = await get_job(session, ident)
    if found is None:
        return render.page(
            request,
            "missing.html",
            looker,
            status=404,
            what=f"no job {job_id[:100]}",
            detail="it never existed, or it finished and retention deleted it",
        )
    return render.page(
        request,
        "job.html",
        looker,
        job=found,
        why=found.why,
        now=found.checked_at,
        story=_story(found),
        attempts_shown=ATTEMPTS_SHOWN,
        # The type's policy as the statements hold to it: the page offers no action
        # they would refuse, and says why (an override is the CLI's or the API's).
        may_retry=found.state in REPLAYABLE and (found.policy is None or found.policy.replay),
        retry_not_allowed=found.state in REPLAYABLE
        and found.policy is not None
        and not found.policy.replay,
        may_cancel=found.state not in TERMINAL
        and found.state != JobState.CANCEL_REQUESTED
        and not _cancel_not_allowed(found),
        cancel_not_allowed=_cancel_not_allowed(found),
        may_force_cancel=found.state in LEASED
        and found.cancel_forced_at is None
        and not _cancel_not_allowed(found),
        may_approve=found.state == JobState.QUEUED
        and found.approval is not None
        and found.approval.status == "REQUIRED",
        may_edit=found.state in CLAIMABLE,
        # a payload shown cut short, or as text, is not one to send back
        payload_editable="payload" not in found.as_text
        and len(render.pretty(found.payload)) <= render.SHOWN_JSON,
        # what an <input type=datetime-local> shows: UTC, to the second
        run_after_input=found.run_after.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S"),
        leased=found.state in LEASED,
    )


def _cancel_not_allowed(job: JobView) -> bool:
    return (
        job.state == JobState.RUNNING and job.policy is not None and not job.policy.cancel_running
    )


def _story(job: JobView) -> list[dict[str, Any]]:
    """The job's life in order: created, (scheduled), each attempt with the wait
    before it, and where it stands now."""
    events: list[dict[str, Any]] = [{"kind": "created", "at": job.created_at}]
    # A job held for its approval or its parents is never due (run_after at the
    # hold, year 9999) until released: no "due in 2,912,106 days".
    held = held_for(job) is not None
    if (job.run_after - job.created_at).total_seconds() > 1 and not job.attempts and not held:
        events.append({"kind": "scheduled", "at": job.run_after})
    for attempt in job.attempts:
        events.append({"kind": "attempt", "at": attempt.started_at, "attempt": attempt})
    if job.state in LEASED and job.started_at is not None:
        events.append({"kind": "running", "at": job.started_at})
    elif job.done:
        events.append({"kind": "finished", "at": job.finished_at})
    elif held:
        events.append({"kind": "held", "at": job.delay_since or job.created_at})
    else:
        events.append({"kind": "waiting", "at": job.run_after})
    return events


@router.get("/schedules")
async def schedules(request: Request, looker: Looker) -> Response:
    async with _database(request).reading() as session:
        found, now = await list_schedules(session), await _clock(session)
    return render.page(request, "schedules.html", looker, schedules=found, now=now)


@router.get("/tenants")
async def tenants(request: Request, looker: Looker) -> Response:
    async with _database(request).reading() as session:
        found, now = await list_tenants(session), await _clock(session)
    return render.page(request, "tenants.html", looker, tenants=found, now=now)


@router.get("/keys")
async def keys(request: Request, looker: Looker) -> Response:
    async with _database(request).reading() as session:
        found, now = await list_keys(session), await _clock(session)
        limits = await list_limits(session)
        held = await outbox.resource_holds_async(session)
    return render.page(
        request,
        "keys.html",
        looker,
        keys=found,
        now=now,
        rate_limits=limits.rate_limits,
        concurrency_limits=limits.concurrency_limits,
        queue_limits=limits.queue_limits,
        resources=held,
    )


@router.get("/workers")
async def workers(request: Request, looker: Looker) -> Response:
    async with _database(request).reading() as session:
        found, now = await list_workers(session), await _clock(session)
    return render.page(request, "workers.html", looker, workers=found, now=now)
