"""``jobctl queues``: pause and resume a queue."""

from __future__ import annotations

import getpass

import click

from jobctl.commands.common import database_option, run
from jobctl.output import emit, json_option, when
from jobctl.service import Database, jsonable, pause_queue, resume_queue
from jobctl.service.models import QueueState


@click.group()
def queues() -> None:
    """Pause and resume queues (`jobctl stats` shows them)."""


@queues.command()
@click.argument("queue")
@click.option(
    "--by",
    metavar="NAME",
    default=lambda: f"{getpass.getuser()} (jobctl)",
    show_default="your user name (jobctl)",
    help="Who is pausing it, as the queue will say.",
)
@database_option
@json_option
def pause(queue: str, by: str, database_url: str | None, as_json: bool) -> None:
    """Stop starting QUEUE's jobs until it is resumed: none is woken or claimed;
    running ones finish. Enqueueing into it goes on as usual."""
    del as_json

    async def action(db: Database) -> QueueState:
        async with db.writing() as session:
            return await pause_queue(session, queue, by=by)

    found = run(database_url, action)
    already = "" if found.changed else " already"
    emit(
        jsonable(found),
        f"{found.queue}:{already} paused since {when(found.paused_at)} by {found.paused_by}",
    )


@queues.command()
@click.argument("queue")
@database_option
@json_option
def resume(queue: str, database_url: str | None, as_json: bool) -> None:
    """Start QUEUE's jobs again; its waiting ones are woken at once."""
    del as_json

    async def action(db: Database) -> QueueState:
        async with db.writing() as session:
            return await resume_queue(session, queue)

    found = run(database_url, action)
    emit(
        jsonable(found),
        f"{found.queue}: resumed" if found.changed else f"{found.queue}: not paused",
    )
