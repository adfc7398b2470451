"""Recording outcomes: finished attempts in, fenced outcome statements out.

Outcomes wait in the ledger until the reporter takes a batch and records it in one
statement, each row through its own fence. What comes back per job: its new state
(recorded), LOCKED (another transaction holds its row: it waits a moment and goes
with a later batch, delaying nobody else), or nothing (the fence turned it away: the
job moved on without us, and we say so). Through an outage it keeps retrying; an
outcome the database refuses for good is isolated and dropped, its lease lapses and
the sweeper retries the job, while every other outcome is still recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

from consumers.ledger import Held, Ledger
from consumers.settings import ConsumerSettings
from consumers.store import JobStore
from plumbing.logfmt import describe_error
from plumbing.transient import retry_forever
from schema.states import JobState

log = logging.getLogger("consumer")

LOCKED_RETRY = 0.2


class Reporter:
    def __init__(self, settings: ConsumerSettings, store: JobStore, ledger: Ledger) -> None:
        self.settings = settings
        self.store = store
        self.ledger = ledger
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
        triples = [(h.job.id, h.job.generation, h.outcome) for h in batch if h.outcome]
        try:
            async for attempt in retry_forever(log, "consumer.report_failed", only_transient=True):
                with attempt:
                    finished = await self.store.finish(triples)
        except Exception as exc:
            if len(batch) > 1:
                for held in batch:
                    await self.record([held])
                return
            held = batch[0]
            self.ledger.forget(held.job)
            log.error(
                "consumer.outcome_unrecordable",
                extra={
                    "job_id": str(held.job.id),
                    "outcome": held.outcome.kind if held.outcome else None,
                    "error": describe_error(exc),
                    "action": "dropped; the lease lapses and the sweeper retries the job",
                },
            )
            return
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
        elif state == JobState.FAILED:
            log.warning("consumer.job_failed", extra=fields)
        else:
            log.info("consumer.job_ended", extra=fields)
