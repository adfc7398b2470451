"""Test helpers for handlers: run enqueued jobs in this process, through the real
claim and outcome statements, with no relay, consumer or RabbitMQ.

In your own test suite, against your real (test) database::

    from hybrid_jobs.consumers.testing import JobRunner, run_jobs
    import myapp.handlers  # registers them with @consumers.handler

    def test_receipt_is_sent(engine):
        with Session(engine) as session, session.begin():
            place_order(session, ...)            # enqueues send_receipt
        ran = run_jobs(DATABASE_URL)             # plain tests
        assert [r.state for r in ran] == ["SUCCEEDED"]

    async def test_receipt_async():              # async tests
        async with JobRunner(DATABASE_URL) as runner:
            ran = await runner.run_until_idle()

A job runs exactly as a consumer would run it: claimed (attempt counted, lease and
fencing token taken), its handler called with a real ``Job`` (``job.transaction()``
commits with its completion), its outcome recorded with its attempt row. What the
runner does not do: wait out a retry's backoff (``run_until_idle(retries=True)``
makes waiting retries due at once), or heartbeat (a test job is shorter than its
lease).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from hybrid_jobs.consumers.executor import Reservation, Threads, execute
from hybrid_jobs.consumers.job import HandlerPools, Job, Resources
from hybrid_jobs.consumers.outcome import Outcome
from hybrid_jobs.consumers.registry import Registry, default_registry
from hybrid_jobs.consumers.store import JobStore
from hybrid_jobs.plumbing.config import DatabaseUrl, database_url
from hybrid_jobs.plumbing.db import make_pool
from hybrid_jobs.schema.queries import JOB_RETRIES_DUE_NOW, WORKER_TTL_SECONDS
from hybrid_jobs.schema.tables import MAX_WEIGHT

_DUE = """
SELECT job_id, queue FROM jobs
WHERE state IN ('QUEUED', 'RETRY_WAIT') AND run_after <= now()
  AND (%(job_type)s::text IS NULL OR job_type = %(job_type)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY job_id
LIMIT %(limit)s
"""
_STATE = "SELECT state, last_error_code, last_error_message FROM jobs WHERE job_id = %s"


@dataclass(frozen=True)
class Ran:
    """One attempt the runner made, and what it left the job in."""

    job_id: uuid.UUID
    job_type: str
    attempt: int
    state: str
    error_code: str | None
    error_message: str | None


class JobRunner:
    def __init__(
        self,
        url: str | DatabaseUrl | None = None,
        registry: Registry | None = None,
        *,
        lease_seconds: float = 300.0,
        default_timeout: float | None = 60.0,
    ) -> None:
        self.database = url if isinstance(url, DatabaseUrl) else database_url(url)
        self.registry = registry or default_registry
        self.worker = f"test-runner:{uuid.uuid4().hex[:8]}"
        self.default_timeout = default_timeout
        self.pool = make_pool(self.database, "test-runner", max_size=4)
        self.store = JobStore(self.pool, self.worker, lease_seconds)
        self.threads = Threads(8)
        # As a consumer's: what a handler's transaction does here, it does there.
        self.handlers = HandlerPools(self.database, ("test-runner-handlers", "test-runner-sync"), 4)

    async def __aenter__(self) -> JobRunner:
        await self.pool.open()
        await self.handlers.pool.open()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.pool.close()
        await self.handlers.pool.close()
        self.handlers.close_sync()
        self.threads.shutdown()

    async def run_due(
        self, *, job_type: str | None = None, queue: str | None = None, limit: int = 1000
    ) -> list[Ran]:
        """Claim and run every job that is due now (of this type or queue)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_DUE, {"job_type": job_type, "queue": queue, "limit": limit})
            due = await cur.fetchall()
        if not due:
            return []
        claimed = await self.store.claim(
            [row[0] for row in due],
            self.registry.claim_terms(),
            # the runner serves the queue asked for, else every queue with a job due
            queues=sorted({row[1] for row in due}),
            free_threads=self.threads.size,
            worker_ttl=WORKER_TTL_SECONDS,
            # it runs them one after the other: room for every weight
            free_slots=MAX_WEIGHT * len(due),
            concurrency=MAX_WEIGHT,
        )
        resources = Resources(
            self.worker, self.handlers.pool, self.handlers.sync, asyncio.get_running_loop()
        )
        ran = []
        for row in claimed.claimed:
            job = Job.from_claim(row, resources, 0.0, self.store.lease_seconds)
            handler = self.registry.get(row.job_type)
            assert handler is not None, "the claim takes only known job types"
            reservation: Reservation | None = None if handler.is_async else self.threads.reserve()
            try:
                outcome = await execute(
                    job, handler, self.threads, reservation, self.default_timeout
                )
            finally:
                if reservation is not None:
                    reservation.release_if_unused()
            ran.append(await self._record(job, outcome))
        return ran

    async def run_until_idle(
        self, *, retries: bool = False, max_rounds: int = 20, **which: Any
    ) -> list[Ran]:
        """Run due jobs until none is left (including jobs they enqueue); with
        ``retries``, a retry waiting out its backoff is made due at once."""
        ran: list[Ran] = []
        for _ in range(max_rounds):
            if retries:
                async with self.pool.connection() as conn:
                    await conn.execute(JOB_RETRIES_DUE_NOW)
            batch = await self.run_due(**which)
            if not batch:
                break
            ran += batch
        return ran

    async def _record(self, job: Job, outcome: Outcome | None) -> Ran:
        if outcome is not None:
            await self.store.finish([(job.id, job.generation, outcome)])
        async with self.pool.connection() as conn:
            row = await (await conn.execute(_STATE, [job.id])).fetchone()
        assert row is not None
        return Ran(job.id, job.job_type, job.attempt, row[0], row[1], row[2])


def run_jobs(
    url: str | DatabaseUrl | None = None,
    registry: Registry | None = None,
    *,
    retries: bool = False,
    **which: Any,
) -> list[Ran]:
    """:meth:`JobRunner.run_until_idle` for a test that is not async."""

    async def run() -> list[Ran]:
        async with JobRunner(url, registry) as runner:
            return await runner.run_until_idle(retries=retries, **which)

    return asyncio.run(run())
