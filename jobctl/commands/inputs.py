"""``jobctl inputs``: what may be shown of a stored input (never its content), and
its redaction."""

from __future__ import annotations

import uuid
from typing import Any

import click

from hybrid_jobs.jobctl.commands.common import by_option, database_option, read, write
from hybrid_jobs.jobctl.output import Failure, emit, json_option, when
from hybrid_jobs.jobctl.service import Invalid, get_input, jsonable, parse_input_id, redact_input
from hybrid_jobs.jobctl.service.models import InputView


@click.group()
def inputs() -> None:
    """Stored inputs (enqueue(..., payload_ref=)): look at one, redact one."""


def _text(view: InputView) -> str:
    state = (
        f"REDACTED at {when(view.redacted_at)} by {view.redacted_by}: {view.redaction_reason}"
        if view.redacted_at is not None
        else "stored"
    )
    return "\n".join(
        [
            f"input      {view.input_id}",
            f"status     {state}",
            f"size       {view.size_bytes} bytes",
            f"sensitive  {'yes' if view.sensitive else 'no'}",
            f"stored at  {when(view.created_at)}",
            f"jobs       {view.jobs} ({view.unfinished} not finished)",
        ]
    )


def _parsed(value: str) -> uuid.UUID:
    try:
        return parse_input_id(value)
    except Invalid as exc:
        raise Failure(str(exc), 2) from None


def _document(view: InputView) -> dict[str, Any]:
    document = jsonable(view)
    assert isinstance(document, dict)
    return document


@inputs.command()
@click.argument("input_id", metavar="ID")
@database_option
@json_option
def show(input_id: str, database_url: str | None) -> None:
    """A stored input: its size, whether it is sensitive or redacted, how many jobs
    run on it. Never its content. Exits 1 for an unknown id."""
    ident = _parsed(input_id)
    view = read(database_url, lambda session: get_input(session, ident))
    emit(_document(view), _text(view))


@inputs.command()
@click.argument("input_id", metavar="ID")
@click.option("--reason", required=True, metavar="TEXT", help="Why, as recorded.")
@by_option("Who redacts it, as recorded.")
@database_option
@json_option
def redact(input_id: str, reason: str, by: str, database_url: str | None) -> None:
    """Erase a stored input's content for good (an erasure request): the jobs
    naming it and their history stay as they were; a job that has not started on
    it fails with INPUT_REDACTED. Redacting it again changes nothing. Exits 1 for
    an unknown id."""
    ident = _parsed(input_id)
    view = write(database_url, lambda session: redact_input(session, ident, reason=reason, by=by))
    emit(_document(view), _text(view))
