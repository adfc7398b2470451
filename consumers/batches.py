"""Batch handlers: many claimed jobs of one type, one call.

A job of a batch handler (``@consumers.handler("t", batch=100, batch_wait=0.2)``) is
claimed, leased, heartbeated and ended like any other: it has its own task, its own
place in the ledger and its own fenced outcome. Only the middle differs. Instead of
calling the function, the job's task joins the gathering of its type here and waits
for what the call says of it:

- the first job to join opens a gathering; it runs once ``batch`` jobs have joined,
  or ``batch_wait`` seconds after it opened, whichever comes first;
- the call gets the jobs still waiting (one whose lease was lost or that was
  cancelled meanwhile has left), as a list; it returns None (every job succeeded)
  or a mapping from a job (or its id) to that job's outcome: an exception, raised for
  that job alone (``Retry``, ``Snooze``, ``Permanent``, ``Cancel``, any other), or
  any other value, the job's result. A job the mapping leaves out succeeded;
- an exception raised by the call is raised for every job of the batch;
- output that fits neither (not a mapping, a job not in the batch, a job named
  twice, an exception class) fails every job of the batch with
  :data:`BAD_BATCH_RESULT`, saying what was wrong, rather than guessing which job
  each outcome was meant for.

Each job's task then ends its attempt as for a single handler, so every outcome goes
through the fenced finish statement: a job whose lease another worker took cannot
record anything, and the rest of its batch are not affected.

The call runs as a task of its own, in a context of its own (no job's run hooks
are around it), under the handler's time limit: past it, every job of the batch
retries with TIMEOUT. An async call is cancelled once every job of its batch has
left (lost, cancelled, given back at a stop); a plain function's call runs on one
thread, which holds every job's thread reservation until it returns, so a stop waits
for it, as for a single plain handler, rather than give its jobs back.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hybrid_jobs.consumers.errors import Permanent
from hybrid_jobs.consumers.job import Job
from hybrid_jobs.consumers.time_limit import bounded

if TYPE_CHECKING:
    from hybrid_jobs.consumers.executor import Reservation, Threads
    from hybrid_jobs.consumers.registry import Handler

log = logging.getLogger("consumer")

# The error code of a batch whose handler's output fits no outcome.
BAD_BATCH_RESULT = "BAD_BATCH_RESULT"


class BadBatchResult(Permanent):
    """A batch handler returned something that names no outcome for its jobs. It
    fails the whole batch at once: the same code would answer the same way, and no
    job's outcome can be told from it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=BAD_BATCH_RESULT)


@dataclass(eq=False)
class _Member:
    job: Job
    reservation: Reservation | None
    answer: asyncio.Future[Any]


@dataclass(eq=False)
class _Gathering:
    handler: Handler
    limit: float | None
    members: list[_Member] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class Batches:
    """The batches of one worker: the gatherings of each type, and the calls under
    way."""

    def __init__(self, threads: Threads, *, gather: bool = True) -> None:
        self.threads = threads
        # False: each job is a batch of its own, at once (a test helper running
        # one job).
        self.gather = gather
        self.gathering: dict[str, _Gathering] = {}
        # Ids of the jobs whose batch call has started and not ended.
        self.started: set[uuid.UUID] = set()
        self.calls: set[asyncio.Task[None]] = set()
        # Set by a stop: no gathering starts any more (its jobs are given back).
        self.holding = False
        # How many calls ran, by batch size.
        self.sizes: Counter[int] = Counter()
        # Calls made and the jobs they took, for the worker's stats lines.
        self.counts: Counter[str] = Counter()

    async def join(
        self, job: Job, handler: Handler, reservation: Reservation | None, limit: float | None
    ) -> Any:
        """Wait for the call of the batch this job joins: its result for this job,
        or its exception for this job raised."""
        assert handler.batch is not None
        loop = asyncio.get_running_loop()
        gathering = self.gathering.get(job.job_type)
        if gathering is None or gathering.handler is not handler:
            if gathering is not None:  # the handler changed: the old one runs as it is
                self._start(job.job_type)
            gathering = self.gathering[job.job_type] = _Gathering(handler, limit)
            gathering.timer = loop.call_later(handler.batch_wait, self._start, job.job_type)
        answer: asyncio.Future[Any] = loop.create_future()
        gathering.members.append(_Member(job, reservation, answer))
        if len(gathering.members) >= handler.batch or not self.gather:
            self._start(job.job_type)
        # A cancel of this job's task (its lease lost, a forced cancel, a stop)
        # cancels ``answer`` alone: the call goes on for the rest of the batch.
        return await answer

    def hold(self) -> None:
        """A stop: start no more batches. The jobs gathered and waiting keep waiting
        until the stop gives them back."""
        self.holding = True
        for gathering in self.gathering.values():
            if gathering.timer is not None:
                gathering.timer.cancel()

    def has_started(self, job_id: uuid.UUID) -> bool:
        """Whether the job's batch call is under way (a stop waits for it, or cancels
        it, rather than give back a job that was never handed to its handler)."""
        return job_id in self.started

    def _start(self, job_type: str) -> None:
        if self.holding:
            return
        gathering = self.gathering.pop(job_type, None)
        if gathering is None:
            return
        if gathering.timer is not None:
            gathering.timer.cancel()
        members = [m for m in gathering.members if not m.answer.done()]
        if not members:
            return
        self.started.update(m.job.id for m in members)
        self.sizes[len(members)] += 1
        self.counts["batch_calls"] += 1
        self.counts["batched_jobs"] += len(members)
        call = asyncio.create_task(
            self._call(gathering.handler, members, gathering.limit),
            name=f"batch {job_type} of {len(members)}",
            # its own context: no one job's run hooks or span are around the call
            context=contextvars.Context(),
        )
        self.calls.add(call)
        call.add_done_callback(self.calls.discard)
        for member in members:
            member.answer.add_done_callback(lambda _: self._left(call, members))

    def _left(self, call: asyncio.Task[None], members: list[_Member]) -> None:
        """A job's answer is settled or cancelled: once every job of an async batch
        has left without its answer, no one waits for the call."""
        if all(m.answer.cancelled() for m in members) and not call.done():
            call.cancel()

    async def _call(self, handler: Handler, members: list[_Member], limit: float | None) -> None:
        jobs = [m.job for m in members]
        try:
            if handler.is_async:
                value = await bounded(handler.fn(jobs), limit)
            else:
                reservations = [m.reservation for m in members if m.reservation is not None]
                value = await self.threads.run_many(reservations, lambda: handler.fn(jobs), limit)
            answers = _answers(value, jobs)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # every job of the batch has left
            # a cancellation from inside the handler: a failure like any other
            _settle(members, {}, exc)
        except BaseException as exc:
            # Any exception (SystemExit and KeyboardInterrupt of handler code too):
            # each job's attempt failed with it, the worker goes on.
            _settle(members, {}, exc)
        else:
            _settle(members, answers, None)
        finally:
            self.started.difference_update(m.job.id for m in members)


def _settle(
    members: list[_Member], answers: dict[uuid.UUID, Any], error: BaseException | None
) -> None:
    for member in members:
        if member.answer.done():
            continue  # the job left: its lease was lost, or it was cancelled
        value = error if error is not None else answers.get(member.job.id)
        if isinstance(value, BaseException):
            member.answer.set_exception(value)
        else:
            member.answer.set_result(value)


def _answers(value: Any, jobs: list[Job]) -> dict[uuid.UUID, Any]:
    """What the call said of each job, by id; BadBatchResult if it said nothing a
    job's outcome can be told from."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadBatchResult(
            "a batch handler returns None (every job succeeded) or a mapping of job to"
            f" outcome, not {type(value).__name__}"
        )
    ids = {job.id for job in jobs}
    answers: dict[uuid.UUID, Any] = {}
    strays: list[str] = []
    for key, outcome in value.items():
        job_id = _job_id(key)
        if job_id is None or job_id not in ids:
            strays.append(repr(key) if job_id is None else str(job_id))
            continue
        if job_id in answers:
            raise BadBatchResult(f"the batch handler's output names job {job_id} twice")
        if isinstance(outcome, type) and issubclass(outcome, BaseException):
            raise BadBatchResult(
                f"the outcome of job {job_id} is the class {outcome.__name__}, not an"
                f" exception: write {outcome.__name__}(...)"
            )
        answers[job_id] = outcome
    if strays:
        shown = ", ".join(strays[:5]) + (f" and {len(strays) - 5} more" if len(strays) > 5 else "")
        raise BadBatchResult(
            f"the batch handler's output names {len(strays)} job(s) not in its batch of"
            f" {len(jobs)}: {shown}"
        )
    return answers


def _job_id(key: Any) -> uuid.UUID | None:
    """A job, its id, or its id's text: the id; None for anything else."""
    if isinstance(key, Job):
        return key.id
    if isinstance(key, uuid.UUID):
        return key
    if isinstance(key, str):
        try:
            return uuid.UUID(key)
        except ValueError:
            return None
    return None
