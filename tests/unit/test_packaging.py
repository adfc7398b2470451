"""The files a user runs before any code: compose.yaml, the Dockerfile, the console
scripts. Docker cannot run here, so compose.yaml is checked by reading it (and by
`docker compose config` / `docker-compose config` where a client is installed)."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


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
        if name in ("postgres", "rabbitmq", "migrate") or "profiles" in service:
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
    assert api["environment"]["JOBCTL_API_TOKEN"], "without a token it would be read-only"
    assert "/readyz" in " ".join(api["healthcheck"]["test"])


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
