"""Acting on a cancel requested with force (``outbox.request_cancel(force=True)``).

The lease keeper learns of it at a heartbeat (JOB_HEARTBEAT_MANY says which cancel
requests are forced), so a forced cancel reaches a handler within one heartbeat
interval. Then, for the job's attempt still running here:

- an async handler's task is cancelled: ``CancelledError`` is raised at its current
  ``await``, its ``finally`` blocks run, and the attempt ends CANCELLED through the
  fence like any outcome (the executor tells this cancel from the consumer's own by
  ``job.interrupted``);
- a plain function cannot be interrupted in its thread. It runs on, and whatever it
  does next ends the lease CANCELLED (its result discarded). Under ``consumer
  --processes`` it gets ``force_cancel_grace`` seconds to return; past that, its
  process is replaced: the attempt is recorded CANCELLED, the process stops at once
  (as a second signal stops it) and exits without the thread, and the supervisor
  starts a fresh one.

An attempt whose outcome is already on its way (reported, or committing in its own
transaction) is left to it: that outcome, not the cancel, ends the lease.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from hybrid_jobs.consumers.job import Job
from hybrid_jobs.consumers.ledger import Held, Ledger, Phase

log = logging.getLogger("consumer")


class ForcedCancels:
    def __init__(self, ledger: Ledger, grace: float) -> None:
        self.ledger = ledger
        self.grace = grace
        # Set under a supervisor: stop this process at once so that a fresh one
        # replaces it (None: a single consumer, whose threads are left to run).
        self.replace_process: Callable[[], None] | None = None
        self.waiting: set[asyncio.Task[None]] = set()

    def force(self, job: Job) -> None:
        """The cancel of ``job``'s attempt, held here, was forced."""
        held = self.ledger.held.get(job.id)
        if held is None or held.job is not job or job.cancel_forced:
            return
        job.cancel_requested = job.cancel_forced = True
        if held.phase is not Phase.RUNNING or held.task is None or held.writing:
            log.info(
                "consumer.cancel_forced",
                extra={"job_id": str(job.id), "action": "none: its outcome is on its way"},
            )
            return
        if held.thread is None:
            log.info(
                "consumer.cancel_forced", extra={"job_id": str(job.id), "action": "interrupted"}
            )
            _interrupt(held)
            return
        if self.replace_process is None:
            log.warning(
                "consumer.cancel_forced",
                extra={
                    "job_id": str(job.id),
                    "why": "a plain function cannot be interrupted in its thread",
                    "action": "its lease ends CANCELLED when it returns",
                },
            )
            return
        log.warning(
            "consumer.cancel_forced",
            extra={
                "job_id": str(job.id),
                "why": "a plain function cannot be interrupted in its thread",
                "action": f"replacing this process unless it returns within {self.grace:g} s",
            },
        )
        task = asyncio.create_task(self._replace_unless_done(held), name=f"force {job.id}")
        self.waiting.add(task)
        task.add_done_callback(self.waiting.discard)

    async def _replace_unless_done(self, held: Held) -> None:
        assert held.task is not None
        await asyncio.wait([held.task], timeout=self.grace)
        if self.ledger.held.get(held.job.id) is not held or held.phase is not Phase.RUNNING:
            return  # it returned (its lease ends CANCELLED all the same), or was lost
        if held.writing or self.replace_process is None:
            return
        log.warning(
            "consumer.replacing_process",
            extra={
                "job_id": str(held.job.id),
                "why": f"its plain function ran on {self.grace:g} s past a forced cancel",
                "action": "its attempt is recorded CANCELLED; this process stops now and a "
                "fresh one replaces it",
            },
        )
        # The attempt's outcome first (its task ends at once: only the wait for the
        # thread is cancelled), then the stop, which records it on the way out.
        task = held.task
        _interrupt(held)
        await asyncio.wait([task])
        self.replace_process()


def _interrupt(held: Held) -> None:
    assert held.task is not None
    held.job.interrupted = True
    held.task.cancel()
