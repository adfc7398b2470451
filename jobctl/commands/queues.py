"""``jobctl queues``: pause and resume a queue."""

from __future__ import annotations

from collections.abc import Callable

import click

from hybrid_jobs.jobctl.commands.common import F, by_option, database_option, run, write
from hybrid_jobs.jobctl.output import emit, json_option, when
from hybrid_jobs.jobctl.service import (
    Database,
    Invalid,
    NotFound,
    jsonable,
    pause_queue,
    resume_queue,
)
from hybrid_jobs.jobctl.service.models import QueueState


@click.group()
def queues() -> None:
    """Pause and resume queues (`jobctl stats` shows them)."""


def _by(action: str) -> Callable[[F], F]:
    return by_option(f"Who is {action} it, as the queue will say.")


@queues.command()
@click.argument("queue")
@_by("pausing")
@click.option(
    "--create",
    is_flag=True,
    help="Pause a queue nothing uses yet (no job, consumer or schedule), ahead of its "
    "first job. Without it, such a name is refused: it is most often a typo.",
)
@database_option
@json_option
def pause(queue: str, by: str, create: bool, database_url: str | None) -> None:
    """Stop starting QUEUE's jobs until it is resumed: none is woken or claimed;
    running ones finish. Enqueueing into it goes on as usual."""

    async def action(db: Database) -> QueueState:
        async with db.writing() as session:
            try:
                return await pause_queue(session, queue, by=by, create=create)
            except NotFound as exc:
                # A name to fix (or --create to give): a usage error, exit 2.
                raise Invalid(str(exc).replace("with create (", "("), "queue") from None

    found = run(database_url, action)
    already = "" if found.changed else " already"
    emit(
        jsonable(found),
        f"{found.queue}:{already} paused since {when(found.paused_at)} by {found.paused_by}",
    )


@queues.command()
@click.argument("queue")
@_by("resuming")
@database_option
@json_option
def resume(queue: str, by: str, database_url: str | None) -> None:
    """Start QUEUE's jobs again; its waiting ones are woken at once."""
    found = write(database_url, lambda session: resume_queue(session, queue, by=by))
    emit(
        jsonable(found),
        f"{found.queue}: resumed by {found.resumed_by}"
        if found.changed
        else f"{found.queue}: not paused",
    )
