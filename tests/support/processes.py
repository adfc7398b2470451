"""Real `relay` and `consumer` processes for tests where a process boundary matters."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


class Daemon:
    def __init__(
        self, command: str, args: list[str], env: dict[str, str], log_dir: str | None = None
    ) -> None:
        self.command = command
        self.log_path = Path(tempfile.mkstemp(prefix=f"{command}-", suffix=".log", dir=log_dir)[1])
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [str(BIN / command), *args],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def has_event(self, name: str) -> bool:
        return any(e.get("event") == name for e in self.events())

    def wait_for_event(self, name: str, timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events():
                if e.get("event") == name:
                    return e
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.command} exited {self.proc.returncode}:\n{self.text()}"
                )
            time.sleep(0.05)
        raise AssertionError(f"no {name} from {self.command} in {timeout}s:\n{self.text()[-4000:]}")

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, then wait; returns the exit code. A process that does not stop in
        time is killed (and the TimeoutExpired raised), never left behind."""
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise
        finally:
            self._log.close()

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()


def service_env(
    db: DatabaseUrl, amqp: AmqpUrl | str, topology: Topology, **extra: str
) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RELAY_", "CONSUMER_"))
    }
    env.update(
        DATABASE_URL=db.conninfo,
        AMQP_URL=amqp if isinstance(amqp, str) else amqp.url,
        AMQP_PREFIX=topology.prefix,
        AMQP_QUEUE_TYPE=topology.queue_type.value,
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def jobctl_env(url: DatabaseUrl | str, **env: str) -> dict[str, str]:
    """This process's environment for a `jobctl` run against ``url``, with ``env``
    over it; any DATABASE_URL* of the caller's left out."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("DATABASE_URL")}
    environment["DATABASE_URL"] = url if isinstance(url, str) else url.conninfo
    environment.update(env)
    return environment


def jobctl(
    *args: str, url: DatabaseUrl | str, cwd: Path, executable: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """`jobctl ...` as a user runs it, from ``cwd`` with ``env``: its exit and its
    output. Run here, by click's test runner, unless ``executable`` names another
    copy: a process of its own costs half a second of CPU to start, and the suite
    runs hundreds of commands. What a process boundary changes (the entry point,
    what it imports, signals) is checked through :func:`jobctl_process`."""
    if executable is not None:
        return jobctl_process(*args, url=url, cwd=cwd, executable=executable, **env)
    return _jobctl_here(list(args), jobctl_env(url, **env), cwd)


def jobctl_process(
    *args: str, url: DatabaseUrl | str, cwd: Path, executable: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """`jobctl ...` in a process of its own, from ``cwd``: its exit and its output."""
    return subprocess.run(
        [str(executable or BIN / "jobctl"), *args],
        cwd=cwd,
        env=jobctl_env(url, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _jobctl_here(
    args: list[str], environment: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """`jobctl` in this process, on a thread of its own (its commands run their own
    event loop, which a test's running loop would refuse), in ``cwd`` and with this
    process's environment made ``environment`` meanwhile; an unexpected exception
    reads as the process's would: a traceback on stderr, exit status 1."""
    from click.testing import CliRunner

    from hybrid_jobs.jobctl.cli import main

    changes: dict[str, str | None] = {k: None for k in os.environ if k not in environment}
    changes.update(environment)
    done: list[Any] = []

    def invoke() -> None:
        before = os.getcwd()
        # A command that logs (`jobctl doctor`) sets the root logger up for itself,
        # as a process of its own would: it is put back for the tests that follow.
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        os.chdir(cwd)
        try:
            done.append(CliRunner().invoke(main, args, env=changes, prog_name="jobctl"))
        finally:
            os.chdir(before)
            root.handlers[:] = handlers
            root.setLevel(level)

    thread = threading.Thread(target=invoke, name="jobctl")
    thread.start()
    thread.join(60)
    if thread.is_alive():
        raise subprocess.TimeoutExpired(["jobctl", *args], 60)
    (result,) = done
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["jobctl", *args], result.exit_code, result.stdout, stderr)


def refused(command: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with ``args``, which it must refuse before starting: exit
    status 2 and one line on stderr (a usage or setting error, no traceback)."""
    done = subprocess.run(
        [str(BIN / command), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done


@contextmanager
def running(command: str, args: list[str], env: dict[str, str], ready: str) -> Iterator[Daemon]:
    """Start a daemon, wait for its ready event, and stop it (or kill it) afterwards."""
    daemon = Daemon(command, args, env)
    try:
        daemon.wait_for_event(ready)
        yield daemon
    finally:
        if daemon.proc.poll() is None:
            try:
                daemon.stop(20)
            except subprocess.TimeoutExpired:
                daemon.kill()


@contextmanager
def fleet(
    env: dict[str, str], args: list[str], consumers: int = 1, *, relay_args: Sequence[str] = ()
) -> Iterator[tuple[Daemon, list[Daemon]]]:
    """A relay (with ``relay_args``) and ``consumers`` consumers started with ``args``,
    each ready before the next starts; stopped in the reverse order, the relay last."""
    with ExitStack() as stack:
        relay = stack.enter_context(running("relay", list(relay_args), env, "relay.started"))
        started = [
            stack.enter_context(running("consumer", args, env, "consumer.started"))
            for _ in range(consumers)
        ]
        yield relay, started
