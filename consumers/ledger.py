"""The life of a job inside one worker, owned in one place.

A job this worker claimed is, here, in exactly one phase until it leaves:

    RUNNING ──► OUTCOME_PENDING ──► REPORTING ──► recorded (gone)
       │              ▲                 │
       │              └── LOCKED ◄──────┘   (row held elsewhere: try again later)
       ├──► committing in its own transaction (job.transaction()) ──► recorded
       └──► lost: the fence turned a heartbeat away, or the lease ran out unheard

The claimer adds jobs, the executor's tasks end them, the reporter records their
outcomes, the lease keeper renews them and declares them lost. None of those keeps
its own list of jobs: they ask the ledger, which is the one answer to "what does
this worker hold, and what is each job waiting for".
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum

from hybrid_jobs.consumers.executor import Reservation
from hybrid_jobs.consumers.job import Job
from hybrid_jobs.consumers.outcome import Outcome

log = logging.getLogger("consumer")


class Phase(StrEnum):
    RUNNING = "running"
    OUTCOME_PENDING = "outcome_pending"
    REPORTING = "reporting"


@dataclass(eq=False)
class Held:
    job: Job
    phase: Phase
    task: asyncio.Task[None] | None = None
    # The thread a plain-function handler runs on (None for an async handler).
    thread: Reservation | None = None
    outcome: Outcome | None = None
    # An outcome whose row was locked elsewhere waits until then before it is retried.
    retry_at: float = 0.0

    @property
    def writing(self) -> bool:
        """A write that ends the lease is in flight (the reporter's, or the job's own
        transaction's): its result, not a heartbeat's, says what became of the job."""
        return self.phase is Phase.REPORTING or self.job.committing or self.job.recorded


class Ledger:
    def __init__(self) -> None:
        self.held: dict[uuid.UUID, Held] = {}
        self.counts: Counter[str] = Counter()
        # Set when an outcome is ready for the reporter.
        self.outcomes_ready = asyncio.Event()

    # ----------------------------------------------------------------- questions

    def __contains__(self, job_id: uuid.UUID) -> bool:
        return job_id in self.held

    def __len__(self) -> int:
        return len(self.held)

    @property
    def running(self) -> int:
        """The slots the running jobs take: one each, a weighed job its weight."""
        return sum(h.job.weight for h in self.held.values() if h.phase is Phase.RUNNING)

    def tasks(self) -> list[asyncio.Task[None]]:
        return [h.task for h in self.held.values() if h.phase is Phase.RUNNING and h.task]

    def leases(self) -> list[Held]:
        """Every lease this worker holds, for the lease keeper to renew."""
        return list(self.held.values())

    def pending_outcomes(self) -> int:
        """Outcomes not recorded yet: waiting for the reporter, or being written."""
        return sum(1 for h in self.held.values() if h.phase is not Phase.RUNNING)

    # ----------------------------------------------------------------- transitions

    def start(self, job: Job, task: asyncio.Task[None], thread: Reservation | None) -> None:
        self.held[job.id] = Held(job, Phase.RUNNING, task, thread)

    def handler_done(self, job: Job, outcome: Outcome | None) -> None:
        """The handler's task ended with this outcome to record, or None: its own
        transaction recorded it, or its lease was lost."""
        held = self.held.get(job.id)
        if held is None or held.job is not job:
            return  # lost meanwhile: nothing to report
        if outcome is None:
            if job.recorded:
                self.counts["SUCCEEDED"] += 1
            self._drop(job.id)
            return
        held.phase, held.task, held.outcome = Phase.OUTCOME_PENDING, None, outcome
        self.outcomes_ready.set()

    def take_outcomes(self, limit: int) -> list[Held]:
        """Outcomes ready to record (not waiting out a lock), now REPORTING."""
        now = time.monotonic()
        batch = [
            h for h in self.held.values() if h.phase is Phase.OUTCOME_PENDING and h.retry_at <= now
        ][:limit]
        for held in batch:
            held.phase = Phase.REPORTING
        return batch

    def next_outcome_retry(self) -> float | None:
        """Seconds until the earliest locked outcome may be retried, if any waits."""
        waits = [
            h.retry_at - time.monotonic()
            for h in self.held.values()
            if h.phase is Phase.OUTCOME_PENDING
        ]
        return max(0.0, min(waits)) if waits else None

    def recorded(self, held: Held) -> None:
        self._drop(held.job.id)

    def outcome_locked(self, held: Held, retry_in: float) -> None:
        held.phase = Phase.OUTCOME_PENDING
        held.retry_at = time.monotonic() + retry_in
        self.counts["outcome_locked"] += 1

    def lose(self, job: Job, why: str) -> None:
        """The lease is gone: stop the handler, report nothing. A job whose ending
        write is in flight is left to that write."""
        held = self.held.get(job.id)
        if held is None or held.job is not job or held.writing:
            return
        self._drop(job.id)
        if held.task is not None:
            held.task.cancel()
        self.counts["lease_lost"] += 1
        log.warning(
            "consumer.lease_lost",
            extra={
                "job_id": str(job.id),
                "generation": job.generation,
                "why": why,
                "action": "handler cancelled, nothing reported"
                if held.task
                else "outcome dropped, nothing reported",
            },
        )

    def forget(self, job: Job) -> None:
        """Given back, or dropped for good (the sweeper will retry it)."""
        self._drop(job.id)

    def _drop(self, job_id: uuid.UUID) -> None:
        self.held.pop(job_id, None)
