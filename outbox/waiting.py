"""Wait for a job to end, and get how it ended.

::

    with Session(engine) as session, session.begin():
        job_id = outbox.enqueue(session, "resize", {"image": 7})
    done = outbox.wait_for(engine, job_id, timeout=30)
    done.state, done.result          # SUCCEEDED, {"width": 640}

A trigger on ``jobs`` (``jobs_finished``) notifies channel ``job_finished`` with
the job's id whenever an update moves a job into a final state; PostgreSQL delivers
it at the commit that ended the job. Every waiter of the process shares one listening
connection per database (application_name ``outbox-wait``), held by one thread
whether the waiters are threads or coroutines of any event loop: a thousand
waiters cost one connection, and nobody polls. A waiter reads the job once the
listener is listening (so an end committed before that is seen too), then again
only when it is told its job ended, or when the listener connected again after
losing its connection (notifications sent meanwhile are lost, the row is not).
The listener closes its connection once no one has waited for a while.

The connection is the engine's URL; behind a transaction pooler, which cannot
carry LISTEN, pass ``listen_url`` (a direct ``postgresql://`` URL, as
``DATABASE_LISTEN_URL`` gives the daemons).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, urlencode

import psycopg
from psycopg import sql

from hybrid_jobs.outbox.explain import JobNotFound
from hybrid_jobs.outbox.instance import bound_schema
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.plumbing.db import connection_kwargs
from hybrid_jobs.schema.queries import JOB_OUTCOME
from hybrid_jobs.schema.states import TERMINAL, JobState
from hybrid_jobs.schema.tables import INSTANCE_SCHEMA_SQL, JOB_FINISHED_CHANNEL, channel

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("outbox.waiting")

APPLICATION_NAME: Final = "outbox-wait"
# How long the listener keeps its connection once its last waiter left: a process
# that waits for one job after another does not reconnect for each.
IDLE_SECONDS: Final = 10.0
# How often the listener's thread looks up from the socket (to close when idle).
TICK_SECONDS: Final = 0.5
# Between attempts to connect again, while someone waits.
RECONNECT_SECONDS: Final = (0.1, 0.5, 1.0, 2.0)


@dataclass(frozen=True)
class Finished:
    """How a job ended: its final state, a handler's result (None unless it
    SUCCEEDED with one), its last error, and when."""

    job_id: uuid.UUID
    state: JobState
    result: Any
    last_error_code: str | None
    last_error_message: str | None
    finished_at: datetime | None


class _Waiter:
    """One caller waiting for one job. ``wake`` is called from the listener's
    thread; ``ready`` is whether the listener is listening now."""

    __slots__ = ("job_id", "ready", "wake")

    def __init__(self, job_id: uuid.UUID, wake: Callable[[], None]) -> None:
        self.job_id = job_id
        self.wake = wake
        self.ready = False


class _Listener:
    """The process's listening connection to one database, and who waits on it."""

    def __init__(self, key: str, conninfo: str) -> None:
        self.key = key
        self.conninfo = conninfo
        self.waiters: dict[uuid.UUID, set[_Waiter]] = {}
        self.listening = False
        self.error: str | None = None
        self.idle_since = time.monotonic()
        self.thread = threading.Thread(target=self._run, name=APPLICATION_NAME, daemon=True)

    # Called with _LOCK held.
    def add(self, waiter: _Waiter) -> None:
        self.waiters.setdefault(waiter.job_id, set()).add(waiter)
        waiter.ready = self.listening

    def remove(self, waiter: _Waiter) -> None:
        with _LOCK:
            found = self.waiters.get(waiter.job_id)
            if found is not None:
                found.discard(waiter)
                if not found:
                    del self.waiters[waiter.job_id]
            if not self.waiters:
                self.idle_since = time.monotonic()

    def _set_listening(self, listening: bool) -> list[_Waiter]:
        with _LOCK:
            self.listening = listening
            everyone = [w for ws in self.waiters.values() for w in ws]
            for w in everyone:
                w.ready = listening
            return everyone

    def _retire(self, idle: float = IDLE_SECONDS) -> bool:
        """Leave the registry if nobody waits and nobody has for ``idle`` seconds."""
        with _LOCK:
            if self.waiters or time.monotonic() - self.idle_since < idle:
                return False
            if _LISTENERS.get(self.key) is self:
                del _LISTENERS[self.key]
            return True

    def _run(self) -> None:
        try:
            self._listen()
        except Exception:
            log.exception("outbox.wait_listener_crashed")
        finally:
            # Gone for good (idle, or crashed): the next waiter starts another.
            with _LOCK:
                self.listening = False
                if _LISTENERS.get(self.key) is self:
                    del _LISTENERS[self.key]

    def _listen(self) -> None:
        failures = 0
        while True:
            try:
                with psycopg.Connection.connect(
                    self.conninfo, autocommit=True, **connection_kwargs(APPLICATION_NAME)
                ) as conn:
                    # The instance's channel: its schema as this connection finds it.
                    row = conn.execute(f"SELECT {INSTANCE_SCHEMA_SQL}").fetchone()
                    listened = channel(row[0] if row else "", JOB_FINISHED_CHANNEL)
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(listened)))
                    failures = 0
                    self.error = None
                    # Everyone reads their job now: whatever ended before this
                    # LISTEN (or while a lost connection was down) is in the row.
                    for w in self._set_listening(True):
                        w.wake()
                    while True:
                        for notice in conn.notifies(timeout=TICK_SECONDS):
                            self._dispatch(notice.payload)
                        if self._retire():
                            return
            except psycopg.Error as exc:
                self._set_listening(False)
                self.error = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
                # Nobody to reconnect for (the database may be gone for good).
                if self._retire(idle=0):
                    return
                delay = RECONNECT_SECONDS[min(failures, len(RECONNECT_SECONDS) - 1)]
                failures += 1
                log.warning("outbox.wait_listen_failed", extra={"error": self.error})
                time.sleep(delay)

    def _dispatch(self, payload: str) -> None:
        try:
            job_id = uuid.UUID(payload)
        except ValueError:
            return
        with _LOCK:
            found = list(self.waiters.get(job_id, ()))
        for w in found:
            w.wake()


_LOCK = threading.Lock()
_LISTENERS: dict[str, _Listener] = {}


def _register(conninfo: str, waiter: _Waiter) -> _Listener:
    with _LOCK:
        listener = _LISTENERS.get(conninfo)
        fresh = listener is None
        if listener is None:
            listener = _LISTENERS[conninfo] = _Listener(conninfo, conninfo)
        listener.add(waiter)
    if fresh:
        listener.thread.start()
    return listener


def _url_of(engine: Engine | AsyncEngine, listen_url: str | None) -> str:
    url = DatabaseUrl.parse(listen_url or _libpq_url(engine), variable="the engine's URL")
    # The listening connection is not the engine's: it looks where the engine looks.
    schema = bound_schema(engine)
    return (url.in_schema(schema) if schema else url).conninfo


def _libpq_url(engine: Engine | AsyncEngine) -> str:
    """The engine's URL as libpq reads it. SQLAlchemy writes a space in the query as
    ``+`` (``options=-c+search_path%3Dx``), which libpq does not decode: the server
    would be asked for a setting named ``+search_path`` and refuse the connection."""
    url = engine.url
    query = [
        (key, value)
        for key, values in url.query.items()
        for value in ((values,) if isinstance(values, str) else values)
    ]
    base = url.set(query={}).render_as_string(hide_password=False)
    return f"{base}?{urlencode(query, quote_via=quote)}" if query else base


def _job_id(job_id: uuid.UUID | str) -> uuid.UUID:
    # The waiters are found by the UUID a notification names: an id kept as text
    # would never be woken, and would wait out its whole timeout.
    if isinstance(job_id, uuid.UUID):
        return job_id
    if isinstance(job_id, str):
        try:
            return uuid.UUID(job_id)
        except ValueError:
            raise ValueError(f"job_id must be a UUID, got {job_id!r}") from None
    raise TypeError(f"job_id must be a UUID or its text, got {type(job_id).__name__}")


def _check_timeout(timeout: float) -> None:
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout >= 0):
        raise ValueError(f"timeout must be a finite number of seconds >= 0, not {timeout!r}")


def _outcome(job_id: uuid.UUID, row: Any) -> Finished | None:
    if row is None:
        raise JobNotFound(job_id)
    state = JobState(row[0])
    if state not in TERMINAL:
        return None
    return Finished(job_id, state, row[1], row[2], row[3], row[4])


def _timed_out(job_id: uuid.UUID, timeout: float, listener: _Listener) -> TimeoutError:
    why = "" if listener.listening else f" (not listening: {listener.error or 'connecting'})"
    return TimeoutError(f"job {job_id} did not end within {timeout:g}s{why}")


def wait_for(
    engine: Engine,
    job_id: uuid.UUID | str,
    timeout: float = 30,
    *,
    listen_url: str | None = None,
) -> Finished:
    """Block until the job is SUCCEEDED, FAILED or CANCELLED and return how it
    ended (at once if it has already). ``job_id`` is a UUID or its text (as
    jobctl, JSON and the API give it). Raises ``TimeoutError`` after ``timeout``
    seconds, and :class:`outbox.JobNotFound` for an id no job has (or a job
    retention deleted). Holds no transaction while it waits; reads the row with a
    connection of ``engine`` only when there is news."""
    job_id = _job_id(job_id)
    _check_timeout(timeout)
    deadline = time.monotonic() + timeout
    news = threading.Event()
    waiter = _Waiter(job_id, news.set)
    listener = _register(_url_of(engine, listen_url), waiter)
    try:
        while True:
            if waiter.ready:
                news.clear()
                with engine.connect() as conn:
                    row = conn.exec_driver_sql(JOB_OUTCOME, {"job_id": job_id}).first()
                    conn.rollback()
                done = _outcome(job_id, row)
                if done is not None:
                    return done
            left = deadline - time.monotonic()
            if left <= 0 or not news.wait(left):
                raise _timed_out(job_id, timeout, listener)
    finally:
        listener.remove(waiter)


async def wait_for_async(
    engine: AsyncEngine,
    job_id: uuid.UUID | str,
    timeout: float = 30,  # noqa: ASYNC109 - the twin of wait_for's contract
    *,
    listen_url: str | None = None,
) -> Finished:
    """:func:`wait_for` for an ``AsyncEngine``: the coroutine waits, the event loop
    does not."""
    job_id = _job_id(job_id)
    _check_timeout(timeout)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    news = asyncio.Event()

    def wake() -> None:
        # the loop may have closed under a waiter abandoned with it
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(news.set)

    waiter = _Waiter(job_id, wake)
    listener = _register(_url_of(engine, listen_url), waiter)
    try:
        while True:
            if waiter.ready:
                news.clear()
                async with engine.connect() as conn:
                    result = await conn.exec_driver_sql(JOB_OUTCOME, {"job_id": job_id})
                    row = result.first()
                    await conn.rollback()
                done = _outcome(job_id, row)
                if done is not None:
                    return done
            left = deadline - loop.time()
            if left <= 0:
                raise _timed_out(job_id, timeout, listener)
            try:
                await asyncio.wait_for(news.wait(), left)
            except TimeoutError:
                raise _timed_out(job_id, timeout, listener) from None
    finally:
        listener.remove(waiter)
