"""The wheel installs one package, ``hybrid_jobs``, and it works beside the names a
service already has: PyPI's ``schema`` installed in the same environment, and a
project of its own with top-level ``schema.py``, ``consumers.py`` and ``relay.py``.

The wheel is built from this checkout and installed into a new virtualenv (its
dependencies come from this one's, so the test needs no network); the project then
creates and migrates its database, runs ``relay`` and ``consumer --app`` from that
virtualenv, and a job goes end to end.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.processes import ROOT
from tests.support.services import ADMIN_URL, AMQP_URL
from tests.support.source import source_copy

pytestmark = pytest.mark.usefixtures("rabbitmq_up")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # With the venv's setuptools (the test extra's): a build environment of its own
    # would ask the package index mid-run, and once that failed the build. From a
    # copy of the source: another test builds from the checkout meanwhile.
    source = source_copy(tmp_path_factory.mktemp("source"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = out.glob("hybrid_jobs-*.whl")
    return found


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"hybrid_jobs"}
    # Every module of the six parts, the migrations' template, the dashboard's files,
    # and the marker that says the package is typed.
    for part in ("schema", "outbox", "relay", "consumers", "plumbing", "jobctl"):
        modules = {str(p.relative_to(ROOT)) for p in (ROOT / part).rglob("*.py")}
        assert modules <= {n.removeprefix("hybrid_jobs/") for n in names}, part
    assert "hybrid_jobs/schema/migrations/script.py.mako" in names
    assert "hybrid_jobs/jobctl/dashboard/templates/base.html" in names
    assert "hybrid_jobs/py.typed" in names
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")] or [None]
    if top_level is not None:
        assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["hybrid_jobs"]


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv holding the wheel and PyPI's ``schema``, its other
    dependencies read from this environment's site-packages."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(root), "platbase": str(root)}))
    # Paths a .pth adds are not site directories: this environment's editable
    # install of the checkout (a .pth of its own there) is not carried over.
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(site)
    _copy_distribution("schema", site)
    scripts = {"relay": "relay.cli", "consumer": "consumers.cli", "jobctl": "jobctl.cli"}
    for script, module in scripts.items():
        path = root / "bin" / script
        path.write_text(
            f"#!{root / 'bin' / 'python'}\n"
            f"import sys\nfrom hybrid_jobs.{module} import main\nsys.exit(main())\n"
        )
        path.chmod(0o755)
    return root


def _copy_distribution(name: str, site: Path) -> None:
    """Install an installed distribution's files into ``site`` as pip placed them."""
    dist = importlib.metadata.distribution(name)
    for file in dist.files or []:
        source = Path(str(dist.locate_file(file)))
        if source.is_file() and ".." not in file.parts:
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's service whose own modules have the names the old layout installed."""
    (tmp_path / "schema.py").write_text("USER_SCHEMA = 'the service owns this module'\n")
    (tmp_path / "consumers.py").write_text("CHANNELS = 'a Django Channels consumer'\n")
    (tmp_path / "relay.py").write_text("RELAY = 'the service owns this module too'\n")
    (tmp_path / "tasks.py").write_text(
        textwrap.dedent(
            """
            import consumers as channels
            import relay
            import schema

            from hybrid_jobs import consumers

            assert schema.USER_SCHEMA and channels.CHANNELS and relay.RELAY


            @consumers.handler("shout", queue="wheel")
            def shout(job):
                return {"shouted": job.payload["word"].upper(), "module": schema.__name__}
            """
        )
    )
    (tmp_path / "produce.py").write_text(
        textwrap.dedent(
            """
            import os
            import sys

            from sqlalchemy import create_engine
            from sqlalchemy.orm import Session

            import schema
            from hybrid_jobs import outbox

            assert schema.USER_SCHEMA
            engine = create_engine(sys.argv[1])
            with Session(engine) as session, session.begin():
                job_id = outbox.enqueue(session, "shout", {"word": "hello"}, queue="wheel")
            done = outbox.wait_for(engine, job_id, timeout=60)
            print(done.state, done.result["shouted"], done.result["module"])
            """
        )
    )
    return tmp_path


@pytest.fixture
def database() -> Iterator[DatabaseUrl]:
    """A name no database has yet: `jobctl migrate --create-database` makes it."""
    name = f"hj_wheel_{uuid.uuid4().hex[:12]}"
    yield DatabaseUrl.parse(f"{ADMIN_URL.rsplit('/', 1)[0]}/{name}")
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_pypi_schema_is_untouched_beside_the_wheel(venv: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import schema, hybrid_jobs.schema.tables as t, hybrid_jobs\n"
            "schema.Schema(int).validate(1)\n"
            "print(schema.__file__); print(t.__file__); print(hybrid_jobs.__version__)",
        ],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    pypi_schema, ours, version = done.stdout.split()
    # PyPI's schema, from the new virtualenv: the wheel put nothing of that name there.
    assert Path(pypi_schema).is_relative_to(venv) and Path(pypi_schema).parent.name == "schema"
    assert Path(ours).is_relative_to(venv) and "hybrid_jobs" in Path(ours).parts
    assert version == importlib.metadata.version("hybrid-jobs")


def test_a_project_with_its_own_schema_consumers_and_relay_runs_a_job(
    venv: Path, project: Path, database: DatabaseUrl, topology: Topology
) -> None:
    env = {
        **_clean_env(),
        "DATABASE_URL": database.conninfo,
        "AMQP_URL": AmqpUrl.parse(AMQP_URL).url,
        "AMQP_PREFIX": topology.prefix,
        "PYTHONUNBUFFERED": "1",
    }
    bin_ = venv / "bin"
    migrated = subprocess.run(
        [str(bin_ / "jobctl"), "migrate", "--create-database"],
        cwd=project, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert migrated.returncode == 0, migrated.stderr
    assert (
        migrated.stdout.splitlines()[0] == f"created database {database.conninfo.rsplit('/')[-1]}"
    )
    logs = project / "logs"
    logs.mkdir()
    daemons = [
        subprocess.Popen(
            [str(bin_ / name), *args],
            cwd=project,
            env=env,
            stdout=(logs / f"{name}.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        for name, args in (("relay", []), ("consumer", ["--app", "tasks"]))
    ]
    try:
        produced = subprocess.run(
            [str(bin_ / "python"), "produce.py", database.sqlalchemy],
            cwd=project, env=env, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert produced.returncode == 0, produced.stderr + _logs(logs)
        assert produced.stdout.split() == ["SUCCEEDED", "HELLO", "schema"]
    finally:
        for daemon in daemons:
            daemon.terminate()
        deadline = time.monotonic() + 40
        for daemon in daemons:
            try:
                daemon.wait(max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(10)
    assert [d.returncode for d in daemons] == [0, 0], _logs(logs)
    # Every module the daemons loaded of ours came from the wheel, none from the
    # project's own files of the same names.
    assert '"event": "consumer.started"' in (logs / "consumer.log").read_text()


def _clean_env() -> dict[str, str]:
    """This environment without what would point a child at the checkout."""
    drop = ("PYTHONPATH", "PYTEST_", "VIRTUAL_ENV", "DATABASE_URL", "AMQP_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def _logs(folder: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(folder.iterdir()))
