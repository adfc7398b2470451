"""``jobctl jobs``: list, show, cancel (and retry) jobs."""

from __future__ import annotations

import json
from typing import Any

import click

from jobctl.commands.common import database_option, parse_ids, run
from jobctl.output import Failure, duration, emit, json_option, table, when
from jobctl.service import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    Database,
    JobFilter,
    cancel_jobs,
    get_job,
    jsonable,
    list_jobs,
)
from jobctl.service.models import JobPage, JobSummary, JobView
from schema.states import JobState


@click.group()
def jobs() -> None:
    """List, show, cancel and retry jobs."""


@jobs.command("list")
@click.option("--state", type=click.Choice([s.value for s in JobState]), help="Only this state.")
@click.option("--queue", metavar="NAME", help="Only this queue.")
@click.option("--type", "job_type", metavar="TYPE", help="Only this job type.")
@click.option("--tenant", metavar="NAME", help="Only this tenant's jobs.")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIMIT),
    default=DEFAULT_LIMIT,
    show_default=True,
    help="Jobs per page.",
)
@click.option("--after", metavar="TOKEN", help="Start after the page that printed this token.")
@database_option
@json_option
def list_(
    state: str | None,
    queue: str | None,
    job_type: str | None,
    tenant: str | None,
    limit: int,
    after: str | None,
    database_url: str | None,
    as_json: bool,
) -> None:
    """Jobs, newest first: waiting and running ones by when they were created,
    finished ones (--state SUCCEEDED, FAILED, CANCELLED) by when they finished.

    A page ends with the token for the next one. Filtered lists over finished
    jobs read a bounded number of them per page, so a page may come back short
    (even empty) with a token to read further back.
    """
    del as_json
    where = JobFilter(None if state is None else JobState(state), queue, job_type, tenant)

    async def action(db: Database) -> JobPage:
        async with db.reading() as session:
            return await list_jobs(session, where, limit=limit, after=after)

    page = run(database_url, action)
    emit(jsonable(page), _page_text(page))


def _page_text(page: JobPage) -> str:
    rows = [_row(job) for job in page.jobs]
    lines = [
        table(
            ["ID", "STATE", "QUEUE", "TYPE", "TENANT", "ATTEMPT", "CREATED", "FINISHED", "ERROR"],
            rows,
        )
    ]
    if not page.jobs:
        lines = ["no jobs" + (" in this stretch" if page.scan_limited else "")]
    if page.next:
        reason = " (searched as far as one page may read)" if page.scan_limited else ""
        lines.append(f"next page{reason}: --after {page.next}")
    return "\n".join(lines)


def _row(job: JobSummary) -> list[object]:
    budget = "?" if job.max_attempts is None else job.max_attempts
    return [
        job.id,
        job.state,
        job.queue,
        job.job_type,
        job.tenant or "-",
        f"{job.attempt}/{budget}",
        when(job.created_at),
        when(job.finished_at),
        job.last_error_code or "",
    ]


@jobs.command()
@click.argument("job_id", metavar="ID")
@database_option
@json_option
def show(job_id: str, database_url: str | None, as_json: bool) -> None:
    """One job: its row, every attempt, and why it waits."""
    del as_json
    (ident,) = parse_ids((job_id,))

    async def action(db: Database) -> JobView | None:
        async with db.reading() as session:
            return await get_job(session, ident)

    job = run(database_url, action)
    if job is None:
        raise Failure(f"no job {ident} (it never existed, or it finished and was deleted)")
    emit(jsonable(job), _job_text(job))


def _compact(value: Any, limit: int = 400) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _job_text(job: JobView) -> str:
    budget = "handler's" if job.max_attempts is None else str(job.max_attempts)
    due = (job.run_after - job.checked_at).total_seconds()
    fields: list[tuple[str, object]] = [
        ("job", f"{job.id}  {job.job_type} on {job.queue}"),
        ("tenant", job.tenant or "-"),
        ("state", f"{job.state} (attempt {job.attempt} of {budget}, priority {job.priority})"),
        ("run after", when(job.run_after) + (f" (in {duration(due)})" if due > 0 else "")),
        ("created", when(job.created_at)),
        ("started", when(job.started_at)),
        ("finished", when(job.finished_at)),
    ]
    if job.lease is not None:
        lease = job.lease
        fields.append(
            (
                "lease",
                f"{lease.worker}, generation {lease.generation}, until {when(lease.expires_at)}",
            )
        )
    if job.cancel_requested_at is not None:
        fields.append(("cancel asked", when(job.cancel_requested_at)))
    if job.last_error is not None:
        fields.append(("last error", f"{job.last_error.code}: {job.last_error.message}"))
    if job.delay_reason is not None:
        fields.append(("turned down", f"{job.delay_reason} since {when(job.delay_since)}"))
    if job.why is not None:
        fields.append(("why", job.why.summary))
        fields.extend(("", f"{b.code}: {_compact(b.facts, 200)}") for b in job.why.blockers)
    fields += [
        (
            "progress",
            "-" if job.progress is None else f"{_compact(job.progress)} at {when(job.progress_at)}",
        ),
        ("result", "-" if job.result is None else _compact(job.result)),
        ("dedup key", job.dedup_key or "-"),
        ("payload", _compact(job.payload)),
    ]
    width = max(len(name) for name, _ in fields)
    lines = [f"{name.ljust(width)}  {value}" for name, value in fields]
    if job.attempts:
        lines += ["", "attempts:"]
        rows = [
            [
                a.attempt,
                a.worker,
                when(a.started_at),
                duration((a.finished_at - a.started_at).total_seconds()),
                a.outcome,
                f"{a.error_code}: {a.error_message}" if a.error_code else "",
            ]
            for a in job.attempts
        ]
        lines.append(table(["#", "WORKER", "STARTED", "TOOK", "OUTCOME", "ERROR"], rows))
    return "\n".join(lines)


@jobs.command()
@click.argument("job_ids", metavar="ID...", nargs=-1, required=True)
@database_option
@json_option
def cancel(job_ids: tuple[str, ...], database_url: str | None, as_json: bool) -> None:
    """Cancel jobs that wait; ask running ones to stop (their handler sees it at its
    next heartbeat). Exits 1 if any job was unknown or had already finished
    otherwise."""
    del as_json
    ids = parse_ids(job_ids)

    async def action(db: Database) -> list[Any]:
        async with db.writing() as session:
            return await cancel_jobs(session, ids)

    results = run(database_url, action)
    lines = []
    for r in results:
        if r.state is None:
            lines.append(f"{r.id}: no such job")
        elif r.applied:
            lines.append(f"{r.id}: {r.state}")
        else:
            lines.append(f"{r.id}: {r.state} already, not cancelled")
    emit({"jobs": jsonable(results)}, "\n".join(lines))
    if not all(r.applied for r in results):
        raise SystemExit(1)
