"""A private three-node RabbitMQ cluster on this machine, for the failover tests.

The machine's own node (rabbit@localhost, port 5672) is left alone. Each node here
gets its own node name, AMQP and distribution ports, config file (the machine's
pins the listener to 5672), plugins file (the machine's management plugin would
fight over 15672), and data, log, feature-flag and pid files, all in a temporary
directory owned by the ``rabbitmq`` user that ``rabbitmq-server`` drops to. Nodes 2
and 3 join node 1 with ``rabbitmqctl join_cluster``. About 20 s to start and 300 MB
of memory, so a test session starts it once; every node it started is stopped (and
killed if it will not stop) and its files removed, however the tests end.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

NODES = 3
BOOT_TIMEOUT_S = 90


def unavailable() -> str | None:
    """Why a cluster cannot be started here, or None."""
    for program in ("rabbitmq-server", "rabbitmqctl"):
        if shutil.which(program) is None:
            return f"needs {program} (Debian's rabbitmq-server package)"
    if os.geteuid() != 0:
        return "needs root, to give the nodes' files to the rabbitmq user"
    try:
        import pwd

        pwd.getpwnam("rabbitmq")
    except KeyError:
        return "needs the rabbitmq user that rabbitmq-server runs as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Node:
    name: str  # short name; the node is <name>@localhost
    port: int
    dist_port: int
    home: Path

    @property
    def node(self) -> str:
        return f"{self.name}@localhost"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}
        env.update(
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_CONFIG_FILE=str(self.home / "rabbitmq"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.home / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(self.home / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.home / "log"),
            RABBITMQ_FEATURE_FLAGS_FILE=str(self.home / "feature_flags"),
            RABBITMQ_PID_FILE=str(self.home / "pid"),
        )
        return env

    def pid(self) -> int | None:
        try:
            return int((self.home / "pid").read_text().strip())
        except (OSError, ValueError):
            return None


class RabbitCluster:
    def __init__(self, base: Path, count: int = NODES) -> None:
        token = secrets.token_hex(3)
        self.base = base
        self.nodes = [
            Node(f"hj{token}n{i}", _free_port(), _free_port(), base / f"n{i}")
            for i in range(1, count + 1)
        ]
        self.started: list[Node] = []

    @property
    def amqp_url(self) -> str:
        """Every node's URL, comma-separated: the multi-node form of AMQP_URL."""
        return ",".join(n.url for n in self.nodes)

    def ctl(self, node: Node, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(
            ["rabbitmqctl", "-q", "-n", node.node, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=node.env(),
        )
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {node.node}: {done.stderr}")
        return done.stdout

    def _prepare(self, node: Node) -> None:
        node.home.mkdir(parents=True)
        (node.home / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{node.port}\n"
            "loopback_users = none\n"
            # A test node on a shared machine: no disk alarm for a busy /tmp.
            "disk_free_limit.absolute = 50MB\n"
        )
        (node.home / "enabled_plugins").write_text("[].\n")
        subprocess.run(["chown", "-R", "rabbitmq:rabbitmq", str(node.home)], check=True)

    def boot(self, node: Node) -> None:
        """Start one node (again, after a kill: it rejoins from its own data)."""
        self._launch(node)
        self._await_startup(node)

    def _launch(self, node: Node) -> None:
        subprocess.run(
            ["rabbitmq-server", "-detached"],
            env=node.env(),
            check=True,
            capture_output=True,
            timeout=60,
        )
        if node not in self.started:
            self.started.append(node)

    def _await_startup(self, node: Node) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        while True:
            try:
                self.ctl(node, "await_startup", timeout=30)
                return
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{node.node} did not start:\n{self.log_tail(node)}"
                    ) from exc
                time.sleep(0.5)

    def start(self) -> None:
        self.base.mkdir(exist_ok=True)
        subprocess.run(["chown", "rabbitmq:rabbitmq", str(self.base)], check=True)
        for node in self.nodes:  # booting side by side: a node takes seconds alone
            self._prepare(node)
            self._launch(node)
        for node in self.nodes:
            self._await_startup(node)
        first = self.nodes[0]
        for node in self.nodes[1:]:
            self.ctl(node, "stop_app")
            self.ctl(node, "join_cluster", first.node)
            self.ctl(node, "start_app")
        self.wait_running({n.node for n in self.nodes})

    def running_nodes(self, asking: Node | None = None) -> set[str]:
        for node in [asking] if asking else self.alive():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                status = json.loads(self.ctl(node, "cluster_status", "--formatter", "json"))
                return set(status.get("running_nodes", []))
        return set()

    def wait_running(self, wanted: set[str], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while (running := self.running_nodes()) != wanted:
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster runs {running}, wanted {wanted}")
            time.sleep(0.5)

    def alive(self) -> list[Node]:
        return [n for n in self.nodes if _pid_alive(n.pid())]

    def connections_by_node(self) -> Counter[str]:
        """Client connections per node (its short name), as the cluster sees them."""
        by_port = {n.port: n.name for n in self.nodes}
        for node in self.alive():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                # RabbitMQ 3.10 lists no node per connection: the port the client
                # connected to says which node took it.
                out = self.ctl(node, "list_connections", "port", "--formatter", "json")
                return Counter(by_port[int(c["port"])] for c in json.loads(out or "[]"))
        return Counter()

    def by_name(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name.split("@")[0])

    def kill(self, node: Node) -> None:
        """kill -9 the node's Erlang VM: no goodbye to clients or peers."""
        pid = node.pid()
        assert pid is not None, f"no pid file for {node.node}"
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def log_tail(self, node: Node, lines: int = 40) -> str:
        logs = sorted((node.home / "log").glob("*.log"))
        text = "\n".join(p.read_text(errors="replace") for p in logs)
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop every node this cluster started; kill any that will not stop."""
        for node in reversed(self.started):
            pid = node.pid()
            if not _pid_alive(pid):
                continue
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.ctl(node, "stop", timeout=60)
            if pid is not None and _pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _pid_alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie the init process has not reaped yet counts as gone.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


@contextlib.contextmanager
def rabbitmq_cluster(count: int = NODES) -> Iterator[RabbitCluster]:
    reason = unavailable()
    if reason:
        pytest.skip(f"a RabbitMQ cluster {reason}")
    base = Path(tempfile.mkdtemp(prefix="hj-rmq-"))
    cluster = RabbitCluster(base, count)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
