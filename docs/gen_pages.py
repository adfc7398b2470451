"""The reference pages written from the code at build time (mkdocs-gen-files runs this).

- reference/cli.md: every command, its usage and its options, as --help shows them;
- reference/configuration.md: every default of ``hybrid_jobs.defaults``, its value,
  the flag or environment variable that changes it, and its docstring;
- reference/http.md: the HTTP API from the OpenAPI document ``jobctl serve`` serves;
- design/sql.md: every statement as PostgreSQL receives it (docs/design/queries.sql);
- changelog.md: CHANGELOG.md.

Nothing here is kept by hand, so none of it can fall behind the code.
"""

from __future__ import annotations

import ast
import dataclasses
import html
import inspect
import json
import tempfile
from pathlib import Path
from typing import Any

import click
import mkdocs_gen_files

from hybrid_jobs import defaults
from hybrid_jobs.consumers.cli import main as consumer_command
from hybrid_jobs.consumers.settings import ConsumerSettings
from hybrid_jobs.jobctl.api.app import create_app
from hybrid_jobs.jobctl.api.settings import ApiSettings
from hybrid_jobs.jobctl.cli import main as jobctl_command
from hybrid_jobs.jobctl.commands.serve import serve as serve_command
from hybrid_jobs.jobctl.metrics import CollectorSettings
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.relay.cli import main as relay_command
from hybrid_jobs.relay.settings import RelaySettings

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = ROOT / "hybrid_jobs" / "defaults.py"

# The settings object and the command whose flags set the defaults of each prefix.
SETTINGS: dict[str, tuple[type[Any], str, click.Command]] = {
    "RELAY": (RelaySettings, "relay", relay_command),
    "CONSUMER": (ConsumerSettings, "consumer", consumer_command),
    "SERVE": (ApiSettings, "jobctl serve", serve_command),
    "METRICS": (CollectorSettings, "jobctl serve", serve_command),
}
# Flags that set the defaults of no settings object, by the default's name.
OTHER_FLAGS: dict[str, tuple[str, click.Command, str]] = {
    "AMQP_PREFIX": ("relay, consumer", relay_command, "amqp_prefix"),
    "AMQP_QUEUE_TYPE": ("relay, consumer", relay_command, "queue_type"),
    "LOG_LEVEL": ("relay, consumer, jobctl serve", relay_command, "log_level"),
    "DATABASE_URL": ("relay, consumer, jobctl", relay_command, "database_url"),
    "AMQP_URL": ("relay, consumer, jobctl serve", relay_command, "amqp_url"),
    "SERVE_PORT": ("jobctl serve", serve_command, "port"),
}
# Set for one job or one handler, by an argument.
ARGUMENTS: dict[str, str] = {
    "MAX_ATTEMPTS": "`enqueue(max_attempts=)`, `@handler(max_attempts=)`",
    "KEY_LIMIT": "`enqueue(key_limit=)`",
}
# Set through the environment alone.
ENVIRONMENT: dict[str, str] = {
    "DATABASE_POOLER": "$DATABASE_POOLER",
    "SCHEMA": "$HYBRID_JOBS_SCHEMA",
    "MAX_PAYLOAD_BYTES": "$MAX_PAYLOAD_BYTES",
    "STRICT_JOB_TYPES": "$STRICT_JOB_TYPES",
}


@dataclasses.dataclass
class Entry:
    name: str
    doc: str
    section: str


def entries() -> list[Entry]:
    """The defaults in their module's order, with their docstrings and sections."""
    source = DEFAULTS.read_text()
    tree = ast.parse(source)
    sections: dict[int, str] = {}
    for number, line in enumerate(source.splitlines(), 1):
        if line.startswith("# ---"):
            sections[number] = line.strip("# -").strip()
    found: list[Entry] = []
    body = tree.body
    for i, node in enumerate(body):
        if not isinstance(node, ast.AnnAssign | ast.Assign):
            continue
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
        if not isinstance(target, ast.Name):
            continue
        following = body[i + 1] if i + 1 < len(body) else None
        doc = ""
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            doc = str(following.value.value)
        section = sections[max(n for n in sections if n < node.lineno)]
        found.append(Entry(target.id, " ".join(doc.split()), section))
    return found


def _option(command: click.Command, name: str) -> click.Option | None:
    for param in command.params:
        if isinstance(param, click.Option) and param.name == name:
            return param
    return None


def _flag_text(program: str, option: click.Option) -> str:
    text = f"`{option.opts[0]}` ({program})"
    if option.envvar:
        text += f", `${option.envvar}`"
    return text


def _fields(settings: type[Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(settings)}


def set_with(name: str) -> str:
    """How a user changes the default ``name``: a flag, a variable, or an argument."""
    if name in OTHER_FLAGS:
        program, command, param = OTHER_FLAGS[name]
        option = _option(command, param)
        assert option is not None, name
        text = _flag_text(program, option)
        if param.endswith("_url"):
            text += f", `${name}`, `${name}_FILE`"
        return text
    if name in ARGUMENTS:
        return ARGUMENTS[name]
    if name in ENVIRONMENT:
        return f"`{ENVIRONMENT[name]}`"
    prefix, _, field = name.partition("_")
    if prefix in SETTINGS and field.lower() in _fields(SETTINGS[prefix][0]):
        settings, program, command = SETTINGS[prefix]
        field = field.lower()
        for candidate in (field, f"{prefix.lower()}_{field}", field.removeprefix("bind_")):
            option = _option(command, candidate)
            if option is not None:
                return _flag_text(program, option)
        return f"no flag: `{settings.__name__}.{field}`"
    return "fixed"


def _value(value: object) -> str:
    if isinstance(value, float) and value >= 3600 and value % 3600 == 0:
        hours = value / 3600
        return f"`{value:g}` ({hours / 24:g} days)" if hours % 24 == 0 else f"`{value:g}`"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10_000:
        return f"`{value:_}`".replace("_", ",")
    return f"`{value!r}`"


def configuration_page() -> str:
    lines = [
        "# Configuration",
        "",
        "Every default of hybrid-jobs, generated from `hybrid_jobs/defaults.py`, the one",
        "module that holds them: the settings objects, the flags, the SQL and this page",
        "all read it. *Set with* names the flag and environment variable that change a",
        "default; *fixed* marks a bound the code relies on, shown so you know it, and *no",
        "flag* a setting only code that builds the settings object itself can change.",
        "Durations are in seconds.",
        "",
        "The daemons take their connections from the environment (`DATABASE_URL`,",
        "`AMQP_URL`, or `DATABASE_URL_FILE` and `AMQP_URL_FILE`, which name a file",
        "holding the URL, for container secrets); every flag of every command is in",
        "the [command-line reference](cli.md).",
    ]
    section = ""
    for entry in entries():
        if entry.section != section:
            section = entry.section
            title = section if section.startswith("jobctl") else section.capitalize()
            lines += ["", f"## {title}", ""]
            lines += ["| Default | Value | Set with | Meaning |", "|---|---|---|---|"]
        value = _value(getattr(defaults, entry.name))
        doc = entry.doc.replace("|", "\\|")
        lines.append(f"| `{entry.name}` | {value} | {set_with(entry.name)} | {doc} |")
    return "\n".join(lines) + "\n"


def openapi_document() -> dict[str, Any]:
    settings = ApiSettings(
        database=DatabaseUrl.parse("postgresql://127.0.0.1/docs"),
        amqp=AmqpUrl.parse("amqp://127.0.0.1/"),
        metrics=False,
    )
    return create_app(settings).openapi()


def http_page(document_path: Path) -> str:
    document = openapi_document()
    return "\n".join(
        [
            "# HTTP API",
            "",
            "`jobctl serve` serves this API under `/v1`, with its OpenAPI document at",
            "`/openapi.json`. This page is generated from that document",
            f"(OpenAPI {document['openapi']}).",
            "Changes need the token (`Authorization: Bearer $JOBCTL_API_TOKEN`); errors",
            "are `application/problem+json`. The [operate guide](../guides/operate.md)",
            "shows it at work.",
            "",
            f"[OAD({document_path})]",
            "",
        ]
    )


def sql_page() -> str:
    sql = (ROOT / "docs" / "design" / "queries.sql").read_text()
    return "\n".join(
        [
            "# The SQL as it runs",
            "",
            "Every statement of `hybrid_jobs.schema.queries` as PostgreSQL receives it, its",
            "fragments expanded, under its name, with who runs it and what for. Each state",
            "change is one conditional `UPDATE` carrying its fence; the",
            "[state machine](state-machine.md) says which statement makes each edge.",
            "The file is [queries.sql](queries.sql), regenerated by",
            "`python -m hybrid_jobs.schema.docs` (the test suite fails when it is stale).",
            "",
            "```sql",
            sql.rstrip("\n"),
            "```",
            "",
        ]
    )


def _commands(
    command: click.Command, path: list[str], parent: click.Context | None
) -> list[tuple[click.Context, click.Command]]:
    """``command`` and, for a group, each of its subcommands, depth first."""
    ctx = click.Context(command, info_name=path[-1], parent=parent)
    found = [(ctx, command)]
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                found += _commands(sub, [*path, name], ctx)
    return found


def _cell(text: str) -> str:
    """Text for a table cell: on one line, its markup characters as entities."""
    return html.escape(" ".join(text.split())).replace("|", "&#124;")


def cli_page() -> str:
    """Every command and subcommand with its usage and options, as click itself
    renders them in --help (defaults and environment variables included)."""
    lines = [
        "# Command line",
        "",
        "Three commands are installed: `relay` and `consumer`, the two daemons, and",
        "`jobctl`, the operator's tool. This page is generated from their definitions,",
        "so it says what `--help` says for the installed release: every flag, its",
        "default and the environment variable that sets it. What each default means is",
        "in the [configuration reference](configuration.md).",
    ]
    programs = [
        ("relay", relay_command),
        ("consumer", consumer_command),
        ("jobctl", jobctl_command),
    ]
    for program, root in programs:
        for ctx, command in _commands(root, [program], None):
            depth = "##" if ctx.parent is None else "###"
            lines += ["", f"{depth} `{ctx.command_path}`", ""]
            if command.help:
                lines += [inspect.cleandoc(command.help).split("\f")[0], ""]
            lines += [
                "```",
                " ".join(command.collect_usage_pieces(ctx)).join([f"{ctx.command_path} ", ""]),
                "```",
            ]
            records = [p.get_help_record(ctx) for p in command.get_params(ctx) if p.name != "help"]
            options = [r for r in records if r is not None]
            if options:
                lines += ["", "| Option | Description |", "|---|---|"]
                lines += [f"| <code>{_cell(f)}</code> | {_cell(t)} |" for f, t in options]
    return "\n".join(lines) + "\n"


def write_pages() -> None:
    with mkdocs_gen_files.open("reference/cli.md", "w") as page:
        page.write(cli_page())
    with mkdocs_gen_files.open("reference/configuration.md", "w") as page:
        page.write(configuration_page())
    # The OpenAPI plugin reads the document from disk when it renders the page.
    document_path = Path(tempfile.mkdtemp(prefix="hybrid-jobs-docs-")) / "openapi.json"
    document_path.write_text(json.dumps(openapi_document(), indent=1))
    with mkdocs_gen_files.open("reference/http.md", "w") as page:
        page.write(http_page(document_path))
    with mkdocs_gen_files.open("design/sql.md", "w") as page:
        page.write(sql_page())
    with mkdocs_gen_files.open("changelog.md", "w") as page:
        page.write((ROOT / "CHANGELOG.md").read_text())


# mkdocs-gen-files runs this file with runpy; the tests import it.
if __name__ in ("__main__", "<run_path>"):
    write_pages()
