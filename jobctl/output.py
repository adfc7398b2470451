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
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import click

from hybrid_jobs.jobctl.service.models import JobSummary, JobView
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl, password_in_flag
from hybrid_jobs.schema.states import DelayReason, JobState
from hybrid_jobs.schema.tables import APPROVAL_HOLD

U = TypeVar("U", DatabaseUrl, AmqpUrl)

_JSON = "jobctl.json"


class Failure(Exception):
    """An expected failure a command reports in one line. The message is safe to print
    (no password)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


_COMMAND = "jobctl.command"


def _remember(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    # meta is shared by the whole context chain: the group reads it to report errors,
    # naming the command that failed ("jobctl jobs show").
    ctx.meta[_JSON] = value
    ctx.meta[_COMMAND] = ctx.command_path
    return value


json_option: Callable[[Callable[..., Any]], Callable[..., Any]] = click.option(
    "--json",
    "as_json",
    is_flag=True,
    is_eager=True,  # known before the other options are checked, for their errors too
    callback=_remember,
    expose_value=False,  # emit() reads it from the context, not the command
    help='Print one JSON object (errors too, as {"error": ...}) instead of text.',
)


def wants_json(ctx: click.Context) -> bool:
    return bool(ctx.meta.get(_JSON))


def command_path(ctx: click.Context, default: str) -> str:
    """The full name of the command that ran, once it got as far as its options."""
    return str(ctx.meta.get(_COMMAND) or default)


# What must not reach a terminal raw: C0 controls (ESC starts the sequences that
# move the cursor, retitle the window or rewrite the screen; CR overwrites a line),
# DEL and C1 controls (0x9b is a one-byte ESC [), the bidirectional overrides that
# make text read in another order than it is, and lone surrogates, which cannot be
# encoded at all. Job data (error messages, job types, payloads) comes from anyone
# who can enqueue or raise.
_UNSAFE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_UNSAFE_BUT_NEWLINE: Final = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object) -> str:
    """``value`` as text that cannot act on a terminal: every control character (a
    newline too) written as its escape, \\x1b, \\u202e."""
    return _UNSAFE.sub(_escape, str(value))


def printable_lines(text: str) -> str:
    """Like :func:`printable`, keeping the newlines: for text made of lines."""
    return _UNSAFE_BUT_NEWLINE.sub(_escape, text)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Rows as aligned columns under their headers, for people; every cell escaped
    (:func:`printable`)."""
    cells = [[str(h) for h in headers]] + [
        ["" if v is None else printable(v) for v in r] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def when(value: datetime | None) -> str:
    """A timestamp for people: UTC, to the second."""
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def duration(seconds: float | None) -> str:
    """1h02m, 3m05s, 4.2s."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours < 48 else f"{hours // 24}d{hours % 24:02d}h"


def emit(result: dict[str, Any], text: str) -> None:
    """The command's result: ``text`` for people (control characters escaped, lines
    kept), or ``result`` as one JSON line (JSON escapes them itself)."""
    if wants_json(click.get_current_context()):
        click.echo(json.dumps(result, default=str, sort_keys=True))
    elif text:
        click.echo(printable_lines(text))


def say(text: str) -> None:
    """A line of progress for people; nothing with --json (one object only)."""
    if not wants_json(click.get_current_context()):
        click.echo(printable_lines(text))


def warn(command: str, text: str) -> None:
    """A warning on stderr, in both modes (stdout stays one JSON object)."""
    click.echo(f"{command}: warning: {printable(text)}", err=True)


def warned(url: U, command: str) -> U:
    """``url``, after a warning if it came from a flag with a password in it."""
    warning = password_in_flag(url)
    if warning:
        warn(command, warning)
    return url


def report_error(ctx: click.Context, command: str, message: str) -> None:
    if wants_json(ctx):
        click.echo(json.dumps({"command": command, "error": message}))
    else:
        click.echo(f"{command}: {printable(message)}", err=True)


# What a job's row means for people, worded the same by the CLI and the dashboard.

# run_after of a job held for its approval or its parents (the SQL literal's
# timestamp): never due until released, so no "in 2912103d03h".
HOLD: Final = datetime.fromisoformat(APPROVAL_HOLD.split("'")[1])
# The states whose last error is the job's own now: it failed, waits to retry after
# it, or was cancelled (EXPIRED, REJECTED, a parent's failure say why). In any other
# state the job has moved past it (succeeded after a retry or a replay, runs again):
# it is an earlier attempt's error, history.
ERROR_IS_CURRENT: Final = frozenset({JobState.FAILED, JobState.RETRY_WAIT, JobState.CANCELLED})


def held_for(job: JobSummary) -> str | None:
    """What a held job waits for ("approval", "its parents"), or None when it is
    not held. A list's summary does not say whether approval is needed too."""
    if job.done or job.run_after < HOLD:
        return None
    parents = job.delay_reason == DelayReason.DEPENDENCY
    approval = (
        isinstance(job, JobView) and job.approval is not None and job.approval.status == "REQUIRED"
    )
    if parents and approval:
        return "its parents, then approval"
    return "its parents" if parents else "approval"


def attempts(job: JobSummary) -> str:
    """Attempts made of the budget, for a list: "2/5"; a job never claimed has no
    budget yet (the handler's applies at its first claim), so just "0", not "0/?"."""
    return str(job.attempt) if job.max_attempts is None else f"{job.attempt}/{job.max_attempts}"


def budget(job: JobSummary) -> str:
    """The attempt budget in words, for a job's own page."""
    return "the handler's budget" if job.max_attempts is None else str(job.max_attempts)


def error_is_current(job: JobSummary) -> bool:
    """Whether the job's last error is what it is about now (see ERROR_IS_CURRENT)."""
    return job.state in ERROR_IS_CURRENT
