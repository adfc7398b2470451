"""How a daemon stops, and that it always does.

The first SIGTERM or SIGINT asks for a graceful stop. A terminal's Ctrl-C and a
supervisor's SIGTERM often arrive together (a script that forwards the signal it got
while the terminal signals the whole process group, ``docker compose`` in a
terminal): a signal of the other kind within ``SAME_STOP_SECONDS`` of the first is the
same request. Any further signal means "stop now": the main task is cancelled, and if
the process has not ended ``FORCE_EXIT_SECONDS`` later, the log names what still runs
and the process exits anyway. (A task that swallows its cancellation keeps an event
loop from closing for ever: psycopg_pool's maintenance worker catches
``CancelledError`` while it opens a connection, which is how a relay stopped right
after start used to hang.)

After the event loop has ended, the process does not wait for threads that outlived
it either (a plain handler's, abandoned at its time limit): it names them and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Collection
from types import FrameType
from typing import Any, NoReturn

# A signal of the other kind this soon after the first is the same stop request.
SAME_STOP_SECONDS = 1.0
# After "stop now", how long the cancelled tasks get before the process exits anyway.
FORCE_EXIT_SECONDS = 5.0
# After the main coroutine returned, how long closing the event loop may take.
CLOSE_SECONDS = 10.0
# How long threads still running after the event loop ended get before the exit.
THREAD_JOIN_SECONDS = 1.0

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopper:
    """Turns signals into ``stop`` (graceful) and a cancel of the main task (now)."""

    def __init__(self, name: str, log: logging.Logger) -> None:
        self.name = name
        self.log = log
        self.stop: asyncio.Event | None = None
        self.task: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.first: tuple[int, float] | None = None
        self.requests = 0
        self.early: list[int] = []
        self._watchdog: threading.Timer | None = None
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._deadline = 0.0

    def catch_early(self) -> None:
        """Until the event loop takes over, remember signals instead of dying of
        them (a KeyboardInterrupt traceback, or SIGTERM's default); the loop's
        handler deals with them once installed."""
        for signum in SIGNALS:
            signal.signal(signum, self._early)

    def _early(self, signum: int, _frame: FrameType | None) -> None:
        self.early.append(signum)

    def install(self, stop: asyncio.Event) -> None:
        """In the main task: signals from now on go through the event loop.

        Not by the loop's add_signal_handler: its removal (at the end, or when the
        loop closes) puts the default action back before anything else can replace
        it, and a signal in that instant (a second Ctrl-C just as a quick stop
        ends) killed the process with SIGTERM's status. So the handlers are Python's
        own from start to exit, and a wake-up descriptor the loop reads brings the
        loop round to run them at once, as the loop's own would."""
        self.stop = stop
        self.task = asyncio.current_task()
        self.loop = asyncio.get_running_loop()
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        writer.setblocking(False)
        self._wakeup = (reader, writer)
        self.loop.add_reader(reader.fileno(), self._woken)
        signal.set_wakeup_fd(writer.fileno())
        for signum in SIGNALS:
            signal.signal(signum, self._in_loop)
        for early in self.early:
            self.on_signal(early)

    def _in_loop(self, signum: int, _frame: FrameType | None) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.on_signal, signum)

    def _woken(self) -> None:
        """The descriptor's bytes say only that a signal came; its handler has run."""
        with contextlib.suppress(OSError):
            while self._wakeup is not None and self._wakeup[0].recv(512):
                pass

    def uninstall(self) -> None:
        """The main coroutine is ending: from here to the exit, a signal changes
        nothing (the close is bounded by :meth:`arm`); it is noted, never left to
        the default action."""
        self.catch_early()
        if self._wakeup is not None:
            signal.set_wakeup_fd(-1)
            if self.loop is not None:
                self.loop.remove_reader(self._wakeup[0].fileno())
            for end in self._wakeup:
                end.close()
            self._wakeup = None

    def on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        now = time.monotonic()
        if self.first is None:
            self.first = (signum, now)
            self.requests = 1
            self.log.info(f"{self.name}.signal", extra={"signal": name, "action": "stopping"})
        elif (
            self.requests == 1
            and signum != self.first[0]
            and now - self.first[1] < (SAME_STOP_SECONDS)
        ):
            self.requests = 2  # the same request, from a second sender; a third is "now"
            self.log.info(
                f"{self.name}.signal", extra={"signal": name, "action": "already stopping"}
            )
            return
        else:
            self.requests = 3
            self.log.warning(
                f"{self.name}.signal",
                extra={
                    "signal": name,
                    "action": f"stopping now; exiting in {FORCE_EXIT_SECONDS:g} s at most",
                },
            )
            if self.task is not None:
                self.task.cancel()
            self.arm(FORCE_EXIT_SECONDS, "a second signal asked to stop now")
        if self.stop is not None:
            self.stop.set()

    def arm(self, seconds: float, why: str) -> None:
        """Exit the process in ``seconds`` unless :meth:`disarm` comes first (or an
        earlier deadline set before)."""
        deadline = time.monotonic() + seconds
        if self._watchdog is not None and self._deadline <= deadline:
            return
        self.disarm()
        self._deadline = deadline
        self._watchdog = threading.Timer(seconds, self._force_exit, args=(seconds, why))
        self._watchdog.daemon = True
        self._watchdog.start()

    def disarm(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def _force_exit(self, seconds: float, why: str) -> None:
        self.log.error(
            f"{self.name}.exit_forced",
            extra={
                "why": why,
                "after_s": seconds,
                "still_running": _pending_tasks(self.loop),
                "threads": _live_threads(),
            },
        )
        _exit(1)

    def leave(self, code: int) -> NoReturn:
        """Exit: without waiting for threads that outlived the event loop, and
        with nothing left that a late signal could interrupt (at finalization
        Python puts back the default handlers, which would kill a process that is
        already leaving, with SIGTERM's status instead of its own)."""
        exit_without_waiting_for_threads(self.log, self.name, code)
        for signum in SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        self.arm(CLOSE_SECONDS, "the interpreter did not finish exiting")
        sys.exit(code)


async def cancel_and_wait(
    tasks: Collection[asyncio.Task[Any]], *, within: float = 3.0, tries: int = 3
) -> set[asyncio.Task[Any]]:
    """Cancel the tasks and wait for them, cancelling again the ones still running
    a moment later: a library that catches CancelledError (psycopg_pool, while it
    hands out or opens a connection) can swallow one cancel, and the task then runs
    on as if never asked. Returns the tasks still running after ``within`` seconds."""
    pending = {t for t in tasks if not t.done()}
    for _ in range(tries):
        if not pending:
            break
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=within / tries)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: ended tasks are the caller's to report
    return pending


def exit_without_waiting_for_threads(log: logging.Logger, name: str, code: int) -> None:
    """The event loop has ended: give threads still running a moment, then exit
    without them if they remain (Python would otherwise wait for each for ever)."""
    deadline = time.monotonic() + THREAD_JOIN_SECONDS
    for thread in _threads():
        thread.join(max(0.0, deadline - time.monotonic()))
    left = _live_threads()
    if left:
        log.warning(
            f"{name}.threads_abandoned",
            extra={"threads": left, "action": "exiting without waiting for them"},
        )
        _exit(code)


def _threads() -> list[threading.Thread]:
    me = threading.current_thread()
    return [
        t
        for t in threading.enumerate()
        if t is not me and t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]


def _live_threads() -> list[str]:
    return [t.name for t in _threads()]


def _pending_tasks(loop: asyncio.AbstractEventLoop | None) -> list[str]:
    if loop is None:
        return []
    for _ in range(3):  # read from another thread: the set may change meanwhile
        try:
            return sorted(t.get_name() for t in asyncio.all_tasks(loop) if not t.done())
        except RuntimeError:
            continue
    return ["(could not be listed)"]


def _exit(code: int) -> None:
    logging.shutdown()  # flush the log lines above
    os._exit(code)
