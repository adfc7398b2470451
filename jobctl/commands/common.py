"""What the service commands share: the --database-url option, and running an
action of the service layer with every expected failure said in one line."""

from __future__ import annotations

import getpass
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
import psycopg.errors
import sqlalchemy.exc
from sqlalchemy.ext.asyncio import AsyncSession

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.output import Failure, warned
from hybrid_jobs.jobctl.service import Database, Invalid, ServiceError, parse_job_id
from hybrid_jobs.jobctl.service.database import LOCK_TIMEOUT_MS, STATEMENT_TIMEOUT_MS
from hybrid_jobs.plumbing.cli import event_loop_runner
from hybrid_jobs.plumbing.config import ConfigError, DatabaseUrl, database_url

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def database_option(fn: F) -> F:
    option = click.option(
        "--database-url",
        metavar="URL",
        help="PostgreSQL URL. Default: $DATABASE_URL, or the file named by $DATABASE_URL_FILE, "
        "or postgresql://127.0.0.1:5432/jobs.",
    )
    return option(fn)


def by_option(help: str) -> Callable[[F], F]:
    """``--by NAME``: who acts, as the change records it; by default the user."""
    return click.option(
        "--by",
        metavar="NAME",
        default=lambda: f"{getpass.getuser()} (jobctl)",
        show_default="your user name (jobctl)",
        help=help,
    )


def limit_option(default: int, most: int, help: str) -> Callable[[F], F]:
    """``--limit N``: how many rows a command shows or touches, from 1 to ``most``."""
    return click.option(
        "--limit", type=click.IntRange(1, most), default=default, show_default=True, help=help
    )


def database(flag: str | None, command: str) -> DatabaseUrl:
    return warned(database_url(flag), command)


def run(flag: str | None, action: Callable[[Database], Awaitable[T]]) -> T:
    """Run ``action`` with a database of one connection at a time, then close it.

    The service's refusals, an outage and an unmigrated database become a
    ``Failure`` (or a ``ConfigError`` for a setting to fix): one line, no traceback.
    """
    ctx = click.get_current_context()
    url = database(flag, ctx.command_path)
    db = Database(url, "jobctl", pooled=False)

    async def main() -> T:
        try:
            return await action(db)
        finally:
            await db.dispose()

    result: list[T] = []

    async def keep() -> None:
        result.append(await main())

    try:
        event_loop_runner()(keep())
    except Invalid as exc:
        raise Failure(str(exc), 2) from None
    except (ServiceError, outbox.Backpressure) as exc:
        raise Failure(str(exc)) from None
    except sqlalchemy.exc.DBAPIError as exc:
        raise _database_failure(exc, url) from None
    return result[0]


def read(flag: str | None, look: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """``run`` of one reading transaction: ``look`` with its session."""

    async def action(db: Database) -> T:
        async with db.reading() as session:
            return await look(session)

    return run(flag, action)


def write(flag: str | None, change: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """``run`` of one writing transaction: ``change`` with its session, committed
    when it returns."""

    async def action(db: Database) -> T:
        async with db.writing() as session:
            return await change(session)

    return run(flag, action)


def _database_failure(exc: sqlalchemy.exc.DBAPIError, url: DatabaseUrl) -> Exception:
    return database_failure(exc.orig or exc, url, invalidated=exc.connection_invalidated)


def database_failure(
    cause: BaseException, url: DatabaseUrl, *, invalidated: bool = False
) -> Exception:
    """What a failed statement or connection means, as one line: a setting to fix
    (ConfigError), or a Failure that names what happened. A statement that ran past
    its time, or waited too long for a lock, reached the database: it is said as such,
    not as an outage."""
    # Imported on a failure only: it brings RabbitMQ's client, which no command needs.
    from hybrid_jobs.plumbing import diagnose

    if isinstance(cause, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn):
        return ConfigError(
            f'{url.setting}: database "{url.dbname}" is not migrated to this release: '
            "run `jobctl migrate`"
        )
    if isinstance(cause, psycopg.errors.LockNotAvailable):
        return Failure(
            f"PostgreSQL: a row or table this needs stayed locked by another session for"
            f" longer than jobctl waits ({LOCK_TIMEOUT_MS // 1000} s lock_timeout); try again,"
            " or see pg_stat_activity for the session holding it"
        )
    if isinstance(cause, psycopg.errors.QueryCanceled):
        return Failure(
            f"PostgreSQL cancelled the statement: it ran past jobctl's"
            f" {STATEMENT_TIMEOUT_MS // 1000} s statement_timeout, or an administrator"
            " cancelled it (pg_cancel_backend); try again when the database is less busy"
        )
    if invalidated or isinstance(cause, psycopg.OperationalError):
        found = diagnose.postgres(cause, url)
        if found.fatal:
            return ConfigError(f"{url.setting}: {found.reason}")
        hint = f"; {found.hint}" if found.hint else ""
        return Failure(f"cannot reach PostgreSQL at {url.address}: {found.reason}{hint}")
    return Failure(f"PostgreSQL: {diagnose.first_line(cause)}")


def parse_ids(values: tuple[str, ...]) -> list[uuid.UUID]:
    """Job ids from the command line; a malformed one is a usage error, before
    anything is done."""
    ids = []
    for value in values:
        job_id = parse_job_id(value)
        if job_id is None:
            raise Failure(f"{value!r} is not a job id (a UUID)", 2)
        ids.append(job_id)
    return ids
