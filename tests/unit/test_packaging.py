"""The files a user runs before any code: compose.yaml, the Dockerfile, the console
scripts. Docker cannot run here, so compose.yaml is checked by reading it (and by
`docker compose config` / `docker-compose config` where a client is installed)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from hybrid_jobs.jobctl.api.tokens import checked

ROOT = Path(__file__).resolve().parents[2]
# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?message}, ${VAR?message}; $$ is a $.
_VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_]\w*)(?:(:?[-?])([^}]*))?\}")


def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def interpolated(value: str, environment: Mapping[str, str]) -> str:
    """A value of compose.yaml as `docker compose` reads it in ``environment``; a
    required variable that is missing raises ValueError, as it stops compose."""

    def one(found: re.Match[str]) -> str:
        if found.group(0) == "$$":
            return "$"
        name, operator, argument = found.groups()
        value = environment.get(name)
        if operator is None:
            return value or ""
        missing = not value if operator.startswith(":") else value is None
        if not missing:
            assert value is not None
            return value
        if operator.endswith("?"):
            raise ValueError(f"{name}: {argument}")
        return argument

    return _VARIABLE.sub(one, value)


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)


def test_compose_services_wait_for_what_they_need() -> None:
    services = compose()["services"]
    assert services["postgres"]["healthcheck"]
    assert services["rabbitmq"]["healthcheck"]
    assert any("15672" in str(p) for p in services["rabbitmq"]["ports"]), "management UI"
    # The demo's credentials are published: its services answer this machine only.
    for name in ("postgres", "rabbitmq", "api"):
        assert all(str(p).startswith("127.0.0.1:") for p in services[name]["ports"]), name
    assert "management" in services["rabbitmq"]["image"]
    assert services["migrate"]["command"] == ["jobctl", "migrate"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name, service in services.items():
        if name in ("postgres", "rabbitmq", "migrate", "api-token") or "profiles" in service:
            continue
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert service["depends_on"]["rabbitmq"]["condition"] == "service_healthy"
        env = service["environment"]
        assert env["DATABASE_URL"].startswith("postgresql://")
        assert "@postgres:5432/" in env["DATABASE_URL"]
        assert "@rabbitmq:5672/" in env["AMQP_URL"]


def test_compose_cluster_profile_runs_three_nodes_and_points_clients_at_all() -> None:
    services = compose()["services"]
    nodes = [f"rabbitmq-{i}" for i in (1, 2, 3)]
    for node in nodes:
        service = services[node]
        assert service["profiles"] == ["cluster"] and service["hostname"] == node
        assert service["healthcheck"]
        assert any("rabbitmq-cluster.conf" in v for v in service["volumes"])
    conf = (ROOT / "compose" / "rabbitmq-cluster.conf").read_text()
    assert all(f"= rabbit@{node}" in conf for node in nodes)
    for name in ("relay-cluster", "consumer-cluster"):
        service = services[name]
        assert service["profiles"] == ["cluster"]
        env = service["environment"]
        assert env["AMQP_QUEUE_TYPE"] == "quorum"
        assert [u.split("@")[1] for u in env["AMQP_URL"].split(",")] == [
            f"{node}:5672/" for node in nodes
        ]
        for node in nodes:
            assert service["depends_on"][node]["condition"] == "service_healthy"


def test_compose_serves_the_api_with_its_port_published() -> None:
    api = compose()["services"]["api"]
    command = api["command"]
    assert command[:2] == ["jobctl", "serve"]
    # Inside the container it listens on every interface, so the published port
    # reaches it; the host publishes it on its loopback only.
    host, port = command[command.index("--host") + 1], command[command.index("--port") + 1]
    assert host == "0.0.0.0"
    assert f"127.0.0.1:{port}:{port}" in [str(p) for p in api["ports"]]
    assert api["environment"]["JOBCTL_API_TOKEN_FILE"], "without a token it would be read-only"
    assert "/readyz" in " ".join(api["healthcheck"]["test"])


def test_compose_ships_no_token_and_makes_one_for_each_installation(tmp_path: Path) -> None:
    """`docker compose up` alone works, with a token of this installation's: none is
    written in the file, none has to be set first."""
    raw = (ROOT / "compose.yaml").read_text()
    services = compose()["services"]
    # Nothing is required before the first `docker compose up`...
    for value in strings(services):
        interpolated(value, {})
    # ...and no service gets a token from the file itself.
    for name, service in services.items():
        environment = service.get("environment") or {}
        assert not interpolated(str(environment.get("JOBCTL_API_TOKEN", "")), {}), name
    assert "demo-5Pq9Zr2Wn7Lx4Tk8Hc3Vb6Jm1Fs0Gd" not in raw
    # A token of one's own still wins (jobctl serve prefers JOBCTL_API_TOKEN).
    api, maker = services["api"], services["api-token"]
    mine = {"JOBCTL_API_TOKEN": "mine"}
    assert interpolated(api["environment"]["JOBCTL_API_TOKEN"], mine) == "mine"
    # jobctl serve reads the file api-token makes, from the volume both mount, once
    # it is made.
    path = PurePosixPath(interpolated(api["environment"]["JOBCTL_API_TOKEN_FILE"], {}))
    assert interpolated(maker["environment"]["JOBCTL_API_TOKEN_FILE"], {}) == str(path)
    mounts = {m.split(":")[0] for m in api["volumes"] if m.split(":")[1] == str(path.parent)}
    assert mounts and mounts == {
        m.split(":")[0] for m in maker["volumes"] if m.split(":")[1] == str(path.parent)
    }
    assert mounts <= set(compose()["volumes"]), "a named volume: it outlives the containers"
    assert api["depends_on"]["api-token"]["condition"] == "service_completed_successfully"
    # The image lets its user write there (a new volume takes the directory's owner).
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(rf"install -d -o app .*{re.escape(str(path.parent))}", dockerfile)
    # The command makes a strong token, private to its owner, once; and says where it
    # is, not what it is.
    assert maker["command"][:2] == ["python", "-c"]
    target = tmp_path / "api-token"

    def make() -> str:
        done = subprocess.run(
            [sys.executable, "-c", maker["command"][2]],
            env={**os.environ, "JOBCTL_API_TOKEN_FILE": str(target)},
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout

    said = make()
    token = target.read_text().strip()
    assert checked(token, "JOBCTL_API_TOKEN_FILE") == token
    assert target.stat().st_mode & 0o077 == 0
    assert token not in said and f"docker compose exec api cat {target}" in said
    assert token not in make() and target.read_text().strip() == token
    assert [p.name for p in tmp_path.iterdir()] == ["api-token"]


def test_compose_commands_are_console_scripts_we_ship() -> None:
    scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    scripts |= {"alembic", "python"}
    for name, service in compose()["services"].items():
        if "command" in service:
            assert service["command"][0] in scripts, f"{name} runs {service['command'][0]}"


def test_dockerfile_installs_the_project_and_drops_root() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "pip install" in text
    assert "\nUSER app" in text


@pytest.mark.parametrize("client", [["docker", "compose"], ["docker-compose"]])
def test_compose_file_parses(client: list[str]) -> None:
    if shutil.which(client[0]) is None:
        pytest.skip(f"{client[0]} is not installed")
    probe = subprocess.run([*client, "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"{' '.join(client)} is not available here")
    for profile in ([], ["--profile", "cluster"]):
        done = subprocess.run(
            [*client, *profile, "config", "-q"], cwd=ROOT, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr


def test_the_readme_reads_in_five_minutes() -> None:
    """At most 300 lines: what it is, the promises, a quick start, one producer and
    one handler, and links into the docs, where the rest is."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    for command in ("docker compose up", "./scripts/run", "./scripts/test"):
        assert command in readme
    assert "from hybrid_jobs import outbox" in readme
    assert "from hybrid_jobs import consumers" in readme
