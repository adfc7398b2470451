"""An operator's steering: retry failed and cancelled jobs, pause and resume a
queue, and say why a job waits, each through the producer API's own function
(``outbox.retry_job_async``, ``retry_jobs_async``, ``pause_queue_async``,
``resume_queue_async``, ``explain_async``), so the rule lives there once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Final

from sqlalchemy.ext.asyncio import AsyncSession

import outbox
from jobctl.service.errors import invalid_argument
from jobctl.service.models import Blocker as BlockerView
from jobctl.service.models import BulkRetry, JobStateChange, Why
from schema.states import JobState

# The most jobs one "retry every match" moves (outbox allows 100000 per call; a page
# that waits on a bigger statement helps nobody, and pressing again does the rest).
BULK_RETRY_LIMIT: Final = 10_000


async def retry_jobs(
    session: AsyncSession, job_ids: Iterable[uuid.UUID], *, by: str | None = None
) -> list[JobStateChange]:
    """Replay each FAILED or CANCELLED job (outbox.retry_job_async). ``applied`` is
    True for a job that is QUEUED again; a job in another state is left as it was,
    and an unknown id has state None. Never commits."""
    done: list[JobStateChange] = []
    for job_id in job_ids:
        try:
            state = await outbox.retry_job_async(session, job_id, by=by)
        except (ValueError, TypeError) as exc:
            raise invalid_argument(exc, "by") from None
        done.append(JobStateChange(job_id, state, state is JobState.QUEUED))
    return done


async def retry_matching(
    session: AsyncSession,
    *,
    queue: str | None = None,
    job_type: str | None = None,
    error_code: str | None = None,
    limit: int = BULK_RETRY_LIMIT,
    dry_run: bool = False,
    by: str | None = None,
) -> BulkRetry:
    """Replay the FAILED and CANCELLED jobs that match every filter given, oldest
    finished first, at most ``limit`` (outbox.retry_jobs_async).

    ``dry_run`` runs the very same statement inside a savepoint and rolls it back,
    so the count it gives is what the real call would select, by the same rule;
    it costs what the real call costs (bounded by ``limit``), and writes nothing.
    Never commits.
    """
    try:
        async with session.begin_nested() as savepoint:
            matched = await outbox.retry_jobs_async(
                session,
                queue=queue,
                job_type=job_type,
                error_code=error_code,
                limit=limit,
                by=by,
            )
            if dry_run:
                await savepoint.rollback()
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc) from None
    return BulkRetry(matched, dry_run)


async def pause_queue(session: AsyncSession, queue: str, *, by: str | None = None) -> None:
    """Stop claiming and waking the queue's jobs (outbox.pause_queue_async);
    pausing a paused queue keeps the first pause. Never commits."""
    try:
        await outbox.pause_queue_async(session, queue, by=by)
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc, "queue") from None


async def resume_queue(session: AsyncSession, queue: str) -> bool:
    """Resume the queue (outbox.resume_queue_async); True if it was paused.
    Never commits."""
    try:
        return await outbox.resume_queue_async(session, queue)
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc, "queue") from None


async def why(session: AsyncSession, job_id: uuid.UUID) -> Why | None:
    """Every reason the job is where it is now (outbox.explain_async); None for an
    unknown id. Reads only: key lookups and short index ranges."""
    try:
        found = await outbox.explain_async(session, job_id)
    except LookupError:
        return None
    blockers = tuple(BlockerView(b.code, dict(b.facts)) for b in found.blockers)
    return Why(found.summary, blockers)
