"""`jobctl migrate`: migrating a database from the installed package, from any
directory, saying what it did; errors in one line, --json on request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema.revisions import scripts
from tests.support import processes
from tests.support.processes import BIN, ROOT
from tests.support.services import ADMIN_URL
from tests.support.source import source_copy

# The migrations this release ships, base first: the tests follow them as they grow.
REVISIONS = list(reversed(list(scripts().walk_revisions())))
HEAD = REVISIONS[-1].revision
HEAD_STEPS = [f"upgrade {r.down_revision or 'base'} -> {r.revision}: {r.doc}" for r in REVISIONS]


def jobctl(
    *args: str, url: DatabaseUrl | str, cwd: Path, executable: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """`jobctl ...` with DATABASE_URL set, from ``cwd`` (never the checkout)."""
    assert Path(cwd).resolve() != ROOT
    return processes.jobctl(*args, url=url, cwd=cwd, executable=executable, **env)


def tables(url: DatabaseUrl) -> set[str]:
    with psycopg.connect(url.conninfo) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r[0] for r in rows}


def test_migrate_an_empty_database_then_again(empty_db_url: DatabaseUrl, tmp_path: Path) -> None:
    first = jobctl("migrate", url=empty_db_url, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        *HEAD_STEPS,
        f"{empty_db_url.redacted()} (schema public) is at {HEAD} (head)",
    ]
    assert {"jobs", "job_attempts", "outbox", "job_effects"} <= tables(empty_db_url)

    again = jobctl("migrate", url=empty_db_url, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"already at head ({HEAD})"

    as_json = jobctl("migrate", "--json", url=empty_db_url, cwd=tmp_path)
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout) == {
        "database": empty_db_url.redacted(),
        "schema": "public",
        "created": False,
        "dry_run": False,
        "from": HEAD,
        "to": HEAD,
        "head": HEAD,
        "steps": [],
    }


def test_json_lists_the_steps_it_ran(empty_db_url: DatabaseUrl, tmp_path: Path) -> None:
    done = jobctl("migrate", "--json", url=empty_db_url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # the whole of stdout: one object, no step lines
    assert (result["from"], result["to"]) == (None, HEAD)
    assert [(s["source"], s["target"]) for s in result["steps"]] == [
        (r.down_revision or "base", r.revision) for r in REVISIONS
    ]


def test_dry_run_and_to_a_revision(empty_db_url: DatabaseUrl, tmp_path: Path) -> None:
    dry = jobctl("migrate", "--dry-run", url=empty_db_url, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        *(f"would {s}" for s in HEAD_STEPS),
        "(dry run: nothing changed)",
    ]
    assert tables(empty_db_url) == set(), "a dry run changes nothing"

    partway = jobctl("migrate", "--to", "0001", url=empty_db_url, cwd=tmp_path)
    assert partway.stdout.splitlines()[0] == HEAD_STEPS[0]
    rest = jobctl("migrate", url=empty_db_url, cwd=tmp_path)
    assert rest.stdout.splitlines()[0] == HEAD_STEPS[1]

    back = jobctl("migrate", "--to", "0001", url=empty_db_url, cwd=tmp_path)
    assert back.returncode == 1
    assert back.stderr.strip() == (
        f"jobctl migrate: the database is at {HEAD}, past --to 0001: jobctl migrate only "
        "upgrades (use `alembic downgrade` from a checkout to go back)"
    )
    unknown = jobctl("migrate", "--to", "9999", "--json", url=empty_db_url, cwd=tmp_path)
    assert unknown.returncode == 2
    assert json.loads(unknown.stdout) == {
        "command": "jobctl migrate",
        "error": "--to 9999: no such revision (this release has "
        + ", ".join(r.revision for r in REVISIONS)
        + ")",
    }


def test_two_at_once_take_turns(empty_db_url: DatabaseUrl, tmp_path: Path) -> None:
    """Two deployments migrating the same database at the same moment: one migrates,
    the other waits for its lock and finds nothing to do."""
    env = {**os.environ, "DATABASE_URL": empty_db_url.conninfo}
    procs = [
        subprocess.Popen(
            [str(BIN / "jobctl"), "migrate", "--json"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert sorted(len(r["steps"]) for r in results) == [0, len(REVISIONS)]
    assert all(r["to"] == HEAD for r in results)


@pytest.mark.parametrize("as_json", [False, True])
def test_errors_are_one_line(as_json: bool, tmp_path: Path) -> None:
    flags = ["--json"] if as_json else []
    missing = jobctl(
        "migrate", *flags, url="postgresql://root:pg-hunter2@127.0.0.1:5432/hj_nope", cwd=tmp_path
    )
    assert missing.returncode == 2
    message = (
        'DATABASE_URL: database "hj_nope" does not exist '
        "(create it with `jobctl migrate --create-database`)"
    )
    if as_json:
        assert json.loads(missing.stdout) == {"command": "jobctl migrate", "error": message}
    else:
        assert missing.stderr.splitlines() == [f"jobctl migrate: {message}"]
    assert "hunter2" not in missing.stdout + missing.stderr

    down = jobctl("migrate", *flags, url="postgresql://127.0.0.1:1/jobs", cwd=tmp_path)
    assert down.returncode == 1
    text = down.stdout if as_json else down.stderr
    assert "cannot reach PostgreSQL at 127.0.0.1:1: connection refused" in text
    assert len(text.strip().splitlines()) == 1

    malformed = jobctl("migrate", *flags, url="mysql://u:hunter2@h/db", cwd=tmp_path)
    assert malformed.returncode == 2
    assert "DATABASE_URL must be a postgresql:// URL" in malformed.stdout + malformed.stderr
    assert "hunter2" not in malformed.stdout + malformed.stderr


def test_create_database_creates_a_missing_one_then_migrates(tmp_path: Path) -> None:
    """The first step of the docs: `jobctl migrate --create-database` on a server
    without the database creates it, migrates it, and is a no-op the second time."""
    name = f"hj_create_{uuid.uuid4().hex[:12]}"
    url = DatabaseUrl.parse(f"{ADMIN_URL.rsplit('/', 1)[0]}/{name}")
    try:
        first = jobctl("migrate", "--create-database", url=url, cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        assert first.stdout.splitlines() == [
            f"created database {name}",
            *HEAD_STEPS,
            f"{url.redacted()} (schema public) is at {HEAD} (head)",
        ]
        assert {"jobs", "outbox"} <= tables(url)
        again = jobctl("migrate", "--create-database", "--json", url=url, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["created"] is False
        assert json.loads(again.stdout)["steps"] == []
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_password_in_the_flag_is_warned_about(empty_db_url: DatabaseUrl, tmp_path: Path) -> None:
    # Trust authentication ignores the password.
    with_password = empty_db_url.conninfo.replace("127.0.0.1", "root:pg-hunter2@127.0.0.1")
    done = jobctl(
        "migrate", "--json", "--database-url", with_password, url="postgresql://x/unused",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["to"] == HEAD, "stdout stays one JSON object"
    assert done.stderr.splitlines() == [
        "jobctl migrate: warning: --database-url holds a password, which anyone on this "
        "machine can read with `ps`; set DATABASE_URL or DATABASE_URL_FILE instead"
    ]
    assert "hunter2" not in done.stdout + done.stderr


def test_installed_package_migrates_without_a_checkout(
    empty_db_url: DatabaseUrl, tmp_path: Path
) -> None:
    """`pip install` the project (no editable install, no checkout on the path), then
    run its `jobctl migrate` from a directory with no alembic.ini: the migrations must
    come from the installed package."""
    target = tmp_path / "site"
    # From a copy of the source (another test builds from the checkout meanwhile),
    # with the venv's setuptools (a build environment would ask the package index).
    source = source_copy(tmp_path)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    assert (target / "hybrid_jobs" / "schema" / "migrations" / "script.py.mako").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The installed copy comes first on the path; the checkout's editable finder is
    # only asked after it.
    done = jobctl(
        "migrate", url=empty_db_url, cwd=elsewhere, executable=target / "bin" / "jobctl",
        PYTHONPATH=str(target),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[: len(HEAD_STEPS)] == HEAD_STEPS
    where = subprocess.run(
        [sys.executable, "-c", "import hybrid_jobs.schema.revisions as r; print(r.MIGRATIONS)"],
        cwd=elsewhere,
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(target)


def test_alembic_from_the_checkout_says_what_it_did(empty_db_url: DatabaseUrl) -> None:
    """DESIGN.md's promise, `alembic upgrade head` from the repository root, still
    works, and now logs its steps and where the database ends."""
    env = {**os.environ, "DATABASE_URL": empty_db_url.conninfo}
    alembic = [sys.executable, "-m", "alembic", "upgrade", "head"]
    first = subprocess.run(alembic, cwd=ROOT, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "Running upgrade  -> 0001" in first.stderr
    assert "Running upgrade 0001 -> 0002" in first.stderr
    again = subprocess.run(alembic, cwd=ROOT, env=env, capture_output=True, text=True)
    assert "Running upgrade" not in again.stderr
    assert f"Database is at revision {HEAD}" in again.stderr


def test_check_reports_the_promises_and_fails_on_a_violation(
    db_url: DatabaseUrl, tmp_path: Path
) -> None:
    fine = jobctl("check", "--json", url=db_url, cwd=tmp_path)
    assert fine.returncode == 0, fine.stderr
    report = json.loads(fine.stdout)
    assert report["lost"] == 0 and report["completed_twice"] == 0
    with psycopg.connect(db_url.conninfo, autocommit=True) as conn:
        conn.execute("INSERT INTO jobs (job_id, job_type) VALUES (gen_random_uuid(), 't')")
    broken = jobctl("check", url=db_url, cwd=tmp_path)
    assert broken.returncode == 1
    assert broken.stderr.strip() == "jobctl check: 1 promise(s) broken: lost"


def test_a_postgres_older_than_the_sql_needs_is_refused_in_one_line(
    empty_db_url: DatabaseUrl, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This server is new enough: the check passes it. Asked for a version no server
    # has yet, the same check (the real server's answer) refuses it, naming both.
    from sqlalchemy import create_engine

    from hybrid_jobs.jobctl.commands import migrate as command
    from hybrid_jobs.jobctl.output import Failure

    engine = create_engine(empty_db_url.sqlalchemy)
    try:
        with command._connect(engine, empty_db_url) as conn:
            assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
        monkeypatch.setattr(command, "OLDEST_POSTGRES", 990000)
        with pytest.raises(Failure) as refused, command._connect(engine, empty_db_url):
            pass
    finally:
        engine.dispose()
    (line,) = str(refused.value).splitlines()
    assert "is too old: hybrid-jobs needs 99 or newer (15 or newer is tested)" in line
