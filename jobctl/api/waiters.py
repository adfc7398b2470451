"""``GET /v1/jobs/{id}?wait=``: the requests one process holds while their jobs run.

A held request costs a socket (a file descriptor) for up to ``MAX_WAIT`` seconds,
and, when its job ends, a read through the API's small pool. Unbounded, 300 parked
requests took every descriptor of a process limited to 256, and, woken together,
queued 600 reads in front of every other request. So:

- a process holds at most ``max_waiters`` (``SERVE_MAX_WAITERS``) such requests, and
  one client at most ``max_waiters_per_client``; a request past either is answered at
  once, 503 or 429, with ``Retry-After`` (when the soonest held wait ends, so a seat
  is free by then) and ``Connection: close`` (its descriptor is given back now);
- the requests waiting for one job share one wait on the process's listener
  (:func:`outbox.wait_for_async`) and one read of the job when it ends; the reads of
  a job at the end of the waits that ran out are shared too, when they coincide.

The client is the request's peer (``request.client``): the socket's, unless a proxy
the server trusts named another (never a header from anyone else).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Final

from fastapi import Request

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.service import Database
from hybrid_jobs.jobctl.service import jobs as service
from hybrid_jobs.jobctl.service.models import JobView

# The shared wait's own bound: it ends when its last request leaves, so this only
# makes it wait again (and read the row again) now and then meanwhile.
_HOLD_SECONDS: Final = 3600.0
# A client whose address is unknown (not over TCP).
_NO_ADDRESS: Final = "unknown"


class TooManyWaiters(Exception):
    """A ``?wait=`` the process cannot hold now: ``status`` 503 (the process holds
    ``limit`` already) or 429 (this client does), ``retry_after`` seconds until a
    seat is free at the latest."""

    def __init__(self, status: int, detail: str, retry_after: int, limit: int) -> None:
        super().__init__(detail)
        self.status = status
        self.retry_after = retry_after
        self.limit = limit


def client_of(request: Request) -> str:
    """Whose seats a request counts against: its peer's address."""
    return request.client.host if request.client else _NO_ADDRESS


class _Shared:
    """One job's wait, shared by the requests waiting for it."""

    __slots__ = ("task", "waiters")

    def __init__(self, task: asyncio.Task[JobView | None]) -> None:
        self.task = task
        self.waiters = 0


class Waiters:
    """The ``?wait=`` requests of one process (one per app: ``app.state.waiters``).
    Used from the event loop's thread only, so it needs no lock."""

    def __init__(self, most: int, per_client: int) -> None:
        self.most = most
        self.per_client = per_client
        # Each held request's deadline (time.monotonic), by client.
        self._seats: dict[str, dict[object, float]] = {}
        self._held = 0
        self._shared: dict[uuid.UUID, _Shared] = {}
        self._reads: dict[uuid.UUID, asyncio.Task[JobView | None]] = {}

    @property
    def held(self) -> int:
        """Requests held now."""
        return self._held

    @property
    def jobs_waited_for(self) -> int:
        """Distinct jobs the held requests wait for (one shared wait each)."""
        return len(self._shared)

    @contextlib.contextmanager
    def seat(self, client: str, seconds: float) -> Iterator[None]:
        """Hold one request of ``client`` for up to ``seconds``; raises
        :class:`TooManyWaiters` at once when the client, or the process, holds as
        many as it may."""
        now = time.monotonic()
        mine = self._seats.get(client, {})
        if len(mine) >= self.per_client:
            wait = _until_first(mine.values(), now)
            raise TooManyWaiters(
                429,
                f"{client} holds {len(mine)} GET ?wait= requests already, the most one"
                f" client may: poll without ?wait=, or try again in {wait} s",
                wait,
                self.per_client,
            )
        if self._held >= self.most:
            wait = _until_first((d for s in self._seats.values() for d in s.values()), now)
            raise TooManyWaiters(
                503,
                f"the server holds {self._held} GET ?wait= requests already, the most it"
                f" may: poll without ?wait=, or try again in {wait} s",
                wait,
                self.most,
            )
        token = object()
        self._seats.setdefault(client, {})[token] = now + seconds
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            seats = self._seats[client]
            del seats[token]
            if not seats:
                del self._seats[client]

    async def wait(self, db: Database, job_id: uuid.UUID, seconds: float) -> JobView | None:
        """The job as soon as it is done, else as it is after ``seconds``; None if it
        is gone. Every request waiting for the job shares one wait and one read."""
        shared = self._shared.get(job_id)
        if shared is None:
            shared = _Shared(asyncio.create_task(self._until_done(db, job_id)))
            self._shared[job_id] = shared
            shared.task.add_done_callback(lambda _: self._forget(job_id, shared))
        shared.waiters += 1
        try:
            return await asyncio.wait_for(asyncio.shield(shared.task), seconds)
        except TimeoutError:
            pass
        finally:
            shared.waiters -= 1
            if not shared.waiters and not shared.task.done():
                # Nobody waits for it any more: stop listening for the job. Forgotten
                # now, so that a request arriving meanwhile starts a wait of its own
                # rather than join one being cancelled.
                self._forget(job_id, shared)
                shared.task.cancel()
        return await self.read(db, job_id)

    async def read(self, db: Database, job_id: uuid.UUID) -> JobView | None:
        """The job as it is (None if gone); reads of one job that coincide are one."""
        task = self._reads.get(job_id)
        if task is None:
            task = asyncio.create_task(_read(db, job_id))
            self._reads[job_id] = task
            task.add_done_callback(lambda done: self._read_done(job_id, done))
        return await asyncio.shield(task)

    async def _until_done(self, db: Database, job_id: uuid.UUID) -> JobView | None:
        while True:
            try:
                await outbox.wait_for_async(
                    db.engine, job_id, timeout=_HOLD_SECONDS, listen_url=db.url.listen
                )
            except TimeoutError:
                continue
            except outbox.JobNotFound:
                pass
            return await self.read(db, job_id)

    def _forget(self, job_id: uuid.UUID, shared: _Shared) -> None:
        if self._shared.get(job_id) is shared:
            del self._shared[job_id]

    def _read_done(self, job_id: uuid.UUID, task: asyncio.Task[JobView | None]) -> None:
        if self._reads.get(job_id) is task:
            del self._reads[job_id]
        # Taken by whoever awaited it; this keeps an error nobody awaited any more
        # (every reader gone) out of asyncio's "never retrieved" log.
        if not task.cancelled():
            task.exception()


async def _read(db: Database, job_id: uuid.UUID) -> JobView | None:
    async with db.reading() as session:
        return await service.get_job(session, job_id)


def _until_first(deadlines: Iterable[float], now: float) -> int:
    """Whole seconds until the soonest of ``deadlines`` (a seat is free by then), at
    least 1."""
    return max(1, math.ceil(min(deadlines, default=now) - now))
