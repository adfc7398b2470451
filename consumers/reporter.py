"""Recording outcomes: finished attempts in, fenced outcome statements out.

Outcomes wait in the ledger until the reporter takes a batch and records it in one
statement, each row through its own fence. What comes back per job: its new state
(recorded), LOCKED (another transaction holds its row: it waits a moment and goes
with a later batch, delaying nobody else), or nothing (the fence turned it away: the
job moved on without us, and we say so). Through an outage it keeps retrying. An
outcome the database refuses for good is isolated from its batch (every other one is
still recorded) and recorded without the handler's data (result, progress), else
reduced to its kind: a job that succeeded is never run again for want of a storable
result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

from hybrid_jobs.consumers.journal import Journal
from hybrid_jobs.consumers.ledger import Held, Ledger
from hybrid_jobs.consumers.settings import ConsumerSettings
from hybrid_jobs.consumers.store import Finished, JobStore
from hybrid_jobs.plumbing.logfmt import describe_error
from hybrid_jobs.plumbing.transient import retried, retry_forever
from hybrid_jobs.schema.states import JobState

log = logging.getLogger("consumer")

LOCKED_RETRY = 0.2


class Reporter:
    def __init__(
        self, settings: ConsumerSettings, store: JobStore, ledger: Ledger, journal: Journal
    ) -> None:
        self.settings = settings
        self.store = store
        self.ledger = ledger
        self.journal = journal
        self.counts: Counter[str] = Counter()
        self.closing = False

    async def run(self) -> None:
        """Record outcomes as they come; once :meth:`close` was called, return when
        none is left to record (never in the middle of a write)."""
        ready = self.ledger.outcomes_ready
        while True:
            while batch := self.ledger.take_outcomes(self.settings.report_batch):
                await self.record(batch)
            if self.closing and not self.ledger.pending_outcomes():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ready.wait(), self.ledger.next_outcome_retry())
            ready.clear()

    def close(self) -> None:
        """Shutting down: record what is left, then stop."""
        self.closing = True
        self.ledger.outcomes_ready.set()

    async def record(self, batch: list[Held]) -> None:
        try:
            finished = await self._finish(batch)
        except Exception as exc:
            if len(batch) > 1:
                for held in batch:
                    await self.record([held])
                return
            await self._record_replaced(batch[0], exc)
            return
        self._settle(batch, finished)

    async def _finish(self, batch: list[Held]) -> Finished:
        """Record the batch, through any outage; what the database refuses raises."""
        triples = [(h.job.id, h.job.generation, h.outcome) for h in batch if h.outcome]
        held = [h.job.gates for h in batch if h.outcome]
        # what the batch's leases hold, all together (None: some lease's is not known)
        gates = None if None in held else frozenset().union(*(g for g in held if g is not None))
        return await retried(
            lambda: self.store.finish(triples, gates),
            lambda: retry_forever(log, "consumer.report_failed", only_transient=True),
        )

    async def _record_replaced(self, held: Held, exc: Exception) -> None:
        """The database refused this outcome: record it without the handler's data
        (result and progress), else reduced to its kind with plain texts, rather than
        drop it and let the job run again after its lease."""
        original = held.outcome
        refused = describe_error(exc)
        if original is not None:
            for replacement in (original.storable(refused), original.bare(refused)):
                if replacement == held.outcome:
                    continue
                held.outcome = replacement
                try:
                    finished = await self._finish([held])
                except Exception as again:
                    refused = describe_error(again)
                    continue
                log.warning(
                    "consumer.outcome_replaced",
                    extra={
                        "job_id": str(held.job.id),
                        "outcome": original.kind,
                        "error": describe_error(exc),
                        "action": "recorded without what the database refused",
                    },
                )
                self._settle([held], finished)
                return
        self.ledger.forget(held.job)
        log.error(
            "consumer.outcome_unrecordable",
            extra={
                "job_id": str(held.job.id),
                "outcome": original.kind if original else None,
                "error": refused,
                "action": "dropped; the lease lapses and the sweeper retries the job",
            },
        )

    def _settle(self, batch: list[Held], finished: Finished) -> None:
        for held in batch:
            job_id = held.job.id
            if job_id in finished.locked:
                self.ledger.outcome_locked(held, LOCKED_RETRY)
                continue
            self.ledger.recorded(held)
            if job_id in finished.stale:
                self.counts["stale_outcome"] += 1
                log.warning(
                    "consumer.stale_outcome",
                    extra={
                        "job_id": str(job_id),
                        "generation": held.job.generation,
                        "outcome": held.outcome.kind if held.outcome else None,
                        "action": "rejected by the fence; the job moved on without us",
                    },
                )
            elif job_id in finished.applied:
                self._tell(held, finished.applied[job_id])

    def _tell(self, held: Held, state: JobState) -> None:
        self.counts[state] += 1
        outcome = held.outcome
        if state == JobState.SUCCEEDED:
            self.journal.succeeded(held.job)
        if outcome is None or outcome.kind == "succeeded":
            return
        job = held.job
        fields = {
            "job_id": str(job.id),
            "job_type": job.job_type,
            "attempt": job.attempt,
            "state": state,
            "error_code": outcome.error_code,
            "error": outcome.error_message,
        }
        if outcome.traceback:
            fields["traceback"] = outcome.traceback
        if state == JobState.RETRY_WAIT:
            fields["retry_in_s"] = round(outcome.delay_seconds or 0, 1)
            log.info("consumer.attempt_failed", extra=fields)
        elif state == JobState.QUEUED:
            del fields["error_code"], fields["error"]
            fields["snoozed_for_s"] = round(outcome.delay_seconds or 0, 1)
            log.info("consumer.job_snoozed", extra=fields)
        elif state == JobState.FAILED:
            log.warning("consumer.job_failed", extra=fields)
        else:
            log.info("consumer.job_ended", extra=fields)
