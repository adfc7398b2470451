"""The tests' databases, made and dropped off the tests' own time.

Each test gets a database of its own, copied from a migrated template (as files:
the cheaper way for the CPU). Copying one takes a hundred milliseconds or more on a
busy runner, and dropping one more: on
PostgreSQL 15, DROP DATABASE forces an immediate checkpoint and waits for it, that
is for every dirty buffer of the server to reach the disk. No test needs to wait for
either. So a thread of this pytest process keeps the next test's copy ready, and
others drop each test's database once the test is done with it; the session waits
for the drops at its end, and fails if one failed.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Callable

import psycopg

# How many databases may wait to be dropped before a test's teardown waits: bounds
# the disk the suite holds (a copy of the template is about 10 MB). A run of quick
# tests (argument checks, say) ends a database every few tens of milliseconds, faster
# than one drop's checkpoint, and the slower tests after it let the drops catch up.
MAX_PENDING_DROPS = 64

# Drops at once: the checkpointer serves the checkpoints that concurrent drops ask
# for with one, so several threads drop more per second than one does.
DROP_THREADS = 3


def new_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def create(connect: Callable[[], psycopg.Connection], name: str, template: str | None) -> None:
    # FILE_COPY: the default strategy (WAL_LOG) writes the whole copy through the
    # WAL and the shared buffers, which the next checkpoint (every drop forces one)
    # then writes out again; copied as files, the short tests ran 15% faster.
    clone = f' TEMPLATE "{template}" STRATEGY FILE_COPY' if template else ""
    with connect() as admin:
        admin.execute(f'CREATE DATABASE "{name}"{clone}')


def drop(connect: Callable[[], psycopg.Connection], name: str) -> None:
    """Dropped even if connections linger (a daemon the test left, say)."""
    with connect() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Dropper:
    """Drops databases on threads of its own."""

    def __init__(self, connect: Callable[[], psycopg.Connection]) -> None:
        self._connect = connect
        self._pending: queue.Queue[str] = queue.Queue(maxsize=MAX_PENDING_DROPS)
        self._failures: list[str] = []
        for n in range(DROP_THREADS):
            threading.Thread(target=self._run, name=f"drop-test-databases-{n}", daemon=True).start()

    def drop_later(self, name: str) -> None:
        self._pending.put(name)  # waits while MAX_PENDING_DROPS are pending

    def wait(self) -> None:
        """Every database given is dropped; raises if one could not be."""
        self._pending.join()
        if self._failures:
            failures, self._failures = self._failures, []
            raise RuntimeError("test databases not dropped: " + "; ".join(failures))

    def _run(self) -> None:
        while True:
            name = self._pending.get()
            try:
                drop(self._connect, name)
            except Exception as exc:  # said at the session's end
                self._failures.append(f"{name}: {exc}")
            finally:
                self._pending.task_done()


class Copies:
    """Copies of one template database, the next one made while a test runs."""

    def __init__(self, connect: Callable[[], psycopg.Connection], template: str) -> None:
        self._connect = connect
        self._template = template
        self._lock = threading.Lock()
        self._next: threading.Thread | None = None
        self._ready: str | None = None

    def take(self, prefix: str) -> str:
        """A fresh copy of the template: the one made ahead, if any."""
        with self._lock:
            if self._next is not None:
                self._next.join()
                self._next = None
            name, self._ready = self._ready, None
        if name is None:  # none made ahead, or making it failed: this one says why
            name = new_name(prefix)
            create(self._connect, name, self._template)
        self._start_next(prefix)
        return name

    def close(self) -> str | None:
        """Stop making copies; the name of one made and never taken, if any."""
        with self._lock:
            if self._next is not None:
                self._next.join()
                self._next = None
            name, self._ready = self._ready, None
        return name

    def _start_next(self, prefix: str) -> None:
        def make() -> None:
            name = new_name(prefix)
            try:
                create(self._connect, name, self._template)
            except Exception:  # the next take makes its own, and says why
                return
            self._ready = name

        with self._lock:
            self._next = threading.Thread(target=make, name="copy-test-database", daemon=True)
            self._next.start()
