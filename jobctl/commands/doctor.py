"""``jobctl doctor``: what is wrong with this installation, and what to do."""

from __future__ import annotations

import logging
import textwrap
from typing import Any

import click

from hybrid_jobs import defaults
from hybrid_jobs.jobctl.commands.common import database
from hybrid_jobs.jobctl.doctor import Finding, Level, Plan, counts, examine, exit_code, verdict
from hybrid_jobs.jobctl.output import emit, json_option, printable, warned
from hybrid_jobs.plumbing import config
from hybrid_jobs.plumbing.cli import connection_options, event_loop_runner, topology
from hybrid_jobs.plumbing.logfmt import setup_logging

WIDTH = 100
LABEL = {
    Level.OK: "ok",
    Level.NOTE: "note",
    Level.WARNING: "WARNING",
    Level.PROBLEM: "PROBLEM",
}


@click.command()
@connection_options
@click.option(
    "--consumers",
    type=click.IntRange(0),
    metavar="N",
    help="Consumer processes to count against max_connections. Default: the live ones the "
    "workers table holds, each with its own concurrency.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1),
    metavar="N",
    help=f"The --concurrency of each of --consumers. [default: {defaults.CONSUMER_CONCURRENCY}]",
)
@click.option(
    "--relays",
    type=click.IntRange(0),
    metavar="N",
    help="Relays to count against max_connections. Default: the live ones the relays table holds.",
)
@click.option("--strict", is_flag=True, help="Exit 1 on a warning too, not only on a problem.")
@json_option
def doctor(
    database_url: str | None,
    amqp_url: str | None,
    amqp_prefix: str,
    queue_type: str,
    log_level: str,
    consumers: int | None,
    concurrency: int | None,
    relays: int | None,
    strict: bool,
) -> None:
    """Check this installation and say what is wrong with it, and what to do about each
    thing: the schema against this release, PostgreSQL's settings, connections and clock,
    the relays and consumers, the jobs nobody can run, RabbitMQ's exchanges and queues.

    Each finding is ok, a note (nothing to do), a warning (works, but slower or with
    less margin than it should) or a problem (jobs wait, or a promise is at risk).
    Exits 1 on a problem, or with --strict on a warning; 0 otherwise. Reads only: it
    changes nothing. Run it with the environment of the relays and consumers
    (DATABASE_URL, AMQP_URL, AMQP_PREFIX, AMQP_QUEUE_TYPE).
    """
    setup_logging(log_level)
    # alembic's comparison announces each of its plugins at INFO: not news here.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.getLogger().level))
    ctx = click.get_current_context()
    db = database(database_url, ctx.command_path)
    amqp = warned(config.amqp_url(amqp_url), ctx.command_path)
    plan = Plan(db, amqp, topology(amqp_prefix, queue_type), consumers, relays, concurrency)
    found: list[Finding] = []

    async def run() -> None:
        found.extend(await examine(plan))

    event_loop_runner()(run())
    code = exit_code(found, strict=strict)
    result: dict[str, Any] = {
        "database": db.redacted(),
        "amqp": amqp.redacted(),
        "strict": strict,
        "exit_code": code,
        "counts": counts(found),
        "findings": [f.as_dict() for f in found],
    }
    emit(result, "\n".join([*(_text(f) for f in found), verdict(found, strict=strict)]))
    ctx.exit(code)


def _text(finding: Finding) -> str:
    """A finding for people: its level and title on a line, then its detail and
    what to do, indented under the title."""
    head = f"{LABEL[finding.level]:<8} {finding.check:<10} "
    lines = [head + printable(finding.title)]
    if finding.level is not Level.OK:
        indent = " " * len(head)
        for text in (finding.detail, f"fix: {finding.fix}" if finding.fix else ""):
            if text:
                lines += textwrap.wrap(
                    printable(text),
                    WIDTH,
                    initial_indent=indent,
                    subsequent_indent=indent + ("     " if text.startswith("fix: ") else ""),
                    break_on_hyphens=False,
                    break_long_words=False,
                )
    return "\n".join(lines)
