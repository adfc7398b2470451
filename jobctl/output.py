"""What every ``jobctl`` command shares: ``--json``, and errors in one line.

A command takes ``@json_option``, prints its result with ``emit`` (text for people,
one JSON object with ``--json``), and reports an expected failure by raising
``Failure`` (or ``plumbing.config.ConfigError`` for a setting to fix). The group
turns either into one line (``jobctl migrate: ...`` on stderr, or ``{"error": ...}``
on stdout with ``--json``) and a non-zero exit: 2 for a setting or usage to fix, 1
otherwise. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

_JSON = "jobctl.json"


class Failure(Exception):
    """An expected failure a command reports in one line. The message is safe to print
    (no password)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _remember(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    # meta is shared by the whole context chain: the group reads it to report errors.
    ctx.meta[_JSON] = value
    return value


json_option: Callable[[Callable[..., Any]], Callable[..., Any]] = click.option(
    "--json",
    "as_json",
    is_flag=True,
    is_eager=True,  # known before the other options are checked, for their errors too
    callback=_remember,
    help='Print one JSON object (errors too, as {"error": ...}) instead of text.',
)


def wants_json(ctx: click.Context) -> bool:
    return bool(ctx.meta.get(_JSON))


def emit(result: dict[str, Any], text: str) -> None:
    """The command's result: ``text`` for people, or ``result`` as one JSON line."""
    if wants_json(click.get_current_context()):
        click.echo(json.dumps(result, default=str, sort_keys=True))
    elif text:
        click.echo(text)


def say(text: str) -> None:
    """A line of progress for people; nothing with --json (one object only)."""
    if not wants_json(click.get_current_context()):
        click.echo(text)


def warn(command: str, text: str) -> None:
    """A warning on stderr, in both modes (stdout stays one JSON object)."""
    click.echo(f"{command}: warning: {text}", err=True)


def report_error(ctx: click.Context, command: str, message: str) -> None:
    if wants_json(ctx):
        click.echo(json.dumps({"command": command, "error": message}))
    else:
        click.echo(f"{command}: {message}", err=True)
