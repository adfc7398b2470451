"""``consumer --processes N``: one supervisor, N worker processes.

Each worker is the ordinary consumer, started afresh as ``python -m hybrid_jobs.consumers``
with the supervisor's own arguments (so it imports ``--app`` itself, and has its
own worker id, pools and broker connection). The supervisor:

- runs no jobs and holds no lease: what a worker held when it died is recovered
  through its leases, as for any worker killed;
- restarts a worker that exits unasked (a crash, kill -9, the OOM killer), after
  1 s, then 2, 4 ... up to 30 s while it keeps crashing within 30 s of starting;
- starts a replacement as soon as a worker says it is recycling (``--max-jobs-
  per-process``, ``--max-memory-per-process``), while the old one finishes what it
  holds, so capacity does not dip for the length of a drain;
- on SIGTERM or SIGINT, asks every worker for a graceful stop and exits when they
  all have; a second signal is passed on to them as SIGTERM, which stops them at
  once, as it does a single consumer.

Each worker holds one end of a socket pair with the supervisor. The supervisor asks
for the stop there rather than with a signal: a worker still starting (a
replacement, say) cannot miss it, where a signal would kill it before its handlers
are in place. A worker announces its recycle there too, and reads end-of-file there
when the supervisor is gone (killed with -9, say), which stops it gracefully rather
than leaving it orphaned. Workers run in a session of their own, so a terminal's
Ctrl-C reaches only the supervisor. Every log line of a worker carries ``"child"``
(its slot, 1..N, kept by its replacements) and ``"pid"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from hybrid_jobs.plumbing.config import ConfigError

log = logging.getLogger("consumer")

# Set in a worker's environment by its supervisor.
SLOT_VARIABLE = "HYBRID_JOBS_WORKER_SLOT"
LINK_VARIABLE = "HYBRID_JOBS_SUPERVISOR_FD"
RECYCLING = b"recycling\n"
STOP = b"stop\n"

RESTART_BASE_S = 1.0
RESTART_CAP_S = 30.0
# A worker that ran this long before crashing is restarted at once again.
STABLE_S = 30.0
# A worker never to start: the same refusal would come from every one.
CONFIG_ERROR_STATUS = 2


def restart_delay(crashes: int) -> float:
    """Seconds before restarting a worker after its ``crashes``-th quick crash."""
    return min(RESTART_CAP_S, RESTART_BASE_S * 2.0 ** max(crashes - 1, 0))


def describe_status(returncode: int) -> str:
    if returncode < 0:
        return signal.Signals(-returncode).name
    return f"exit {returncode}"


@dataclass(eq=False)
class Child:
    slot: int
    process: asyncio.subprocess.Process
    messages: asyncio.StreamReader
    link: asyncio.StreamWriter
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.process.pid

    def ask_to_stop(self) -> None:
        """A graceful stop, through the link: read whenever the worker gets to it."""
        if not self.link.is_closing():
            with contextlib.suppress(OSError):
                self.link.write(STOP)
            self.link.close()

    def signal(self, signum: int) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)


class Supervisor:
    def __init__(self, processes: int, argv: Sequence[str]) -> None:
        self.processes = processes
        self.argv = list(argv)
        self.live: set[Child] = set()
        self.stopping = False
        self.refused: Child | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        log.info(
            "consumer.supervisor_started", extra={"processes": self.processes, "pid": os.getpid()}
        )
        slots = [
            asyncio.create_task(self._keep(slot, stop), name=f"worker slot {slot}")
            for slot in range(1, self.processes + 1)
        ]
        try:
            await stop.wait()
            await self._stop_all(slots)
        except asyncio.CancelledError:
            # A second signal: pass it on, so the workers stop at once too.
            for child in list(self.live):
                child.signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await self._all_exited()
            raise
        log.info("consumer.supervisor_stopped", extra={"pid": os.getpid()})
        if self.refused is not None:
            raise ConfigError(
                f"worker process {self.refused.slot} refused to start "
                f"({describe_status(self.refused.process.returncode or 0)}): see its line above"
            )

    async def _stop_all(self, slots: list[asyncio.Task[None]]) -> None:
        self.stopping = True
        for child in list(self.live):
            child.ask_to_stop()
        await self._all_exited()
        for task in slots:
            task.cancel()
        await asyncio.gather(*slots, *self._retiring, return_exceptions=True)

    async def _all_exited(self) -> None:
        while self.live:
            self._changed.clear()
            await self._changed.wait()

    async def _keep(self, slot: int, stop: asyncio.Event) -> None:
        """Keep one worker running in ``slot`` until the supervisor stops."""
        crashes = 0
        while not self.stopping:
            child = await self._spawn(slot)
            if self.stopping:  # the signal came while it was being started
                child.ask_to_stop()
            recycling = await child.messages.readline() == RECYCLING
            if recycling and not self.stopping:
                # It stops claiming now and drains; its replacement starts meanwhile.
                task = asyncio.create_task(self._retire(child))
                self._retiring.add(task)
                task.add_done_callback(self._retiring.discard)
                crashes = 0
                continue
            status = await self._exited(child)
            if self.stopping:
                return
            if status == CONFIG_ERROR_STATUS:
                self.refused = child
                stop.set()
                return
            if status == 0:  # it left cleanly without being asked: replace it
                crashes = 0
                continue
            ran = time.monotonic() - child.started
            crashes = 1 if ran >= STABLE_S else crashes + 1
            delay = restart_delay(crashes)
            log.warning(
                "consumer.process_crashed",
                extra={
                    "child": slot,
                    "pid": child.pid,
                    "status": describe_status(status),
                    "ran_s": round(ran, 1),
                    "restart_in_s": delay,
                    "detail": "its jobs run again once their leases expire",
                },
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await stop.wait()

    async def _retire(self, child: Child) -> None:
        status = await self._exited(child)
        if status != 0 and not self.stopping:
            log.warning(
                "consumer.process_crashed",
                extra={
                    "child": child.slot,
                    "pid": child.pid,
                    "status": describe_status(status),
                    "detail": "while recycling; its jobs run again once their leases expire",
                },
            )

    async def _exited(self, child: Child) -> int:
        status = await child.process.wait()
        child.link.close()
        self.live.discard(child)
        self._changed.set()
        log.info(
            "consumer.process_exited",
            extra={"child": child.slot, "pid": child.pid, "status": describe_status(status)},
        )
        return status

    async def _spawn(self, slot: int) -> Child:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env[SLOT_VARIABLE] = str(slot)
        env[LINK_VARIABLE] = str(theirs.fileno())
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "hybrid_jobs.consumers",
                *self.argv,
                env=env,
                pass_fds=(theirs.fileno(),),
                # Out of the terminal's process group: Ctrl-C reaches the supervisor
                # alone, which passes it on once.
                start_new_session=True,
            )
        finally:
            theirs.close()
        messages, link = await asyncio.open_connection(sock=ours)
        child = Child(slot, process, messages, link)
        self.live.add(child)
        log.info("consumer.process_started", extra={"child": slot, "pid": child.pid})
        return child


class SupervisorLink:
    """A worker's side of its supervisor: the socket it shares with it."""

    def __init__(self, slot: int, fd: int) -> None:
        self.slot = slot
        self.sock = socket.socket(fileno=fd)
        self.sock.setblocking(False)

    @classmethod
    def from_environment(cls) -> SupervisorLink | None:
        slot, fd = os.environ.get(SLOT_VARIABLE), os.environ.get(LINK_VARIABLE)
        if not (slot and fd):
            return None
        return cls(int(slot), int(fd))

    def tag_log_lines(self) -> None:
        """Every log record of this process names its slot and pid."""
        make_record = logging.getLogRecordFactory()
        slot, pid = self.slot, os.getpid()

        def tagged(*args: object, **kwargs: object) -> logging.LogRecord:
            record = make_record(*args, **kwargs)
            record.__dict__.update(child=slot, pid=pid)
            return record

        logging.setLogRecordFactory(tagged)

    def stop_when_asked(self, stop: asyncio.Event) -> None:
        """Set ``stop`` when the supervisor asks, or when it is gone (its end of
        the socket closed without asking: it died)."""
        loop = asyncio.get_running_loop()

        def readable() -> None:
            try:
                data = self.sock.recv(64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            loop.remove_reader(self.sock.fileno())
            if stop.is_set():
                return
            if data.startswith(STOP):
                log.info("consumer.stop_requested", extra={"by": "supervisor"})
            else:
                log.warning("consumer.supervisor_gone", extra={"action": "stopping"})
            stop.set()

        loop.add_reader(self.sock.fileno(), readable)

    def announce_recycling(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.send(RECYCLING)
