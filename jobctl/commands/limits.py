"""``jobctl limits``: the rate limits with their buckets, the concurrency limits of
job types and of queues with their running and waiting jobs, and the jobs that
expired before they started; and an operator's change to a queue's limit."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.commands.common import by_option, database_option, run
from hybrid_jobs.jobctl.metrics.queries import METRICS_JOBS_EXPIRED
from hybrid_jobs.jobctl.output import emit, json_option, table, when
from hybrid_jobs.jobctl.service import Database, Invalid
from hybrid_jobs.jobctl.service.sql import fetch_all
from hybrid_jobs.schema import names


def _limits_table(found: list[outbox.RateLimit]) -> str:
    rows = [
        [
            r.name,
            f"{r.rate:g}/{r.per_seconds:g}s",
            f"{r.burst:g}",
            f"{r.tokens:.2f}" if not r.name.endswith(":*") else "-",
            f"{r.next_token_in_seconds:.2f}s" if not r.name.endswith(":*") else "-",
            when(r.refilled_at) if r.refilled_at is not None else "-",
            str(r.buckets),
        ]
        for r in found
    ]
    headers = ["RATE LIMIT", "RATE", "BURST", "TOKENS", "NEXT TOKEN", "LAST TAKEN", "BUCKETS"]
    return table(headers, rows)


def _concurrency_table(found: list[outbox.ConcurrencyLimit]) -> str:
    rows = [
        [c.job_type, str(c.global_limit), str(c.running), str(c.waiting), c.updated_by]
        for c in found
    ]
    headers = ["JOB TYPE", "GLOBAL LIMIT", "RUNNING", "WAITING", "RECORDED BY"]
    return table(headers, rows)


def _queue_table(found: list[outbox.QueueLimit]) -> str:
    rows = [[c.queue, str(c.limit), str(c.running), str(c.waiting), c.updated_by] for c in found]
    headers = ["QUEUE", "QUEUE LIMIT", "RUNNING", "WAITING", "RECORDED BY"]
    return table(headers, rows)


def _queue_limit(given: str) -> tuple[str, int]:
    queue, sep, number = given.rpartition("=")
    if not sep or not number.isdigit():
        raise Invalid(f"--set-queue {given}: expected QUEUE=N", "set_queue")
    return queue, int(number)


def _queue_changes(
    set_queue: tuple[str, ...], remove_queue: tuple[str, ...]
) -> list[tuple[str, int | None]]:
    """The queues' limits to set (N) and remove (None), sorted by queue."""
    changes: dict[str, int | None] = {}
    try:
        for given in set_queue:
            queue, n = _queue_limit(given)
            changes[names.queue(queue)] = n
        removed = {names.queue(queue) for queue in remove_queue}
    except ValueError as exc:
        raise Invalid(str(exc), "set_queue") from None
    both = sorted(removed & changes.keys())
    if both:
        raise Invalid(f"--set-queue and --remove-queue both name {', '.join(both)}", "set_queue")
    changes.update(dict.fromkeys(removed))
    return sorted(changes.items())


@click.command()
@click.option(
    "--set-queue",
    "set_queue",
    multiple=True,
    metavar="QUEUE=N",
    help="Give QUEUE a concurrency limit of N leases across every consumer (repeatable); "
    "a consumer started later with its own --queue-limit for it writes over it.",
)
@click.option(
    "--remove-queue",
    "remove_queue",
    multiple=True,
    metavar="QUEUE",
    help="Remove QUEUE's concurrency limit (repeatable): the jobs waiting for it are woken.",
)
@by_option("Who changes a queue's limit, as the limit will say.")
@database_option
@json_option
def limits(
    set_queue: tuple[str, ...], remove_queue: tuple[str, ...], by: str, database_url: str | None
) -> None:
    """Rate limits: each one's rate, burst, the tokens its bucket holds now and
    when the next is due (a 'prefix:*' limit: how many names have a bucket); the
    concurrency limits of job types (a handler's global_limit) and of queues
    (consumer --queue-limit, or --set-queue here), with the jobs of each running and
    waiting for it; and, per queue, the jobs that expired (code EXPIRED) before
    they started, as long as retention keeps them."""

    async def action(
        db: Database,
    ) -> tuple[
        list[outbox.RateLimit],
        list[outbox.ConcurrencyLimit],
        list[outbox.QueueLimit],
        list[tuple[Any, ...]],
    ]:
        if set_queue or remove_queue:
            changes = _queue_changes(set_queue, remove_queue)
            async with db.writing() as session:
                try:
                    # In queue order, whatever order they were typed in: claims and
                    # ends of leases lock the queues' rows in that order, and a
                    # change taking them in another could deadlock with them.
                    for queue, n in changes:
                        if n is None:
                            await outbox.remove_queue_limit_async(session, queue)
                        else:
                            await outbox.set_queue_limit_async(session, queue, n, by=by)
                except ValueError as exc:
                    raise Invalid(str(exc), "set_queue") from None
        async with db.reading() as session:
            found = await outbox.rate_limits_async(session)
            concurrency = await outbox.concurrency_limits_async(session)
            queues = await outbox.queue_limits_async(session)
            expired = await fetch_all(session, METRICS_JOBS_EXPIRED)
            return found, concurrency, queues, expired

    found, concurrency, queues, expired = run(database_url, action)
    text = _limits_table(found) if found else "no rate limits"
    if concurrency:
        text += "\n\n" + _concurrency_table(concurrency)
    if queues:
        text += "\n\n" + _queue_table(queues)
    if expired:
        text += "\n\n" + table(["QUEUE", "EXPIRED"], [[q, str(n)] for q, n in sorted(expired)])
    document = {
        "rate_limits": [
            {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in d.items()}
            | {"next_token_in_seconds": r.next_token_in_seconds}
            for r in found
            for d in [dataclasses.asdict(r)]
        ],
        "concurrency_limits": [
            {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in d.items()}
            for c in concurrency
            for d in [dataclasses.asdict(c)]
        ],
        "queue_limits": [
            {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in d.items()}
            for c in queues
            for d in [dataclasses.asdict(c)]
        ],
        "expired": {q: int(n) for q, n in expired},
    }
    emit(document, text)
