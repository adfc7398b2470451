"""`./scripts/run` as a person runs it: in a terminal, stopped with Ctrl-C. The
terminal's Ctrl-C must mean one graceful stop of every daemon it started (not SIGINT
from the terminal plus SIGTERM from the script, which a daemon reads as "stop now"),
and a second Ctrl-C a stop at once."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine

from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.jobs import attempts, enqueue, job
from tests.support.processes import ROOT, service_env

pytestmark = pytest.mark.timeout(240)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Terminal:
    """A program on a pseudo-terminal of its own, as if typed into a shell: SIGINT
    at its default, whatever these tests were started with (a run started in the
    background, `pytest &`, or by some CI wrappers, has it ignored, and a program
    inherits that). ``sigint=signal.SIG_IGN`` starts it that way on purpose."""

    def __init__(
        self, argv: list[str], env: dict[str, str], sigint: signal.Handlers = signal.SIG_DFL
    ) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: a session leader on the terminal
            os.chdir(ROOT)
            signal.signal(signal.SIGINT, sigint)
            os.execve(argv[0], argv, env)
        self.output = ""
        self.status: int | None = None

    def read(self, timeout: float = 0.2) -> None:
        while select.select([self.fd], [], [], timeout)[0]:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # the terminal closed: every program on it is gone
                return
            if not chunk:
                return
            self.output += chunk.decode(errors="replace").replace("\r\n", "\n")
            timeout = 0

    def expect(self, text: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.output[-5000:]}"
            self.read()
            self.poll()
            assert self.status is None or text in self.output, self.output[-5000:]

    def ctrl_c(self) -> None:
        os.write(self.fd, b"\x03")

    def poll(self) -> int | None:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
        return self.status

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            assert time.monotonic() < deadline, f"still running:\n{self.output[-5000:]}"
            self.read()
        self.read(0.5)
        assert self.status is not None
        return self.status

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.output.splitlines():
            # The terminal echoes a Ctrl-C as "^C" wherever the output is, which can
            # be the start of a log line.
            start = line.find("{")
            if name in line and start >= 0:
                try:
                    found.append(json.loads(line[start:]))
                except ValueError:
                    continue
        return [e for e in found if e.get("event") == name]

    def kill(self) -> None:
        """End everything still running in the terminal's session (the daemons
        have process groups of their own, in the same session)."""
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != self.pid:
                try:
                    if os.getsid(int(entry)) == self.pid:
                        os.kill(int(entry), signal.SIGKILL)
                except OSError:
                    continue
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


@contextmanager
def scripts_run(
    env: dict[str, str], sigint: signal.Handlers = signal.SIG_DFL
) -> Iterator[Terminal]:
    terminal = Terminal([str(ROOT / "scripts" / "run")], env, sigint)
    try:
        yield terminal
    finally:
        terminal.kill()


def sleep_started(
    engine: Engine, pg: psycopg.Connection, terminal: Terminal, seconds: float
) -> uuid.UUID:
    """A sleep job of ``seconds``, once it runs, the script's output read meanwhile
    (and shown if it never starts)."""
    job_id = enqueue(engine, "sleep", {"seconds": seconds})
    deadline = time.monotonic() + 30
    while job(pg, job_id)["state"] != "RUNNING":
        assert time.monotonic() < deadline, terminal.output[-5000:]
        terminal.read(0.05)
    return job_id


@pytest.fixture
def run_env(db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology) -> dict[str, str]:
    env = service_env(db_url, amqp_url, topology)
    port = free_port()
    return env | {
        "APP": "tests.apps.basic",
        "INSTALL": "0",
        "JOBCTL_PORT": str(port),
        "VENV": str(ROOT / ".venv"),
        "TERM": "dumb",
    }


@pytest.mark.parametrize(
    "sigint", [signal.SIG_DFL, signal.SIG_IGN], ids=["from_a_shell", "started_with_sigint_ignored"]
)
def test_scripts_run_serves_the_dashboard_and_one_ctrl_c_stops_everything_gracefully(
    run_env: dict[str, str], engine: Engine, pg: psycopg.Connection, sigint: signal.Handlers
) -> None:
    with scripts_run(run_env, sigint) as terminal:
        terminal.expect("hybrid-jobs is running")
        port = run_env["JOBCTL_PORT"]
        assert f"http://127.0.0.1:{port}/" in terminal.output
        assert "examples.shop.checkout" in terminal.output, "it says how to enqueue"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            assert answer.status == 200, "jobctl serve runs"
        job_id = sleep_started(engine, pg, terminal, 2)
        terminal.ctrl_c()
        assert terminal.wait(60) == 0
    assert job(pg, job_id)["state"] == "SUCCEEDED", "the running job finished in the drain"
    assert [a["outcome"] for a in attempts(pg, job_id)] == ["SUCCEEDED"]
    for daemon in ("relay", "consumer"):
        signals = terminal.events(f"{daemon}.signal")
        assert [s["signal"] for s in signals] == ["SIGTERM"], (daemon, signals)
    assert terminal.events("consumer.stopped") and terminal.events("relay.stopped")
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)


def test_a_second_ctrl_c_stops_at_once(
    run_env: dict[str, str], engine: Engine, pg: psycopg.Connection
) -> None:
    with scripts_run(run_env) as terminal:
        terminal.expect("hybrid-jobs is running")
        sleep_started(engine, pg, terminal, 600)
        terminal.ctrl_c()
        terminal.expect('"consumer.draining"')
        terminal.ctrl_c()
        terminal.wait(30)
    actions = [s["action"] for s in terminal.events("consumer.signal")]
    assert actions[0] == "stopping" and actions[1].startswith("stopping now"), actions
