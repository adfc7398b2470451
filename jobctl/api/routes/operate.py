"""/v1/queues, /v1/schedules, /v1/tenants, /v1/limits, /v1/workers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from hybrid_jobs.jobctl.api.guards import GuardedRoute, may_read, may_write
from hybrid_jobs.jobctl.api.models import (
    QueueLimitRequest,
    QueueName,
    ScheduleList,
    ScheduleName,
    TenantLimits,
    TenantList,
    WorkerList,
)
from hybrid_jobs.jobctl.api.problems import WITH_BODY, responses
from hybrid_jobs.jobctl.api.routes.common import F, actor, database
from hybrid_jobs.jobctl.api.routes.jobs import location, say_when_to_poll
from hybrid_jobs.jobctl.service import (
    has_limits,
    list_limits,
    list_schedules,
    list_tenants,
    list_workers,
    pause_queue,
    pause_schedule,
    remove_queue_limit,
    resume_queue,
    resume_schedule,
    set_queue_limit,
    set_tenant,
    stats,
    trigger_schedule,
)
from hybrid_jobs.jobctl.service.models import (
    JobView,
    Limits,
    QueueLimitView,
    QueueState,
    ScheduleView,
    Stats,
    TenantView,
)

router = APIRouter(prefix="/v1", route_class=GuardedRoute)

# A schedule's name may hold "/" ("reports/nightly"): the path converter takes it
# whole, encoded (%2F) or not, up to the action that ends the URL.
ScheduleInPath = Annotated[ScheduleName, Path()]
QueueInPath = Annotated[QueueName, Path()]


def _reads(path: str, model: Any, tag: str, summary: str) -> Callable[[F], F]:
    """A GET that reads: it needs the read token (when one is set)."""
    return router.get(
        path,
        response_model=model,
        dependencies=[Depends(may_read)],
        responses=responses(401, 503),
        tags=[tag],
        summary=summary,
    )


def _changes(
    path: str, model: Any, tag: str, summary: str, *refusals: int, **route: Any
) -> Callable[[F], F]:
    """A POST that changes something: it needs the token, and may be refused with
    ``refusals`` besides the statuses every change may get."""
    return router.post(
        path,
        response_model=model,
        dependencies=[Depends(may_write)],
        responses=responses(401, 403, 422, 503, *refusals),
        tags=[tag],
        summary=summary,
        **route,
    )


@_reads("/queues", Stats, "queues", "Per-queue figures")
async def queues(request: Request) -> Stats:
    """Per queue: jobs by state, the oldest runnable job's age, the relay's lag,
    wake-ups in flight, jobs finished in the last minute and per second, live
    consumers. Reads the backlog and a minute's history, never all of it."""
    async with database(request).reading() as session:
        return await stats(session)


@_changes("/queues/{queue}/pause", QueueState, "queues", "Pause a queue", 404)
async def pause(
    queue: QueueInPath,
    request: Request,
    create: Annotated[
        bool,
        Query(
            description="Pause a queue nothing uses yet (no job, consumer or schedule), "
            "ahead of its first job; without it such a name is refused (404), since it "
            "is most often a typo."
        ),
    ] = False,
) -> QueueState:
    """None of its jobs is woken or claimed until it is resumed; running ones
    finish, and enqueueing goes on. Pausing a paused queue keeps who paused it."""
    async with database(request).writing() as session:
        return await pause_queue(session, queue, by=actor(request), create=create)


@_changes("/queues/{queue}/resume", QueueState, "queues", "Resume a queue")
async def resume(queue: QueueInPath, request: Request) -> QueueState:
    """Its waiting jobs are woken at once; who resumed it is recorded."""
    async with database(request).writing() as session:
        return await resume_queue(session, queue, by=actor(request))


@_reads("/schedules", ScheduleList, "schedules", "Recurring schedules")
async def schedules(request: Request) -> ScheduleList:
    async with database(request).reading() as session:
        return ScheduleList(schedules=await list_schedules(session))


@_changes("/schedules/{name:path}/pause", ScheduleView, "schedules", "Pause a schedule", 404)
async def pause_a_schedule(name: ScheduleInPath, request: Request) -> ScheduleView:
    async with database(request).writing() as session:
        return await pause_schedule(session, name)


@_changes("/schedules/{name:path}/resume", ScheduleView, "schedules", "Resume a schedule", 404)
async def resume_a_schedule(name: ScheduleInPath, request: Request) -> ScheduleView:
    """It fires again from its next occurrence after now."""
    async with database(request).writing() as session:
        return await resume_schedule(session, name)


@_changes(
    "/schedules/{name:path}/trigger",
    JobView,
    "schedules",
    "Enqueue a schedule's job now",
    404,
    429,
    status_code=202,
)
async def trigger(name: ScheduleInPath, request: Request, response: Response) -> JobView:
    """One job from the schedule's template, now; its timetable stays as it is."""
    async with database(request).writing() as session:
        job = await trigger_schedule(session, name)
    response.headers["Location"] = location(request, job)
    say_when_to_poll(response, job)
    return job


@_reads("/tenants", TenantList, "tenants", "Tenants and their limits")
async def tenants(request: Request) -> TenantList:
    async with database(request).reading() as session:
        return TenantList(tenants=await list_tenants(session))


@router.put(
    "/tenants/{tenant}",
    response_model=TenantView,
    dependencies=[Depends(may_write)],
    responses=responses(
        *WITH_BODY,
        ok_201={"model": TenantView, "description": "The tenant had no limits: created."},
    ),
    tags=["tenants"],
    summary="Set a tenant's limits",
)
async def put_tenant(
    tenant: Annotated[QueueName, Path()],
    limits: TenantLimits,
    request: Request,
    response: Response,
) -> TenantView:
    """Replaces all of the tenant's limits: 200, or 201 when it had none."""
    async with database(request).writing() as session:
        existed = await has_limits(session, tenant)
        found = await set_tenant(
            session,
            tenant,
            max_running=limits.max_running,
            weight=limits.weight,
            max_queued=limits.max_queued,
            runners=limits.runners,
        )
    if not existed:
        response.status_code = 201
    return found


@_reads("/limits", Limits, "limits", "Rate and concurrency limits")
async def limits(request: Request) -> Limits:
    """Every rate limit with its bucket now, and every concurrency limit, of a job
    type (a handler's global_limit) and of a queue, with the slots its leases hold
    and the jobs waiting for one. Reads the limits' rows and the waiting jobs'
    partial indexes only."""
    async with database(request).reading() as session:
        return await list_limits(session)


@router.put(
    "/queues/{queue}/limit",
    response_model=QueueLimitView,
    dependencies=[Depends(may_write)],
    responses=responses(
        *WITH_BODY,
        ok_201={"model": QueueLimitView, "description": "The queue had no limit: set."},
    ),
    tags=["limits"],
    summary="Set a queue's concurrency limit",
)
async def put_queue_limit(
    queue: QueueInPath, body: QueueLimitRequest, request: Request, response: Response
) -> QueueLimitView:
    """At most `limit` of the queue's jobs hold a lease at once, across every
    consumer: 200, or 201 when it had none. A raised limit wakes as many waiting
    jobs as it has new slots; a lowered one stops nothing running. A consumer
    started later with its own `--queue-limit` for the queue writes over it."""
    async with database(request).writing() as session:
        found, created = await set_queue_limit(session, queue, body.limit, by=actor(request))
    if created:
        response.status_code = 201
    return found


@router.delete(
    "/queues/{queue}/limit",
    status_code=204,
    dependencies=[Depends(may_write)],
    responses=responses(401, 403, 404, 422, 503),
    tags=["limits"],
    summary="Remove a queue's concurrency limit",
)
async def delete_queue_limit(queue: QueueInPath, request: Request) -> Response:
    """Every job waiting for it is woken; 404 when the queue had none. A consumer
    started later with `--queue-limit` for the queue sets one again."""
    async with database(request).writing() as session:
        await remove_queue_limit(session, queue)
    return Response(status_code=204)


@_reads("/workers", WorkerList, "workers", "Consumers")
async def workers(request: Request) -> WorkerList:
    async with database(request).reading() as session:
        return WorkerList(workers=await list_workers(session))
