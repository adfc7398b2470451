"""Queues: per-queue figures (what waits, what runs, how far behind the relay is,
what finished lately, who serves it), the relays, and pausing and resuming one."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any, Final

from sqlalchemy.ext.asyncio import AsyncSession

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.metrics.queries import (
    METRICS_JOBS_LEASED,
    METRICS_JOBS_RATE_LIMITED,
    METRICS_JOBS_WAITING,
    METRICS_KEY_WAITS,
)
from hybrid_jobs.jobctl.service import queries
from hybrid_jobs.jobctl.service.errors import NotFound, invalid_argument
from hybrid_jobs.jobctl.service.models import PublishFailure, QueueState, QueueStats, Stats
from hybrid_jobs.jobctl.service.sql import fetch_all, fetch_one
from hybrid_jobs.schema.queries import WORKER_TTL_SECONDS
from hybrid_jobs.schema.states import JobState

# Finished counts and throughput cover this window, from at most SAMPLE jobs.
WINDOW: Final = 60.0
SAMPLE: Final = 20_000


async def stats(session: AsyncSession) -> Stats:
    """Every queue that has jobs waiting or running, wake-ups, jobs finished in the
    last minute, live consumers, or a row in ``queues`` (an operator paused it).
    Costs what the backlog and a minute's traffic cost. Reads only."""
    found: dict[str, dict[str, Any]] = defaultdict(dict)
    for queue, state, count, oldest_due in await fetch_all(session, METRICS_JOBS_WAITING):
        found[queue][state] = count
        found[queue]["oldest"] = max(found[queue].get("oldest", 0.0), oldest_due or 0.0)
    for queue, state, count, expired in await fetch_all(session, METRICS_JOBS_LEASED):
        found[queue][state] = count
        found[queue]["expired"] = found[queue].get("expired", 0) + expired
    # The waits of the backlog alone (jobs_rate_limited_idx, jobs_claimable_idx), as
    # the metrics' gauges read them.
    for queue, count in await fetch_all(session, METRICS_JOBS_RATE_LIMITED):
        found[queue]["rate_limited"] = count
    for queue, _why, count in await fetch_all(session, METRICS_KEY_WAITS):
        found[queue]["key"] = found[queue].get("key", 0) + count
    for queue, count, lag in await fetch_all(session, queries.STATS_OUTBOX_PENDING):
        found[queue]["pending"], found[queue]["lag"] = count, lag or 0.0
    for queue, count in await fetch_all(session, queries.STATS_OUTBOX_IN_FLIGHT):
        found[queue]["in_flight"] = count
    for queue, paused, paused_at, paused_by in await fetch_all(session, queries.STATS_QUEUES):
        found[queue].update(paused=paused, paused_at=paused_at, paused_by=paused_by)
    workers = await fetch_all(session, queries.STATS_WORKERS, {"worker_ttl": WORKER_TTL_SECONDS})
    for queue, count, concurrency in workers:
        found[queue].update(workers=count, concurrency=concurrency)
    finished = await fetch_all(
        session, queries.STATS_FINISHED, {"window": WINDOW, "sample": SAMPLE}
    )
    (clock,) = (await fetch_all(session, queries.STATS_CLOCK))[0]
    ((relays_live, relays_publishing),) = await fetch_all(session, queries.STATS_RELAYS)
    failing = await fetch_all(session, queries.STATS_PUBLISH_FAILING)
    window = _span(finished, clock)
    for queue, state, count, _oldest, _now, expired in finished:
        found[queue][state] = count
        if state == JobState.CANCELLED:
            found[queue]["expired_jobs"] = expired
    return Stats(
        checked_at=clock,
        window_seconds=window,
        queues=tuple(_queue(name, found[name], window) for name in sorted(found)),
        relays_live=relays_live,
        relays_publishing=relays_publishing,
        publish_failing=tuple(PublishFailure(*row) for row in failing),
    )


def _span(finished: list[tuple[Any, ...]], clock: datetime) -> float:
    """The window, or the span the sample covers when it was cut at SAMPLE jobs."""
    if sum(row[2] for row in finished) < SAMPLE:
        return WINDOW
    oldest: datetime = min(row[3] for row in finished)
    return max((clock - oldest).total_seconds(), 1.0)


def _queue(name: str, f: dict[str, Any], window: float) -> QueueStats:
    done = sum(f.get(s, 0) for s in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED))
    return QueueStats(
        queue=name,
        paused=f.get("paused", False),
        paused_at=f.get("paused_at"),
        paused_by=f.get("paused_by"),
        queued=f.get(JobState.QUEUED, 0),
        retry_wait=f.get(JobState.RETRY_WAIT, 0),
        running=f.get(JobState.RUNNING, 0),
        cancel_requested=f.get(JobState.CANCEL_REQUESTED, 0),
        oldest_runnable_age_seconds=round(f.get("oldest", 0.0), 3),
        expired_leases=f.get("expired", 0),
        outbox_pending=f.get("pending", 0),
        outbox_lag_seconds=round(f.get("lag", 0.0), 3),
        outbox_in_flight=f.get("in_flight", 0),
        succeeded=f.get(JobState.SUCCEEDED, 0),
        failed=f.get(JobState.FAILED, 0),
        cancelled=f.get(JobState.CANCELLED, 0),
        expired=f.get("expired_jobs", 0),
        rate_limited=f.get("rate_limited", 0),
        waiting_for_key=f.get("key", 0),
        finished_per_second=round(done / window, 3),
        workers=f.get("workers", 0),
        concurrency=f.get("concurrency", 0),
    )


async def pause_queue(
    session: AsyncSession, queue: str, *, by: str | None = None, create: bool = False
) -> QueueState:
    """Stop starting the queue's jobs (outbox.pause_queue_async): none is woken or
    claimed until it is resumed; running ones finish. A queue nothing uses (no job
    waiting, running, failed or cancelled in it, no wake-up, consumer, schedule or
    pause: most often a typo) is refused with :class:`NotFound`, unless ``create``
    says to pause it before its first job. Never commits."""
    try:
        in_use = await outbox.queue_in_use_async(session, queue)
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc, "queue") from None
    if not in_use and not create:
        raise NotFound(
            f"no queue {queue!r}: no job waits, runs or failed in it, and no consumer or"
            " schedule uses it; check the name, or pause it ahead of its first job"
            " with create (jobctl queues pause --create)"
        )
    before = await _paused(session, queue)
    try:
        paused = await outbox.pause_queue_async(session, queue, by=by)
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc, "queue") from None
    return await _state(session, paused.queue, changed=before is None)


async def resume_queue(session: AsyncSession, queue: str, *, by: str | None = None) -> QueueState:
    """Start the queue's jobs again (outbox.resume_queue_async), recording ``by`` as
    who resumed it; its waiting wake-ups go out when the caller commits. Never
    commits."""
    try:
        was_paused = await outbox.resume_queue_async(session, queue, by=by)
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc, "queue") from None
    return await _state(session, queue, changed=was_paused)


async def _state(session: AsyncSession, queue: str, *, changed: bool) -> QueueState:
    row = await fetch_one(session, queries.QUEUE_GET, {"queue": queue})
    if row is None:
        return QueueState(queue, False, None, None, changed)
    name, paused, paused_at, paused_by, resumed_at, resumed_by = row
    return QueueState(name, paused, paused_at, paused_by, changed, resumed_at, resumed_by)


async def _paused(session: AsyncSession, queue: str) -> outbox.PausedQueue | None:
    return next((p for p in await outbox.paused_queues_async(session) if p.queue == queue), None)
