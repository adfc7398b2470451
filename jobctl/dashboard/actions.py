"""The dashboard's buttons: sign in and out, retry, cancel, approve, reject and
edit jobs, bulk retry,
pause and resume queues and schedules, trigger a schedule.

Every change passes :func:`jobctl.dashboard.auth.may_act` (token configured,
session, same origin, CSRF token) before it touches the database, runs through the
service layer in one transaction, and answers with a redirect back to the page it
came from carrying a one-time message (post/redirect/get).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Final, TypeVar

from fastapi import APIRouter, Depends, Form, Query, Request
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import RedirectResponse, Response

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.api.guards import client_of, token_matches, too_many
from hybrid_jobs.jobctl.api.proxies import UNKNOWN
from hybrid_jobs.jobctl.api.tokens import Tokens
from hybrid_jobs.jobctl.dashboard import render
from hybrid_jobs.jobctl.dashboard.auth import (
    Refused,
    Viewer,
    end_session,
    local_path,
    may_act,
    open_session,
    root,
    same_origin,
)
from hybrid_jobs.jobctl.dashboard.flash import Flash
from hybrid_jobs.jobctl.service import (
    Database,
    ServiceError,
    approve_job,
    cancel_jobs,
    edit_job,
    get_job,
    parse_job_id,
    pause_queue,
    pause_schedule,
    queries,
    refusal,
    reject_job,
    resume_queue,
    resume_schedule,
    retry_jobs,
    retry_matching,
    trigger_schedule,
)
from hybrid_jobs.jobctl.service.models import BulkRetry, JobView
from hybrid_jobs.jobctl.service.sql import fetch_one
from hybrid_jobs.schema.states import JobState

router = APIRouter(include_in_schema=False)

T = TypeVar("T")

Actor = Annotated[Viewer, Depends(may_act)]
Back = Annotated[str, Form(max_length=2000)]
# Jobs one "retry selected" takes: a page's worth, and then some.
MAX_SELECTED: Final = 500
# The most jobs one "retry every match" moves: a page that waits on a bigger
# statement helps nobody, and pressing again does the rest.
BULK_RETRY_LIMIT: Final = 10_000


def _database(request: Request) -> Database:
    db: Database = request.app.state.database
    return db


def _by(request: Request) -> str:
    """Who acted, as a replay or a pause records it: one token is shared by every
    operator, so the client's address (validated, never a header's text) is what
    tells them apart."""
    client = client_of(request)
    return "dashboard" if client == UNKNOWN else f"dashboard ({client})"


def _done(request: Request, actor: Viewer, back: str, flash: Flash, default: str = "/") -> Response:
    response = RedirectResponse(
        local_path(back, root(request) + default, root(request)), status_code=303
    )
    flash.set(response, actor.flash_key, root(request))
    return response


async def _write(request: Request, change: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """``change`` in one writing transaction, committed when it returns."""
    async with _database(request).writing() as session:
        return await change(session)


async def _act(
    request: Request,
    actor: Viewer,
    back: str,
    default: str,
    action: Callable[[], Awaitable[Flash]],
) -> Response:
    """Run ``action`` and go back with its message; a refusal of the service
    layer (or of a tenant's backpressure) becomes the message."""
    try:
        flash = await action()
    except (ServiceError, outbox.Backpressure) as exc:
        flash = Flash("error", str(exc))
    return _done(request, actor, back, flash, default)


# ------------------------------------------------------------------ signing in


@router.get("/login")
async def login_form(request: Request, next: str = "/") -> Response:
    return render.page(
        request,
        "login.html",
        None,
        next=local_path(next, root(request) + "/", root(request)),
        configured=_tokens(request) is not None,
    )


def _tokens(request: Request) -> Tokens | None:
    tokens: Tokens | None = request.app.state.tokens
    return tokens


@router.post("/login")
async def login(
    request: Request,
    token: Annotated[str, Form(max_length=1000)] = "",
    next: Annotated[str, Form(max_length=2000)] = "/",
) -> Response:
    target = local_path(next, root(request) + "/", root(request))
    if not same_origin(request):
        raise Refused("refused: the sign-in did not come from this dashboard's own page")
    tokens = _tokens(request)

    def again(problem: str | None, status: int) -> Response:
        return render.page(
            request,
            "login.html",
            None,
            status=status,
            next=target,
            configured=tokens is not None,
            problem=problem,
        )

    if tokens is None:
        return again(None, 403)
    limited = too_many(request)
    if limited is not None:
        response = again(str(limited.detail), 429)
        response.headers.update(limited.headers or {})
        return response
    current = tokens.current()
    if current is None:
        return again("this server's token file holds no usable token now; see its log", 503)
    if not token_matches(request, token):
        return again("that is not the token", 401)
    response = RedirectResponse(target, status_code=303)
    await open_session(request, response, current)
    return response


@router.post("/logout")
async def logout(request: Request, _actor: Actor) -> Response:
    response = RedirectResponse(root(request) + "/login", status_code=303)
    await end_session(request, response)
    return response


# ------------------------------------------------------------------ jobs


def _job_id(text: str) -> uuid.UUID:
    ident = parse_job_id(text)
    if ident is None:
        raise Refused(f"no job {text[:100]!r}: not a job id", 404)
    return ident


@router.post("/jobs/{job_id}/retry")
async def retry_one(job_id: str, request: Request, actor: Actor, back: Back = "") -> Response:
    ident = _job_id(job_id)

    async def action() -> Flash:
        (change,) = await _write(
            request, lambda session: retry_jobs(session, [ident], by=_by(request))
        )
        if change.state is None:
            return Flash("error", f"no job {ident}")
        if change.not_allowed is not None:
            return Flash("error", f"not retried: {refusal(change, 'replay')}")
        if not change.applied:
            return Flash(
                "error", f"not retried: the job is {change.state}, not FAILED or CANCELLED"
            )
        return Flash("ok", "Retried: the job is QUEUED again, due now.")

    return await _act(request, actor, back, f"/jobs/{ident}", action)


@router.post("/jobs/{job_id}/cancel")
async def cancel_one(
    job_id: str,
    request: Request,
    actor: Actor,
    back: Back = "",
    force: Annotated[bool, Query()] = False,
) -> Response:
    ident = _job_id(job_id)

    async def action() -> Flash:
        (change,) = await _write(
            request, lambda session: cancel_jobs(session, [ident], force=force)
        )
        if change.state is None:
            return Flash("error", f"no job {ident}")
        if change.not_allowed is not None:
            return Flash(
                "error", f"not cancelled: {refusal(change, 'cancelling it while it runs')}"
            )
        if not change.applied:
            return Flash("error", f"not cancelled: the job is {change.state} already")
        if change.state == JobState.CANCEL_REQUESTED and force:
            return Flash(
                "ok",
                "Cancel requested (forced): its worker interrupts the handler at its next "
                "heartbeat, and the job ends CANCELLED.",
            )
        if change.state == JobState.CANCEL_REQUESTED:
            return Flash("ok", "Cancel requested: its handler sees it at its next heartbeat.")
        return Flash("ok", "Cancelled.")

    return await _act(request, actor, back, f"/jobs/{ident}", action)


@router.post("/jobs/{job_id}/approve")
async def approve_one(job_id: str, request: Request, actor: Actor, back: Back = "") -> Response:
    ident = _job_id(job_id)

    async def action() -> Flash:
        await _write(request, lambda session: approve_job(session, ident, by=_by(request)))
        return Flash("ok", "Approved: the job is due now.")

    return await _act(request, actor, back, f"/jobs/{ident}", action)


@router.post("/jobs/{job_id}/reject")
async def reject_one(job_id: str, request: Request, actor: Actor, back: Back = "") -> Response:
    ident = _job_id(job_id)

    async def action() -> Flash:
        await _write(
            request,
            lambda session: reject_job(
                session, ident, by=_by(request), reason="rejected from the dashboard"
            ),
        )
        return Flash("ok", "Rejected: the job is CANCELLED and will not run.")

    return await _act(request, actor, back, f"/jobs/{ident}", action)


@router.post("/jobs/{job_id}/edit")
async def edit_one(
    job_id: str,
    request: Request,
    actor: Actor,
    priority: Annotated[str, Form(max_length=20)] = "",
    run_after: Annotated[str, Form(max_length=40)] = "",
    max_attempts: Annotated[str, Form(max_length=20)] = "",
    payload: Annotated[str | None, Form(max_length=1_000_000)] = None,
    back: Back = "",
) -> Response:
    """The form shows the job's values: only those changed are edited, so a start
    left as it was does not move its wake-up. ``run_after`` is UTC, to the second
    (an ``<input type=datetime-local>``)."""
    ident = _job_id(job_id)

    async def action() -> Flash:
        try:
            wanted = _edits(priority, run_after, max_attempts, payload)
        except ValueError as exc:
            return Flash("error", f"not edited: {exc}")
        async with _database(request).writing() as session:
            job = await get_job(session, ident)
            if job is None:
                return Flash("error", f"no job {ident}")
            changed = {k: v for k, v in wanted.items() if not _same(job, k, v)}
            if not changed:
                return Flash("ok", "Nothing changed.")
            await edit_job(session, ident, **changed)
        return Flash("ok", f"Edited: {', '.join(sorted(changed))}.")

    return await _act(request, actor, back, f"/jobs/{ident}", action)


def _edits(priority: str, run_after: str, max_attempts: str, payload: str | None) -> dict[str, Any]:
    """The edit form's fields, parsed (a blank one: not given)."""
    found: dict[str, Any] = {}
    for name, text in (("priority", priority), ("max_attempts", max_attempts)):
        if text.strip():
            try:
                found[name] = int(text.strip())
            except ValueError:
                raise ValueError(f"{name} must be a whole number") from None
    if run_after.strip():
        try:
            when = datetime.fromisoformat(run_after.strip())
        except ValueError:
            raise ValueError("run_after is not a date and time") from None
        found["run_after"] = when if when.tzinfo else when.replace(tzinfo=UTC)
    if payload is not None:
        try:
            found["payload"] = json.loads(payload)
        except (json.JSONDecodeError, RecursionError):
            raise ValueError("the payload is not JSON") from None
    return found


def _same(job: JobView, name: str, value: Any) -> bool:
    """Whether the form's ``value`` is what the job has (its start to the second)."""
    if name == "run_after":
        return bool(job.run_after.replace(microsecond=0) == value)
    current: Any = getattr(job, name)
    return bool(current == value and type(current) is type(value))


@router.post("/failed/retry")
async def retry_selected(request: Request, actor: Actor, back: Back = "") -> Response:
    form = await request.form()
    chosen = [parse_job_id(str(v)) for v in form.getlist("job")][: MAX_SELECTED + 1]
    ids = [i for i in chosen if i is not None]

    async def action() -> Flash:
        if not ids:
            return Flash("error", "nothing selected: tick the jobs to retry first")
        if len(ids) > MAX_SELECTED:
            return Flash("error", f"at most {MAX_SELECTED} jobs at a time")
        changes = await _write(request, lambda session: retry_jobs(session, ids, by=_by(request)))
        moved = sum(c.applied for c in changes)
        forbidden = sum(c.not_allowed is not None for c in changes)
        skipped = len(changes) - moved - forbidden
        text = f"Retried {moved} of {len(changes)} selected jobs."
        if forbidden:
            text += f" {forbidden} were left alone: their type does not allow replay."
        if skipped:
            text += f" {skipped} had changed state meanwhile and were left alone."
        return Flash("ok" if moved else "error", text)

    return await _act(request, actor, back, "/failed", action)


@router.post("/failed/retry-matching")
async def retry_all_matching(
    request: Request,
    viewer: Actor,
    queue: Annotated[str, Form(max_length=200)] = "",
    job_type: Annotated[str, Form(max_length=200)] = "",
    state: Annotated[str, Form(max_length=20)] = "FAILED",
    confirm: Annotated[str, Form(max_length=10)] = "",
    every: Annotated[str, Form(max_length=10)] = "",
    back: Back = "",
) -> Response:
    """Without ``confirm``: count what would be retried (a dry run of the same
    statement) and ask; with it: retry them. The jobs of the list's state only
    (FAILED, or CANCELLED from the Cancelled tab: a cancel is not retried unless
    that list is the one shown). With no queue and no type, the confirmation asks
    for "every" on purpose, and the retry needs it."""
    chosen_queue, chosen_type = queue.strip() or None, job_type.strip() or None
    cancelled = state == JobState.CANCELLED
    unfiltered = chosen_queue is None and chosen_type is None
    kinds = "CANCELLED" if cancelled else "FAILED"

    async def run(dry_run: bool) -> BulkRetry:
        async with _database(request).writing() as session:
            return await retry_matching(
                session,
                queue=chosen_queue,
                job_type=chosen_type,
                every=unfiltered,
                states=(JobState.CANCELLED,) if cancelled else (JobState.FAILED,),
                limit=BULK_RETRY_LIMIT,
                dry_run=dry_run,
                by=_by(request),
            )

    if confirm != "yes":
        try:
            found = await run(True)
        except ServiceError as exc:
            return _done(request, viewer, back, Flash("error", str(exc)), "/failed")
        return render.page(
            request,
            "confirm_retry.html",
            viewer,
            matched=found.matched,
            not_allowed=found.not_allowed,
            limit=BULK_RETRY_LIMIT,
            queue=chosen_queue,
            job_type=chosen_type,
            state=kinds,
            every=unfiltered,
            back=local_path(back, root(request) + "/failed", root(request)),
            # A page that answers a POST: refreshing it would GET another page.
            static=True,
        )

    async def action() -> Flash:
        if unfiltered and every != "yes":
            return Flash(
                "error",
                f"not retried: with no queue or type this is every {kinds} job;"
                " tick \u201cevery one\u201d to confirm",
            )
        done = await run(False)
        more = " (the most one press moves: press again for the rest)"
        more = more if done.matched >= BULK_RETRY_LIMIT else ""
        text = f"Retried {done.matched} {kinds} jobs{more}."
        if done.not_allowed:
            text += f" {done.not_allowed} were left alone: their type does not allow replay."
        return Flash("ok", text)

    return await _act(request, viewer, back, "/failed", action)


# ------------------------------------------------------------------ queues


@router.post("/queues/{queue}/pause")
async def pause(queue: str, request: Request, actor: Actor, back: Back = "") -> Response:
    async def action() -> Flash:
        await _write(request, lambda session: pause_queue(session, queue, by=_by(request)))
        return Flash("ok", f"Queue {queue} paused: none of its jobs starts until resumed.")

    return await _act(request, actor, back, "/", action)


@router.post("/queues/{queue}/resume")
async def resume(queue: str, request: Request, actor: Actor, back: Back = "") -> Response:
    async def action() -> Flash:
        was = await _write(request, lambda session: resume_queue(session, queue, by=_by(request)))
        text = f"Queue {queue} resumed." if was.changed else f"Queue {queue} was not paused."
        return Flash("ok", text)

    return await _act(request, actor, back, "/", action)


# ------------------------------------------------------------------ schedules


@router.post("/schedules/{name:path}/pause")
async def schedule_pause(name: str, request: Request, actor: Actor, back: Back = "") -> Response:
    async def action() -> Flash:
        await _write(request, lambda session: pause_schedule(session, name))
        return Flash("ok", f"Schedule {name} paused.")

    return await _act(request, actor, back, "/schedules", action)


@router.post("/schedules/{name:path}/resume")
async def schedule_resume(name: str, request: Request, actor: Actor, back: Back = "") -> Response:
    async def action() -> Flash:
        async with _database(request).writing() as session:
            found = await resume_schedule(session, name)
            now = await fetch_one(session, queries.STATS_CLOCK)
        assert now is not None
        return Flash(
            "ok",
            f"Schedule {name} resumed; next fire {render.relative(found.next_fire_at, now[0])}.",
        )

    return await _act(request, actor, back, "/schedules", action)


@router.post("/schedules/{name:path}/trigger")
async def schedule_trigger(name: str, request: Request, actor: Actor, back: Back = "") -> Response:
    async def action() -> Flash:
        job = await _write(request, lambda session: trigger_schedule(session, name))
        return Flash("ok", f"Schedule {name} triggered.", f"/jobs/{job.id}", "See the job")

    return await _act(request, actor, back, "/schedules", action)
