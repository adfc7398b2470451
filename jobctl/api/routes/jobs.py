"""/v1/jobs: enqueue, list, look at, edit, cancel (and retry)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from pydantic import Field

from hybrid_jobs.jobctl.api.guards import GuardedRoute, may_read, may_write
from hybrid_jobs.jobctl.api.models import (
    CancelBody,
    EditBody,
    EnqueueBody,
    JobType,
    QueueName,
    RejectBody,
    RetryBody,
    RetryRequest,
    Tag,
)
from hybrid_jobs.jobctl.api.problems import WITH_BODY, responses
from hybrid_jobs.jobctl.api.routes.common import F, actor, database, url
from hybrid_jobs.jobctl.api.waiters import Waiters, client_of
from hybrid_jobs.jobctl.service import Invalid, NotFound, WrongState
from hybrid_jobs.jobctl.service import jobs as service
from hybrid_jobs.jobctl.service.models import BulkRetry, JobPage, JobStateChange, JobView
from hybrid_jobs.schema.states import LEASED, JobState
from hybrid_jobs.schema.tables import MAX_TAGS

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=GuardedRoute)


def _job_change(action: str, summary: str, *refusals: int) -> Callable[[F], F]:
    """POST /v1/jobs/{job_id}/<action>: a change of one job's state, which needs the
    token and gets 409 when the job's state refuses it (and ``refusals``)."""
    return router.post(
        f"/{{job_id}}/{action}",
        response_model=JobStateChange,
        dependencies=[Depends(may_write)],
        responses=responses(401, 403, 404, 409, 503, *refusals),
        summary=summary,
    )


# GET /v1/jobs?meta.customer=42: a filter on the key customer of the jobs' meta.
META_PREFIX: Final = "meta."

# Retry-After on a job that is not done: about when to look again.
RUNNING_POLL: Final = 2
MAX_POLL: Final = 60
# The longest GET /v1/jobs/{id}?wait= holds a request: well under the timeouts of
# common proxies, and no transaction or pooled connection is held meanwhile.
MAX_WAIT: Final = 30

_HEADERS: Final[dict[str, Any]] = {
    "Location": {"description": "The job's URL.", "schema": {"type": "string"}},
    "Retry-After": {
        "description": "Seconds until the job is worth polling again.",
        "schema": {"type": "integer"},
    },
}


def retry_after(job: JobView) -> int | None:
    """Seconds until polling the job is worth it again; None once it is done."""
    if job.done:
        return None
    if job.state in LEASED:
        return RUNNING_POLL
    due = (job.run_after - job.checked_at).total_seconds()
    return max(1, min(MAX_POLL, math.ceil(due)))


def say_when_to_poll(response: Response, job: JobView) -> None:
    """Retry-After on a job not done yet: when asking after it again is worth it."""
    wait = retry_after(job)
    if wait is not None:
        response.headers["Retry-After"] = str(wait)


def location(request: Request, job: JobView) -> str:
    return url(request, f"/v1/jobs/{job.id}")


def _changed(result: JobStateChange, ident: uuid.UUID, refused: str) -> JobStateChange:
    """``result`` if the change was made; else 404 for a job that is not there, 409
    with ``refused`` (its ``{state}`` filled in) for one whose state forbids it."""
    if result.state is None:
        raise NotFound(f"no job {ident}")
    if not result.applied:
        raise WrongState(refused.format(state=result.state), result.state)
    return result


def _parse(job_id: str) -> uuid.UUID:
    ident = service.parse_job_id(job_id)
    if ident is None:
        raise NotFound(f"no job {job_id[:100]!r}: not a job id")
    return ident


def where_in_request(field: str | None) -> str:
    """Where in an enqueue request the service's refusal of ``field`` points: the
    Idempotency-Key header, a field of the body (``body.resource``), or the body as
    a whole when the refusal names none of its fields."""
    if field == "Idempotency-Key":
        return f"header.{field}"
    return f"body.{field}" if field in EnqueueBody.model_fields else "body"


@router.post(
    "",
    status_code=202,
    response_model=JobView,
    dependencies=[Depends(may_write)],
    responses=responses(
        *WITH_BODY,
        429,
        ok_202={"headers": _HEADERS, "description": "Enqueued."},
        ok_200={
            "model": JobView,
            "headers": _HEADERS,
            "description": "Nothing new enqueued: a job of this job_type with this dedup_key"
            " was there already, and here it is (debounced: the waiting job it replaced,"
            " with the new payload and start).",
        },
    ),
    summary="Enqueue a job",
)
async def enqueue(
    body: EnqueueBody,
    request: Request,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=service.MAX_IDEMPOTENCY_KEY_LENGTH,
            description="Makes the request safe to repeat (IETF "
            "draft-ietf-httpapi-idempotency-key-header): a repeat with the same key and "
            "body is answered as the first was (Idempotent-Replayed: true), a different "
            "body with it is refused (422). A key is this API's own, for any job_type, "
            "apart from dedup keys, and lasts as long as its job (retention deletes "
            "both: relay --keep-finished).",
        ),
    ] = None,
) -> JobView:
    """Enqueue one job; 202 with the job, and its URL in Location (200 when its
    dedup_key found a job enqueued before, or, debounced, replaced the waiting one)."""
    # A job on a stored input takes no payload: one left out is none, not {}.
    on_input = body.payload_ref is not None and "payload" not in body.model_fields_set
    wanted = service.NewJobRequest(
        body.job_type,
        None if on_input else body.payload,
        body.queue,
        body.tenant,
        body.priority,
        body.run_after,
        body.max_attempts,
        body.dedup_key,
        body.needs_approval,
        body.expires,
        body.rate_limit,
        body.key,
        body.key_limit,
        body.ordered,
        None if body.debounce is None else timedelta(seconds=body.debounce),
        None if body.debounce_max is None else timedelta(seconds=body.debounce_max),
        tuple(body.after),
        body.on_parent_failure,
        body.resource,
        tags=tuple(body.tags),
        meta=body.meta,
        weight=body.weight,
        payload_ref=body.payload_ref,
        on_complete_url=body.on_complete_url,
    )
    try:
        async with database(request).writing() as session:
            done = await service.enqueue_job(session, wanted, idempotency_key=idempotency_key)
    except Invalid as exc:
        exc.field = where_in_request(exc.field)
        raise
    response.headers["Location"] = location(request, done.job)
    say_when_to_poll(response, done.job)
    if done.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    if not done.created:
        response.status_code = 200
    return done.job


@router.get(
    "",
    response_model=JobPage,
    dependencies=[Depends(may_read)],
    responses=responses(401, 422, 503),
    summary="List jobs",
)
async def jobs(
    request: Request,
    state: JobState | None = None,
    queue: Annotated[QueueName | None, Query()] = None,
    job_type: Annotated[JobType | None, Query()] = None,
    tenant: Annotated[QueueName | None, Query()] = None,
    tag: Annotated[
        list[Tag] | None,
        Query(max_length=MAX_TAGS, description="Jobs with this tag; repeat for all of several."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=service.MAX_LIMIT)] = service.DEFAULT_LIMIT,
    after: Annotated[
        str | None,
        Query(max_length=300, description="The `next` of the previous page."),
        Field(),
    ] = None,
) -> JobPage:
    """Jobs, newest first: waiting and running ones by creation, finished ones by
    when they finished, and every list by tag by creation. Follow `next` for the
    next page; filters over finished jobs (and a tag's jobs) read a bounded stretch
    per page, so a page can be short and still have a next one (`scan_limited`).

    `meta.<key>=<value>` (one per key): jobs whose meta has the key with that
    value, compared as text (`meta.customer=42` finds 42 and "42")."""
    params = request.query_params
    meta = {k.removeprefix(META_PREFIX): v for k, v in params.items() if k.startswith(META_PREFIX)}
    where = service.JobFilter(state, queue, job_type, tenant, tuple(tag or ()), meta or None)
    async with database(request).reading() as session:
        return await service.list_jobs(session, where, limit=limit, after=after)


@router.post(
    "/retry",
    response_model=BulkRetry,
    dependencies=[Depends(may_write)],
    responses=responses(*WITH_BODY),
    summary="Retry failed jobs in bulk",
)
async def retry_many(body: RetryRequest, request: Request) -> BulkRetry:
    """Put failed jobs back in the queue: those named by `ids`; or the FAILED ones
    that match every filter given (and the CANCELLED ones with
    `include_cancelled`), oldest finished first, at most `limit`; or, with
    `all: true`, every failed one. An empty body is refused (422): a retry of
    everything is said on purpose. With `dry_run`, only count them."""
    async with database(request).writing() as session:
        if body.ids is not None:
            changes = await service.retry_jobs(
                session,
                body.ids,
                by=actor(request),
                dry_run=body.dry_run,
                override_policy=body.override_policy,
            )
            applied = sum(c.applied for c in changes)
            return BulkRetry(applied, body.dry_run, tuple(changes))
        return await service.retry_matching(
            session,
            queue=body.queue,
            job_type=body.job_type,
            error_code=body.error_code,
            finished_after=body.finished_after,
            every=body.all,
            states=service.RETRYABLE if body.include_cancelled else (JobState.FAILED,),
            limit=body.limit,
            by=actor(request),
            dry_run=body.dry_run,
            override_policy=body.override_policy,
        )


@router.get(
    "/{job_id}",
    response_model=JobView,
    dependencies=[Depends(may_read)],
    responses=responses(
        401, 404, 422, 429, 503, ok_200={"headers": {"Retry-After": _HEADERS["Retry-After"]}}
    ),
    summary="Look at a job",
)
async def job(
    job_id: str,
    request: Request,
    response: Response,
    wait: Annotated[
        float | None,
        Query(
            ge=0,
            le=MAX_WAIT,
            description=f"Seconds (at most {MAX_WAIT}) to hold the request while the job "
            "is not done: answered as soon as it ends (woken at the commit that ended "
            "it), else with its state at the end of the wait. A server holds a bounded "
            "number of such requests (jobctl serve's max_waiters, and "
            "max_waiters_per_client for one client): past either, a wait for a job not "
            "done is answered at once, 503 or 429, with Retry-After.",
        ),
    ] = None,
) -> JobView:
    """State, attempt and budget, last error, times, progress, result, every
    attempt, and why it waits. Retry-After while it is not done."""
    ident = _parse(job_id)
    db = database(request)
    async with db.reading() as session:
        found = await service.get_job(session, ident)
    if found is not None and not found.done and wait:
        waiters: Waiters = request.app.state.waiters
        with waiters.seat(client_of(request), wait):
            found = await waiters.wait(db, ident, wait)
    if found is None:
        raise NotFound(f"no job {ident}: it never existed, or it finished and was deleted")
    say_when_to_poll(response, found)
    return found


@router.patch(
    "/{job_id}",
    response_model=JobView,
    dependencies=[Depends(may_write)],
    responses=responses(*WITH_BODY, 404, 409),
    summary="Edit a waiting job",
)
async def edit(job_id: str, body: EditBody, request: Request) -> JobView:
    """Change a job that has not started yet (QUEUED, held for approval or parents
    too, or RETRY_WAIT): the fields present, its wake-up moved with a new run_after
    or priority. 409 once it has started or ended, with its `state`; nothing
    changes then."""
    ident = _parse(job_id)
    given = {name: getattr(body, name) for name in body.model_fields_set}
    try:
        async with database(request).writing() as session:
            return await service.edit_job(session, ident, **given)
    except Invalid as exc:
        exc.field = f"body.{exc.field}" if exc.field in EditBody.model_fields else "body"
        raise


@_job_change("cancel", "Cancel a job", *WITH_BODY)
async def cancel(job_id: str, request: Request, body: CancelBody | None = None) -> JobStateChange:
    """A waiting job is CANCELLED at once; a running one becomes CANCEL_REQUESTED
    (its handler sees it at its next heartbeat). With `{"force": true}` the running
    one is interrupted at its worker's next heartbeat and ends CANCELLED (a request
    made already is made forced). Repeating it is harmless; a job that finished
    otherwise gets 409. A running job whose type does not allow it
    (cancel_running=False) gets 409 with the type's `policy`, unless
    `{"override_policy": true}`, which is recorded."""
    ident = _parse(job_id)
    force = body is not None and body.force
    override = body is not None and body.override_policy
    async with database(request).writing() as session:
        (result,) = await service.cancel_jobs(
            session, [ident], force=force, override_policy=override, by=actor(request)
        )
    if result.not_allowed is not None:
        raise service.refusal(result, "cancelling it while it runs")
    return _changed(result, ident, f"job {ident} is {{state}} already; nothing to cancel")


@_job_change("retry", "Retry a job", *WITH_BODY)
async def retry(job_id: str, request: Request, body: RetryBody | None = None) -> JobStateChange:
    """A FAILED or CANCELLED job goes back to QUEUED, due now, its history kept and a
    fresh attempt budget given; a job in any other state gets 409. A job whose type
    does not allow replay (replay=False) gets 409 with the type's `policy`, unless
    `{"override_policy": true}`: then it is retried, recorded as forced."""
    ident = _parse(job_id)
    override = body is not None and body.override_policy
    async with database(request).writing() as session:
        (result,) = await service.retry_jobs(
            session, [ident], by=actor(request), override_policy=override
        )
    if result.not_allowed is not None:
        raise service.refusal(result, "replay")
    return _changed(
        result, ident, f"job {ident} is {{state}}: only FAILED or CANCELLED jobs are retried"
    )


@_job_change("approve", "Approve a job")
async def approve(job_id: str, request: Request) -> JobStateChange:
    """A job enqueued with needs_approval that waits for approval becomes due and
    is woken; who approved it and when are recorded. A job approved or rejected
    already, or that never needed approval, gets 409 and is left as it was."""
    ident = _parse(job_id)
    async with database(request).writing() as session:
        return await service.approve_job(session, ident, by=actor(request))


@_job_change("reject", "Reject a job", *WITH_BODY)
async def reject(job_id: str, request: Request, body: RejectBody | None = None) -> JobStateChange:
    """A job that waits for approval is CANCELLED, with last_error_code REJECTED and
    the reason given as its message; who and when are recorded. Refused like an
    approval (409)."""
    ident = _parse(job_id)
    reason = None if body is None else body.reason
    async with database(request).writing() as session:
        return await service.reject_job(session, ident, by=actor(request), reason=reason)
