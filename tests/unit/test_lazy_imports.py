"""What the processes import at start, and the stand-ins that keep it small: the
revision check without alembic, the table names without SQLAlchemy, the lazily
loaded parts of jobctl and `jobctl --help` without its commands. Each stand-in is
checked against what it stands in for. No services."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import click
import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory
from click.testing import CliRunner

from hybrid_jobs.jobctl import api, cli, metrics, service
from hybrid_jobs.schema import metadata, revisions, tables

# ------------------------------------------------------------------ revisions


def _alembics(script: ScriptDirectory) -> dict[str, tuple[str, ...]]:
    def follows(down: str | Sequence[str] | None) -> tuple[str, ...]:
        return () if down is None else (down,) if isinstance(down, str) else tuple(down)

    return {r.revision: follows(r.down_revision) for r in script.walk_revisions()}


def test_the_revision_graph_is_alembics() -> None:
    script = revisions.scripts()
    assert revisions.graph() == _alembics(script)
    assert revisions.head() == script.get_current_head()


def test_behind_is_a_known_revision_short_of_head() -> None:
    ids = list(revisions.graph())
    assert revisions.behind(ids[0])
    assert not revisions.behind(revisions.head())
    assert not revisions.behind("f00dfeedbeef")  # a newer release's: no reason to refuse


def _migration(folder: Path, name: str, revision: str, down: str) -> None:
    (folder / name).write_text(
        f'"""{name}"""\n\nimport sqlalchemy  # noqa: F401\n\n'
        f"revision: str = {revision}\ndown_revision: str | tuple[str, ...] | None = {down}\n"
        "branch_labels = None  # comment\n\n\ndef upgrade() -> None:\n"
        '    """\nrevision = "not this one"\n"""\n'
    )


def test_a_branched_and_merged_history_reads_as_alembic_reads_it(tmp_path: Path) -> None:
    versions = tmp_path / "versions"
    versions.mkdir()
    (versions / "__init__.py").write_text("")
    (versions / "README").write_text("revision = 'no'\n")
    _migration(versions, "a1_base.py", '"a1"', "None")
    _migration(versions, "b2_left.py", "'b2'", '"a1"')
    _migration(versions, "c3_right.py", '"c3"  # the other branch', "'a1'")
    _migration(versions, "d4_merge.py", '"d4"', '("b2", "c3")')
    _migration(versions, "e5_new_branch.py", '"e5"', '"a1"')
    (tmp_path / "script.py.mako").write_text("")
    cfg = Config()
    cfg.set_main_option("script_location", str(tmp_path))
    cfg.set_main_option("path_separator", "os")
    script = ScriptDirectory.from_config(cfg)
    read = revisions.read_graph(versions)
    assert read == _alembics(script)
    assert revisions.heads_of(read) == sorted(script.get_heads()) == ["d4", "e5"]


# ------------------------------------------------------------------ tables


def test_the_tables_module_gives_every_object_of_the_metadata() -> None:
    tree = ast.parse(Path(metadata.__file__).read_text())
    defined = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name) and not target.id.startswith("_")
    }
    assert defined == tables.FROM_METADATA
    for name in defined:
        assert getattr(tables, name) is getattr(metadata, name), name
    assert set(tables.__all__) - tables.FROM_METADATA <= set(vars(tables))
    assert set(dir(tables)) >= tables.FROM_METADATA
    with pytest.raises(AttributeError):
        _ = tables.no_such_table


# ------------------------------------------------------------------ lazy packages


@pytest.mark.parametrize("package", [service, metrics, api])
def test_each_lazily_exported_name_is_its_modules(package: ModuleType) -> None:
    modules: dict[str, str] = package._MODULES
    assert sorted(modules) == sorted(package.__all__)
    for name, module in modules.items():
        found = importlib.import_module(f"{package.__name__}.{module}")
        assert getattr(package, name) is getattr(found, name), name
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError):
        _ = package.no_such_name


# ------------------------------------------------------------------ jobctl --help


def _command(name: str) -> click.Command:
    module, _, attribute = cli.COMMANDS[name][0].partition(":")
    command = getattr(importlib.import_module(module), attribute)
    assert isinstance(command, click.Command)
    return command


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_each_summary_is_the_first_sentence_of_its_commands_help(name: str) -> None:
    command = _command(name)
    assert command.short_help is None and not command.hidden and not command.deprecated
    assert cli.COMMANDS[name][1] == command.get_short_help_str(limit=10_000)


@pytest.mark.parametrize("width", [50, 60, 64, 70, 78, 100, 200])
def test_the_commands_are_listed_as_click_lists_them(width: int) -> None:
    ctx = click.Context(cli.main, info_name="jobctl")
    ours, theirs = click.HelpFormatter(width=width), click.HelpFormatter(width=width)
    cli.main.format_commands(ctx, ours)
    click.Group.format_commands(cli.main, ctx, theirs)  # loads every command
    assert ours.getvalue() == theirs.getvalue()


def test_help_lists_every_command() -> None:
    done = CliRunner().invoke(cli.main, ["--help"], terminal_width=80)
    assert done.exit_code == 0, done.output
    listed = done.output.split("Commands:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed] == sorted(cli.COMMANDS)


# ------------------------------------------------------------------ what loads


def _imported(code: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def _tops(modules: set[str]) -> set[str]:
    return {m.partition(".")[0] for m in modules}


HEAVY = {"alembic", "sqlalchemy", "pydantic", "fastapi", "starlette", "uvicorn", "jinja2"}


@pytest.mark.parametrize("daemon", ["hybrid_jobs.consumers.cli", "hybrid_jobs.relay.cli"])
def test_a_daemon_starts_without_sqlalchemy_or_alembic(daemon: str) -> None:
    assert _tops(_imported(f"import {daemon}")) & HEAVY == set()


def test_jobctl_help_imports_no_command() -> None:
    found = _imported(
        "from hybrid_jobs.jobctl.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    )
    assert {m for m in found if m.startswith("hybrid_jobs.jobctl.commands.")} == set()
    assert _tops(found) & (HEAVY | {"prometheus_client", "aio_pika"}) == set()


def test_a_jobctl_command_imports_only_what_it_runs() -> None:
    # SQLAlchemy's async engine is what the service layer runs on; the rest is not.
    found = _tops(_imported("import hybrid_jobs.jobctl.cli, hybrid_jobs.jobctl.commands.workers"))
    assert "sqlalchemy" in found
    assert found & (HEAVY - {"sqlalchemy"} | {"prometheus_client", "aio_pika"}) == set()


def test_jobctl_serve_checks_its_settings_before_it_loads_the_web_framework() -> None:
    # A weak token or a missing setting is refused at start in a third of a second,
    # not after FastAPI, the routes and the dashboard have loaded.
    found = _imported("import hybrid_jobs.jobctl.cli, hybrid_jobs.jobctl.commands.serve")
    assert _tops(found) & {"fastapi", "jinja2"} == set()
    assert {"hybrid_jobs.jobctl.api.app", "hybrid_jobs.jobctl.dashboard"} & found == set()
