"""The job a handler receives, and the transaction it can complete the job in."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Mapping
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Generic, LiteralString, ParamSpec, TypeVar, cast, overload

from psycopg import AsyncConnection, Connection
from psycopg.abc import Params
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from hybrid_jobs.consumers.errors import LeaseLost
from hybrid_jobs.consumers.outcome import Outcome, encode_result, json_problem
from hybrid_jobs.consumers.steps import StepLog, step_name, step_result
from hybrid_jobs.consumers.store import Claimed, finish_params
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.plumbing.db import make_pool, make_sync_pool
from hybrid_jobs.plumbing.logfmt import describe_error
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.states import JobState

log = logging.getLogger("consumer")

# Progress is written at most this often per job; reports in between are folded into
# the next write (the latest wins).
PROGRESS_INTERVAL = 1.0
MAX_STAGE_LENGTH = 200
# Larger counts are a mistake, and lose precision as JSON numbers anyway.
MAX_PROGRESS_NUMBER = 1e15

A = TypeVar("A")
S = TypeVar("S")
P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class Resources:
    """What a job's transaction needs from its consumer."""

    worker: str
    pool: AsyncConnectionPool[AsyncConnection]
    sync_pool: Callable[[], ConnectionPool[Connection]]
    loop: asyncio.AbstractEventLoop


class HandlerPools:
    """The connections ``job.connection()`` and ``job.transaction()`` hand out: a pool
    for async handlers and, opened when a plain handler first asks, one for plain
    handlers' threads. Both are made here by the same rules (no daemon timeouts: a
    handler's statements are its own; the same wait for a free connection), so a
    plain handler's transaction behaves as an async one's."""

    def __init__(self, database: DatabaseUrl, names: tuple[str, str], max_size: int) -> None:
        self._database, self._sync_name, self._max_size = database, names[1], max_size
        self.pool = make_pool(database, names[0], max_size, options=None)
        self._sync: ConnectionPool[Connection] | None = None
        self._lock = threading.Lock()

    def sync(self) -> ConnectionPool[Connection]:
        with self._lock:
            if self._sync is None:
                self._sync = make_sync_pool(
                    self._database, self._sync_name, self._max_size, options=None
                )
            return self._sync

    def close_sync(self) -> None:
        with self._lock:
            if self._sync is not None:
                self._sync.close()


@dataclass(eq=False)
class Job:
    """One claimed attempt of a job.

    ``id``, ``job_type``, ``queue``, ``tenant``, ``payload`` describe the job;
    ``attempt`` counts from 1 and ``max_attempts`` is its budget; ``generation`` is
    the fencing token this attempt holds. ``scheduled_for`` is the nominal instant
    of the schedule occurrence that fired the job (an aware datetime; None for a
    job no schedule fired). ``payload_ref`` is the id of the stored input
    (``outbox.store_input``) whose content ``payload`` holds, None for a job that
    carried its payload. ``weight`` is how many of the consumer's slots (and of
    its tenant's cap, and of its type's concurrency limit) the job takes. ``meta``
    is the metadata it was enqueued with (a read-only mapping, empty for none).
    ``cancel_requested`` turns true (at a heartbeat) when someone asked to cancel
    the job: stop at a safe point and ``raise consumers.Cancel()``.
    ``cancel_forced`` turns true with it when the cancel was forced: an async
    handler is then interrupted (``CancelledError`` at its current ``await``), and
    whatever a handler does next, its lease ends CANCELLED.
    """

    id: uuid.UUID
    job_type: str
    queue: str
    tenant: str | None
    payload: Any
    attempt: int
    max_attempts: int | None
    generation: int
    created_at: datetime
    worker: str
    scheduled_for: datetime | None = None
    meta: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    cancel_requested: bool = False
    cancel_forced: bool = False
    # The stored trace context of the enqueuing code (plumbing.tracing), if any.
    trace_context: Any = field(default=None, repr=False)
    payload_ref: uuid.UUID | None = None
    # The slots of the worker's concurrency (and of its tenant's cap and its type's
    # concurrency limit) this lease takes: enqueue's weight=.
    weight: int = 1
    # Why its stored input could not be read (redacted): it fails INPUT_REDACTED.
    input_redacted: str | None = field(default=None, repr=False)
    # The gates it was claimed through (None: not known), which its end of a lease
    # is composed of.
    gates: frozenset[str] | None = field(default=None, repr=False)
    # Monotonic time by which the lease surely ends unless a heartbeat extends it.
    lease_deadline: float = 0.0
    # Set when the worker cancelled the handler's task for a forced cancel: that
    # CancelledError ends the attempt CANCELLED, and is not the consumer stopping.
    interrupted: bool = field(default=False, repr=False)
    # Set while the job's own transaction commits its completion, and once it has.
    committing: bool = field(default=False, repr=False)
    recorded: bool = field(default=False, repr=False)
    # How long the handler ran, once it has returned or raised.
    ran_seconds: float | None = field(default=None, repr=False)
    # When its handler began (time.monotonic), while it runs: the worker halves an
    # automatic prefetch for a run that reaches prefetch.SHORT_RUN.
    run_began: float | None = field(default=None, repr=False)
    _resources: Resources | None = field(default=None, repr=False)
    _progress: dict[str, Any] | None = field(default=None, repr=False)
    _progress_written: float = field(default=0.0, repr=False)
    _progress_flush: asyncio.Task[None] | None = field(default=None, repr=False)
    _parent_results: ParentResults | None = field(default=None, repr=False)
    _steps: StepLog | None = field(default=None, repr=False)

    @classmethod
    def from_claim(
        cls, c: Claimed, resources: Resources, claim_sent_at: float, lease: float
    ) -> Job:
        return cls(
            id=c.job_id,
            job_type=c.job_type,
            queue=c.queue,
            tenant=c.tenant,
            payload=c.payload,
            attempt=c.attempt,
            max_attempts=c.max_attempts,
            generation=c.generation,
            created_at=c.created_at,
            worker=resources.worker,
            scheduled_for=c.scheduled_for,
            meta=MappingProxyType(c.meta or {}),
            trace_context=c.trace_context,
            payload_ref=c.payload_ref,
            weight=c.weight,
            input_redacted=c.input_redacted,
            gates=c.gates,
            lease_deadline=claim_sent_at + lease,
            _resources=resources,
        )

    @property
    def fence(self) -> tuple[uuid.UUID, int]:
        return (self.id, self.generation)

    def lease_surely_expired(self) -> bool:
        return time.monotonic() >= self.lease_deadline

    def progress(
        self, done: float, total: float | None = None, stage: str | None = None
    ) -> asyncio.Future[None] | concurrent.futures.Future[None]:
        """Report how far the job got, for status pages: ``await job.progress(40,
        total=100, stage="importing")`` in an async handler, ``job.progress(...)``
        (no await) in a plain one. Written through the fence at most about once a
        second; a report in between replaces the one waiting to be written."""
        report = _progress_report(done, total, stage)
        assert self._resources is not None, "a job from a consumer has its resources"
        loop = self._resources.loop
        if _running_loop() is loop:
            return self._schedule_progress(report)
        return asyncio.run_coroutine_threadsafe(self._from_thread(report), loop)

    def unwritten_progress(self) -> str | None:
        """The last progress report, if it still waits for its write (as JSON)."""
        return None if self._progress is None else json.dumps(self._progress)

    async def _from_thread(self, report: dict[str, Any]) -> None:
        await self._schedule_progress(report)

    def _schedule_progress(self, report: dict[str, Any]) -> asyncio.Future[None]:
        """The write, if it can go now; a finished future if it waits out the
        interval in the background (the caller never waits for the throttle)."""
        self._progress = report
        if self._progress_flush is None or self._progress_flush.done():
            self._progress_flush = asyncio.ensure_future(self._write_progress())
            if time.monotonic() >= self._progress_written + PROGRESS_INTERVAL:
                return self._progress_flush
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def _write_progress(self) -> None:
        wait = self._progress_written + PROGRESS_INTERVAL - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        report, self._progress = self._progress, None
        if report is None or self.recorded:
            return
        assert self._resources is not None
        self._progress_written = time.monotonic()
        try:
            async with self._resources.pool.connection() as conn:
                await conn.execute(
                    q.JOB_PROGRESS,
                    {
                        "job_id": self.id,
                        "generation": self.generation,
                        "worker": self.worker,
                        "progress": json.dumps(report),
                    },
                )
        except Exception as exc:
            # Progress is for status pages: a write that fails (the database away)
            # must not fail the job. The report goes with the outcome instead,
            # unless a newer one replaced it meanwhile.
            if self._progress is None:
                self._progress = report
            log.warning(
                "consumer.progress_unwritten",
                extra={"job_id": str(self.id), "error": describe_error(exc)},
            )

    def connection(self) -> Dual[AsyncConnection, Connection]:
        """A database connection of the consumer's, for reads and for writes that
        should not wait for the outcome (progress a status page shows): ``async with
        job.connection() as conn`` (psycopg ``AsyncConnection``), or ``with`` in a
        plain handler (``Connection``). What it writes commits when the block ends,
        whatever becomes of the job."""
        assert self._resources is not None, "a job from a consumer has its resources"
        resources = self._resources
        return Dual(lambda: _connection_async(resources), lambda: _connection_sync(resources))

    def parent_results(self) -> ParentResults:
        """The results of the jobs this one was enqueued ``after``: job id → result
        (JSON, None for a parent that returned nothing), in the order of ``after``,
        read in one query the first time and kept. ``job.parent_results()`` in a
        plain handler, ``await job.parent_results()`` in an async one. Under
        ``on_parent_failure="run"`` a parent that did not succeed maps to None
        (``states`` tells); a parent deleted by retention is missing."""
        if self._parent_results is None:
            assert self._resources is not None, "a job from a consumer has its resources"
            self._parent_results = ParentResults(self.id, self._resources)
            if _running_loop() is None:
                self._parent_results.load_sync()
        return self._parent_results

    def step(self, name: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` as the step ``name`` of this job, once its
        result is recorded: a plain handler's resumable step.

        The first time, ``fn`` runs and its result (JSON, at most
        ``MAX_RESULT_BYTES``; anything else raises ``ValueError`` and records
        nothing) is recorded through the job's lease, then returned. Every later
        attempt of the job (a retry, a lease recovered after a crash, a replay)
        returns the recorded result without calling ``fn``. A result comes back as
        JSON gives it back (a tuple as a list), the first time too. If ``fn``
        raises, nothing is recorded and the exception propagates: the step runs
        again at the next attempt. A worker that lost the job's lease records
        nothing and gets :class:`~consumers.LeaseLost`.

        At least once per step: a crash after ``fn`` returns and before its record
        commits runs it again. In an async handler: :meth:`step_async`."""
        name = step_name(name)
        steps = self._step_log()
        loop = self._resources_or_fail().loop
        if _running_loop() is loop:
            raise RuntimeError("in an async handler, use await job.step_async(...)")
        finished = asyncio.run_coroutine_threadsafe(steps.finished(), loop).result()
        if name in finished:
            return cast(T, finished[name])
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            # Never awaited here: say so, rather than refuse a coroutine as "not JSON".
            if inspect.iscoroutine(value):
                value.close()
            raise TypeError(f"step {name!r}: fn is async; use await job.step_async(...)")
        encoded, _ = step_result(name, value)
        recorded = asyncio.run_coroutine_threadsafe(steps.record(name, encoded), loop).result()
        return cast(T, recorded)

    @overload
    async def step_async(
        self, name: str, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T: ...

    @overload
    async def step_async(
        self, name: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T: ...

    async def step_async(
        self, name: str, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs
    ) -> Any:
        """:meth:`step` in an async handler: ``await job.step_async("charge", charge,
        order_id)``, ``fn`` an async function (awaited) or a plain one (called on the
        event loop: keep it short)."""
        name = step_name(name)
        steps = self._step_log()
        finished = await steps.finished()
        if name in finished:
            return finished[name]
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        encoded, _ = step_result(name, value)
        return await steps.record(name, encoded)

    def _step_log(self) -> StepLog:
        if self._steps is None:
            pool = self._resources_or_fail().pool
            self._steps = StepLog(self.id, self.generation, self.worker, pool)
        return self._steps

    def _resources_or_fail(self) -> Resources:
        assert self._resources is not None, "a job from a consumer has its resources"
        return self._resources

    def transaction(self) -> Dual[AsyncTx, SyncTx]:
        """A database transaction that completes this job when it commits.

        ``async with job.transaction() as tx:`` in an async handler, ``with
        job.transaction() as tx:`` in a plain one. Writes made through ``tx`` commit
        together with the job's SUCCEEDED and its attempt row, or not at all: if the
        lease was lost meanwhile, the fenced completion matches nothing, everything
        rolls back and :class:`~consumers.LeaseLost` is raised.
        """
        assert self._resources is not None, "a job from a consumer has its resources"
        resources = self._resources
        return Dual(
            lambda: _transaction_async(self, resources), lambda: _transaction_sync(self, resources)
        )


class ParentResults(Mapping[uuid.UUID, Any]):
    """``job.parent_results()``: a mapping, read once, on the job's consumer's pool;
    awaitable in an async handler (which must await it before reading it)."""

    def __init__(self, job_id: uuid.UUID, resources: Resources) -> None:
        self._job_id = job_id
        self._resources = resources
        self._results: dict[uuid.UUID, Any] | None = None
        self.states: dict[uuid.UUID, JobState] = {}

    def _keep(self, rows: list[Any]) -> None:
        self._results = {}
        for parent_id, state, result in rows:
            self._results[parent_id] = None if result is None else json.loads(result)
            self.states[parent_id] = JobState(state)

    def load_sync(self) -> None:
        with self._resources.sync_pool().connection() as conn:
            rows = conn.execute(q.JOB_PARENT_RESULTS, {"job_id": self._job_id}).fetchall()
        self._keep(rows)

    async def _load(self) -> ParentResults:
        if self._results is None:
            async with self._resources.pool.connection() as conn:
                cur = await conn.execute(q.JOB_PARENT_RESULTS, {"job_id": self._job_id})
                self._keep(await cur.fetchall())
        return self

    def __await__(self) -> Generator[Any, None, ParentResults]:
        return self._load().__await__()

    def _loaded(self) -> dict[uuid.UUID, Any]:
        if self._results is None:
            raise RuntimeError("in an async handler, await job.parent_results() first")
        return self._results

    def __getitem__(self, key: uuid.UUID) -> Any:
        return self._loaded()[key]

    def __iter__(self) -> Iterator[uuid.UUID]:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())

    def __repr__(self) -> str:
        return f"ParentResults({self._results!r})"


def _progress_report(done: float, total: float | None, stage: str | None) -> dict[str, Any]:
    """The report as it will be stored, or a TypeError / ValueError saying what in
    it could not be (at the call, not later in a write the handler never sees)."""
    for name, value in (("done", done), ("total", total)):
        if value is None and name == "total":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"progress {name} must be a number, not {type(value).__name__}")
        if not math.isfinite(value) or abs(value) > MAX_PROGRESS_NUMBER:
            raise ValueError(f"progress {name} must be a finite number of at most 1e15")
    if stage is not None:
        if not isinstance(stage, str):
            raise TypeError(f"progress stage must be a str, not {type(stage).__name__}")
        if len(stage) > MAX_STAGE_LENGTH:
            raise ValueError(f"progress stage must be at most {MAX_STAGE_LENGTH} characters")
        problem = json_problem(json.dumps(stage, ensure_ascii=False))
        if problem is not None:
            raise ValueError(f"progress stage cannot be stored: {problem}")
    return {"done": done, "total": total, "stage": stage}


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any (a plain handler's thread has
    none: it reaches the consumer's loop from outside)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class Dual(Generic[A, S]):
    """One context manager for both kinds of handler: ``async with`` enters the
    async form, ``with`` the plain one."""

    def __init__(
        self,
        make_async: Callable[[], AbstractAsyncContextManager[A]],
        make_sync: Callable[[], AbstractContextManager[S]],
    ) -> None:
        self._make_async, self._make_sync = make_async, make_sync
        self._async: AbstractAsyncContextManager[A] | None = None
        self._sync: AbstractContextManager[S] | None = None

    async def __aenter__(self) -> A:
        self._async = self._make_async()
        return await self._async.__aenter__()

    async def __aexit__(self, *exc: Any) -> bool | None:
        assert self._async is not None
        return await self._async.__aexit__(*exc)

    def __enter__(self) -> S:
        self._sync = self._make_sync()
        return self._sync.__enter__()

    def __exit__(self, *exc: Any) -> bool | None:
        assert self._sync is not None
        return self._sync.__exit__(*exc)


def _lost(job: Job) -> LeaseLost:
    return LeaseLost(f"job {job.id} generation {job.generation} is no longer held by {job.worker}")


@asynccontextmanager
async def _connection_async(resources: Resources) -> AsyncIterator[AsyncConnection]:
    async with resources.pool.connection() as conn, conn.transaction():
        yield conn


@contextmanager
def _connection_sync(resources: Resources) -> Iterator[Connection]:
    with resources.sync_pool().connection() as conn, conn.transaction():
        yield conn


@asynccontextmanager
async def _transaction_async(job: Job, resources: Resources) -> AsyncIterator[AsyncTx]:
    async with resources.pool.connection() as conn:
        try:
            async with conn.transaction():
                tx = AsyncTx(conn, job)
                yield tx
                params = _completion(job, tx)
                cur = await conn.execute(_completing(job), params)
                rows = await cur.fetchall()
                if _held_more(rows):
                    cur = await conn.execute(q.JOB_FINISH_MANY_IN_TX, params)
                    rows = await cur.fetchall()
                _check_completed(job, rows)
            job.recorded = True
        finally:
            # However the completion or its commit failed, the job is not "writing"
            # any more: its lease is kept (or lost, or given back) like any other.
            job.committing = False


@contextmanager
def _transaction_sync(job: Job, resources: Resources) -> Iterator[SyncTx]:
    with resources.sync_pool().connection() as conn:
        try:
            with conn.transaction():
                tx = SyncTx(conn, job)
                yield tx
                params = _completion(job, tx)
                rows = conn.execute(_completing(job), params).fetchall()
                if _held_more(rows):
                    rows = conn.execute(q.JOB_FINISH_MANY_IN_TX, params).fetchall()
                _check_completed(job, rows)
            job.recorded = True
        finally:
            job.committing = False


# What both kinds of job transaction do, apart from awaiting: one body each.


def _completion(job: Job, tx: _Result) -> dict[str, str]:
    """JOB_FINISH_MANY_IN_TX's parameters for the job's success in ``tx`` (from now on
    the job is writing: a lost lease no longer stops its handler)."""
    job.committing = True
    done = Outcome("succeeded", result=tx.encoded_result, progress=job.unwritten_progress())
    return finish_params(job.worker, [(job.id, job.generation, done)])


def _completing(job: Job) -> str:
    """The job's completion, composed of the gates it was claimed through (all of
    them, if that is not known)."""
    if job.gates is None:
        return q.JOB_FINISH_MANY_IN_TX
    return q.job_finish_many(job.gates, in_tx=True)


def _held_more(rows: list[Any]) -> bool:
    """Whether the composed completion left the job for the whole one: its lease
    holds a gate it was not claimed through (nothing was written)."""
    return any(row[1] == "full" for row in rows)


def _check_completed(job: Job, rows: list[Any]) -> None:
    """``LeaseLost`` unless the fenced completion applied (the rows are
    JOB_FINISH_MANY_IN_TX's: job id and new state of each outcome applied)."""
    if {row[0]: row[1] for row in rows}.get(job.id) != JobState.SUCCEEDED:
        raise _lost(job)


def _effect(job: Job, effect_key: str) -> dict[str, Any]:
    return {"effect_key": effect_key, "job_id": job.id}


class _Result:
    job: Job
    encoded_result: str | None = None

    def set_result(self, value: Any) -> None:
        """Keep ``value`` (JSON) as the job's result, recorded with its completion
        (a value that cannot be stored is replaced by a note saying why)."""
        self.encoded_result, dropped = encode_result(value)
        if dropped is not None:
            log.warning(
                "consumer.result_dropped", extra={"job_id": str(self.job.id), "why": dropped}
            )


class AsyncTx(_Result):
    """The handler's side of ``async with job.transaction() as tx``."""

    def __init__(self, connection: AsyncConnection, job: Job) -> None:
        self.connection = connection
        self.job = job

    async def execute(self, query: LiteralString, params: Params | None = None) -> Any:
        """Run a statement in the job's transaction; returns the psycopg cursor."""
        return await self.connection.execute(query, params)

    async def once(self, effect_key: str) -> bool:
        """True the first time ``effect_key`` is seen: perform the effect then. False
        on any later attempt (or any other job) with the same key: skip it. The key is
        recorded in this transaction, so it commits with the effect, or not at all."""
        cur = await self.connection.execute(q.JOB_EFFECT_CLAIM, _effect(self.job, effect_key))
        return await cur.fetchone() is not None


class SyncTx(_Result):
    """The handler's side of ``with job.transaction() as tx`` (plain handlers)."""

    def __init__(self, connection: Connection, job: Job) -> None:
        self.connection = connection
        self.job = job

    def execute(self, query: LiteralString, params: Params | None = None) -> Any:
        """Run a statement in the job's transaction; returns the psycopg cursor."""
        return self.connection.execute(query, params)

    def once(self, effect_key: str) -> bool:
        """:meth:`AsyncTx.once`, in a plain handler."""
        cur = self.connection.execute(q.JOB_EFFECT_CLAIM, _effect(self.job, effect_key))
        return cur.fetchone() is not None
