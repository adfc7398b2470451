"""/v1/queues, /v1/schedules, /v1/tenants, /v1/workers."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from jobctl.api.guards import GuardedRoute, may_read, may_write
from jobctl.api.models import (
    QueueName,
    ScheduleList,
    ScheduleName,
    TenantLimits,
    TenantList,
    WorkerList,
)
from jobctl.api.problems import responses
from jobctl.api.routes.common import actor, database
from jobctl.api.routes.jobs import location, say_when_to_poll
from jobctl.service import (
    has_limits,
    list_schedules,
    list_tenants,
    list_workers,
    pause_queue,
    pause_schedule,
    resume_queue,
    resume_schedule,
    set_tenant,
    stats,
    trigger_schedule,
)
from jobctl.service.models import JobView, QueueState, ScheduleView, Stats, TenantView

router = APIRouter(prefix="/v1", route_class=GuardedRoute)

# A schedule's name may hold "/" ("reports/nightly"): the path converter takes it
# whole, encoded (%2F) or not, up to the action that ends the URL.
ScheduleInPath = Annotated[ScheduleName, Path()]
QueueInPath = Annotated[QueueName, Path()]


@router.get(
    "/queues",
    response_model=Stats,
    dependencies=[Depends(may_read)],
    responses=responses(401, 503),
    tags=["queues"],
    summary="Per-queue figures",
)
async def queues(request: Request) -> Stats:
    """Per queue: jobs by state, the oldest runnable job's age, the relay's lag,
    wake-ups in flight, jobs finished in the last minute and per second, live
    consumers. Reads the backlog and a minute's history, never all of it."""
    async with database(request).reading() as session:
        return await stats(session)


@router.post(
    "/queues/{queue}/pause",
    response_model=QueueState,
    dependencies=[Depends(may_write)],
    responses=responses(401, 403, 404, 422, 503),
    tags=["queues"],
    summary="Pause a queue",
)
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


@router.post(
    "/queues/{queue}/resume",
    response_model=QueueState,
    dependencies=[Depends(may_write)],
    responses=responses(401, 403, 422, 503),
    tags=["queues"],
    summary="Resume a queue",
)
async def resume(queue: QueueInPath, request: Request) -> QueueState:
    """Its waiting jobs are woken at once; who resumed it is recorded."""
    async with database(request).writing() as session:
        return await resume_queue(session, queue, by=actor(request))


@router.get(
    "/schedules",
    response_model=ScheduleList,
    dependencies=[Depends(may_read)],
    responses=responses(401, 503),
    tags=["schedules"],
    summary="Recurring schedules",
)
async def schedules(request: Request) -> ScheduleList:
    async with database(request).reading() as session:
        return ScheduleList(schedules=await list_schedules(session))


@router.post(
    "/schedules/{name:path}/pause",
    response_model=ScheduleView,
    dependencies=[Depends(may_write)],
    responses=responses(401, 403, 404, 422, 503),
    tags=["schedules"],
    summary="Pause a schedule",
)
async def pause_a_schedule(name: ScheduleInPath, request: Request) -> ScheduleView:
    async with database(request).writing() as session:
        return await pause_schedule(session, name)


@router.post(
    "/schedules/{name:path}/resume",
    response_model=ScheduleView,
    dependencies=[Depends(may_write)],
    responses=responses(401, 403, 404, 422, 503),
    tags=["schedules"],
    summary="Resume a schedule",
)
async def resume_a_schedule(name: ScheduleInPath, request: Request) -> ScheduleView:
    """It fires again from its next occurrence after now."""
    async with database(request).writing() as session:
        return await resume_schedule(session, name)


@router.post(
    "/schedules/{name:path}/trigger",
    status_code=202,
    response_model=JobView,
    dependencies=[Depends(may_write)],
    responses=responses(401, 403, 404, 422, 429, 503),
    tags=["schedules"],
    summary="Enqueue a schedule's job now",
)
async def trigger(name: ScheduleInPath, request: Request, response: Response) -> JobView:
    """One job from the schedule's template, now; its timetable stays as it is."""
    async with database(request).writing() as session:
        job = await trigger_schedule(session, name)
    response.headers["Location"] = location(request, job)
    say_when_to_poll(response, job)
    return job


@router.get(
    "/tenants",
    response_model=TenantList,
    dependencies=[Depends(may_read)],
    responses=responses(401, 503),
    tags=["tenants"],
    summary="Tenants and their limits",
)
async def tenants(request: Request) -> TenantList:
    async with database(request).reading() as session:
        return TenantList(tenants=await list_tenants(session))


@router.put(
    "/tenants/{tenant}",
    response_model=TenantView,
    dependencies=[Depends(may_write)],
    responses=responses(
        400,
        401,
        403,
        413,
        415,
        422,
        503,
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


@router.get(
    "/workers",
    response_model=WorkerList,
    dependencies=[Depends(may_read)],
    responses=responses(401, 503),
    tags=["workers"],
    summary="Consumers",
)
async def workers(request: Request) -> WorkerList:
    async with database(request).reading() as session:
        return WorkerList(workers=await list_workers(session))
