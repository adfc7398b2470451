"""``jobctl webhooks``: the calls owed to completion webhooks, and how each went."""

from __future__ import annotations

import uuid

import click

from hybrid_jobs.jobctl.commands.common import database_option, read, write
from hybrid_jobs.jobctl.output import Failure, emit, json_option, table, when
from hybrid_jobs.jobctl.service import jsonable, list_webhook_calls, retry_webhook_call
from hybrid_jobs.jobctl.service.models import WebhookCallView


@click.group()
def webhooks() -> None:
    """Completion webhooks: the calls owed when jobs end, delivered, pending or
    given up, and a second chance for one given up."""


def _rows(calls: list[WebhookCallView]) -> str:
    return table(
        ["CALL", "JOB", "STATE", "ATTEMPTS", "LAST", "NEXT / DONE", "ENDPOINT"],
        [
            [
                c.delivery_id,
                c.job_id,
                c.state,
                c.attempts,
                c.last_error or (c.last_status if c.last_status is not None else "-"),
                when(c.next_attempt_at if c.state == "PENDING" else c.delivered_at or c.gave_up_at),
                c.endpoint,
            ]
            for c in calls
        ],
    )


@webhooks.command("list")
@click.option(
    "--state",
    type=click.Choice(["PENDING", "DELIVERED", "GAVE_UP"], case_sensitive=False),
    help="Only calls in this state.",
)
@click.option("--job", "job_id", type=click.UUID, help="Only the calls about this job.")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@database_option
@json_option
def list_calls(
    state: str | None, job_id: uuid.UUID | None, limit: int, database_url: str | None
) -> None:
    """The newest calls first: where each goes, its state, the calls made, what the
    last one got (an HTTP status, or what went wrong) and when the next is due."""
    found = read(
        database_url,
        lambda session: list_webhook_calls(session, state=state, job_id=job_id, limit=limit),
    )
    emit({"webhooks": jsonable(found)}, _rows(found) if found else "no webhook calls")


@webhooks.command()
@click.argument("delivery_id", metavar="CALL", type=int)
@database_option
@json_option
def retry(delivery_id: int, database_url: str | None) -> None:
    """Make a call that was given up (GAVE_UP) due again now, its attempts counted
    afresh. Exits 1 for an unknown call, 2 for one not given up."""
    if delivery_id < 1:
        raise Failure("CALL is a webhook call's number, from `jobctl webhooks list`", 2)
    view = write(database_url, lambda session: retry_webhook_call(session, delivery_id))
    emit({"webhook": jsonable(view)}, _rows([view]))
