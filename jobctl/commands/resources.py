"""``jobctl resources``: the exclusive resources held now (uncertain ones first),
and resolving one that a vanished holder left uncertain."""

from __future__ import annotations

from typing import Any

import click

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.commands.common import (
    by_option,
    database_option,
    parse_ids,
    read,
    write,
)
from hybrid_jobs.jobctl.output import Failure, emit, json_option, table, when


@click.group()
def resources() -> None:
    """Exclusive resources (enqueue(..., resource=)): list the held ones, resolve an
    uncertain one."""


def _document(hold: outbox.ResourceHold) -> dict[str, Any]:
    return {
        "resource": hold.resource,
        "job_id": str(hold.job_id),
        "job_state": hold.state,
        "job_type": hold.job_type,
        "lease_generation": hold.lease_generation,
        "held_since": hold.held_since.isoformat(),
        "uncertain_since": None
        if hold.uncertain_since is None
        else hold.uncertain_since.isoformat(),
        "waiting": hold.waiting,
    }


@resources.command("list")
@database_option
@json_option
def list_(database_url: str | None) -> None:
    """The resources held now: by which job, since when, how many jobs wait for
    each; UNCERTAIN ones (their holder's lease expired: nothing of them starts
    until resolved) first, oldest first. JOB STATE "deleted": retention deleted the
    holder, and its hold stays until resolved."""
    found = read(database_url, outbox.resource_holds_async)
    rows = [
        [
            h.resource,
            f"UNCERTAIN since {when(h.uncertain_since)}" if h.uncertain_since else "held",
            str(h.job_id),
            h.state or "deleted",
            when(h.held_since),
            str(h.waiting),
        ]
        for h in found
    ]
    headers = ["RESOURCE", "STATUS", "JOB", "JOB STATE", "HELD SINCE", "WAITING"]
    text = table(headers, rows) if rows else "no resource is held"
    emit({"resources": [_document(h) for h in found]}, text)


@resources.command()
@click.argument("resource", metavar="RESOURCE")
@by_option("Who resolves it, as recorded.")
@click.option("--outcome", metavar="TEXT", help="What was found at the target, as recorded.")
@click.option(
    "--job",
    "job_id",
    metavar="ID",
    help="The holder you saw (resources list): resolve its hold only, never a later one's.",
)
@click.option(
    "--generation",
    type=click.IntRange(min=0),
    metavar="N",
    help="With --job: that lease of it only (resources list --json: lease_generation).",
)
@database_option
@json_option
def resolve(
    resource: str,
    by: str,
    outcome: str | None,
    job_id: str | None,
    generation: int | None,
    database_url: str | None,
) -> None:
    """Free a resource an expired lease left UNCERTAIN, once you have looked at the
    target: its next waiting job is woken. Exits 1, changing nothing, if it is free
    or held by a live lease, or, with --job, if it is another holder's now (yours
    was resolved meanwhile: look again). Without --job it frees the uncertain hold
    as it is now, and says whose it was."""
    if generation is not None and job_id is None:
        raise Failure("--generation names a lease of the --job: give --job too", 2)
    holder = None if job_id is None else parse_ids((job_id,))[0]

    async def change(session: Any) -> outbox.Resolved:
        try:
            return await outbox.resolve_resource_async(
                session,
                resource,
                by=by,
                outcome=outcome,
                job_id=holder,
                lease_generation=generation,
            )
        except outbox.NotUncertain as exc:
            raise Failure(str(exc), 1) from None

    done = write(database_url, change)
    document = {
        "resource": done.resource,
        "job_id": str(done.job_id),
        "lease_generation": done.lease_generation,
        "uncertain_since": done.uncertain_since.isoformat(),
        "resolved_by": by,
    }
    emit(document, f"{done.resource}: resolved (left uncertain by job {done.job_id})")
