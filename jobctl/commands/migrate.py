"""``jobctl migrate``: bring a database's schema up to what this release needs.

Runs the migrations shipped inside the installed package (no checkout, no
alembic.ini), in one transaction under an advisory lock, so two deployments
migrating at once take turns and a failed step leaves the database as it was.
Upgrades only: a downgrade drops tables, and deserves the deliberate
``alembic downgrade`` from a checkout.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import click
import psycopg
import sqlalchemy.exc
from alembic import command
from alembic.migration import MigrationContext
from alembic.runtime.migration import MigrationInfo
from alembic.script import ScriptDirectory
from alembic.script.revision import Revision
from alembic.util.exc import CommandError
from sqlalchemy import Connection, Engine, create_engine, pool

from hybrid_jobs.jobctl.output import Failure, emit, json_option, say, warned
from hybrid_jobs.plumbing import createdb, diagnose
from hybrid_jobs.plumbing.config import DEFAULT_SCHEMA, ConfigError, DatabaseUrl, database_url
from hybrid_jobs.schema import revisions

NAME = "jobctl migrate"
_MISSING_DATABASE = re.compile(r'database "[^"]*" does not exist')


@dataclass(frozen=True)
class Step:
    direction: str
    source: str  # "base" for the first migration
    target: str
    description: str

    def __str__(self) -> str:
        return f"{self.direction} {self.source} -> {self.target}: {self.description}"


@click.command()
@click.option(
    "--database-url",
    metavar="URL",
    help="PostgreSQL URL. Default: $DATABASE_URL, or the file named by $DATABASE_URL_FILE, "
    "or postgresql://127.0.0.1:5432/jobs.",
)
@click.option(
    "--to",
    "target",
    default="head",
    show_default=True,
    metavar="REV",
    help="Revision to upgrade to (`--dry-run` lists the steps and their revisions).",
)
@click.option("--dry-run", is_flag=True, help="List the steps that would run; change nothing.")
@click.option(
    "--create-database",
    is_flag=True,
    help="Create the database the URL names first, if it does not exist (connecting to the "
    "server's `postgres` database, as createdb does).",
)
@json_option
def migrate(database_url: str | None, target: str, dry_run: bool, create_database: bool) -> None:
    """Create or upgrade the database's tables to this release's schema.

    Prints each step it runs and the revision the database ends at; with nothing to
    do, says so. Safe to run on every deploy, and from several places at once.
    """
    url = _database(database_url)
    schema = url.schema or DEFAULT_SCHEMA
    script = revisions.scripts()
    goal = _resolve(script, target)
    created = _create(url) if create_database and not dry_run else False
    engine = create_engine(
        url.sqlalchemy,
        poolclass=pool.NullPool,
        connect_args={"application_name": "jobctl-migrate", "connect_timeout": 10},
    )
    try:
        with _connect(engine, url) as conn, conn.begin() as transaction:
            # Held to the end of the transaction: a second `jobctl migrate` waits here,
            # then finds the work done.
            conn.exec_driver_sql(revisions.MIGRATION_LOCK, {"schema": schema})
            current = MigrationContext.configure(
                conn, opts={"version_table_schema": schema}
            ).get_current_revision()
            if current is None and not url.schema_given:
                _refuse_second_instance(conn, schema)
            plan = _plan(script, current, goal)
            if dry_run or not plan:
                transaction.rollback()
                ran: list[Step] = []
            else:
                ran = _upgrade(conn, url, script, goal, plan)
    finally:
        engine.dispose()
    head = script.get_current_head()
    final = current if dry_run or not plan else goal
    result: dict[str, Any] = {
        "database": url.redacted(),
        "schema": schema,
        "created": created,
        "from": current,
        "to": final,
        "head": head,
        "dry_run": dry_run,
        "steps": [asdict(s) for s in (plan if dry_run else ran)],
    }
    if not plan:
        where = f"head ({head})" if goal == head else goal
        emit(result, f"already at {where}")
    elif dry_run:
        emit(result, "\n".join([f"would {s}" for s in plan] + ["(dry run: nothing changed)"]))
    else:
        at_head = " (head)" if final == head else ""
        emit(result, f"{url.redacted()} (schema {schema}) is at {final}{at_head}")


def _database(flag: str | None) -> DatabaseUrl:
    return warned(database_url(flag), NAME)


def _create(url: DatabaseUrl) -> bool:
    try:
        created = createdb.create_database(url)
    except psycopg.Error as exc:
        found = diagnose.postgres(exc, url)
        if found.fatal:
            raise ConfigError(f"{url.setting}: {found.reason}") from None
        raise Failure(
            f"cannot create the database at {url.address}: {diagnose.first_line(exc)}"
        ) from None
    if created:
        say(f"created database {createdb.database_name(url)}")
    return created


def _resolve(script: ScriptDirectory, target: str) -> str:
    try:
        found = script.get_revision(target)
    except CommandError:
        found = None
    if not isinstance(found, Revision):
        known = ", ".join(reversed([r.revision for r in script.walk_revisions()]))
        raise Failure(f"--to {target}: no such revision (this release has {known})", 2)
    return found.revision


# The oldest PostgreSQL the SQL runs on (WITH ... AS MATERIALIZED came in 12), and
# the oldest this project is tested on.
OLDEST_POSTGRES = 120000
SUPPORTED_POSTGRES = 15


@contextmanager
def _connect(engine: Engine, url: DatabaseUrl) -> Iterator[Connection]:
    """``engine.connect()``, a failure said in one line: a setting to fix (exit 2),
    or a database that does not answer (exit 1)."""
    try:
        conn = engine.connect()
    except sqlalchemy.exc.DBAPIError as exc:
        found = diagnose.postgres(exc.orig or exc, url)
        if found.fatal and _MISSING_DATABASE.search(found.reason):
            raise ConfigError(
                f"{url.setting}: {found.reason} (create it with `jobctl migrate --create-database`)"
            ) from None
        if found.fatal:
            raise ConfigError(f"{url.setting}: {found.reason}") from None
        hint = f"; {found.hint}" if found.hint else ""
        raise Failure(f"cannot reach PostgreSQL at {url.address}: {found.reason}{hint}") from None
    with conn:
        # (as the driver read it at connect: a query here would begin a transaction)
        info = conn.dialect.server_version_info or ()
        parts = [part for part in info if isinstance(part, int)]
        major, minor = (*parts, 0, 0)[:2]
        version = major * 10000 + minor
        if version < OLDEST_POSTGRES:
            raise Failure(
                f"PostgreSQL {major}.{minor} at {url.address} is too old:"
                f" hybrid-jobs needs {OLDEST_POSTGRES // 10000} or newer"
                f" ({SUPPORTED_POSTGRES} or newer is tested)"
            )
        yield conn


def _refuse_second_instance(conn: Connection, schema: str) -> None:
    found = [row[0] for row in conn.exec_driver_sql(revisions.INSTALLS)]
    why = revisions.second_instance(schema, found)
    if why is not None:
        raise ConfigError(why)


def _plan(script: ScriptDirectory, current: str | None, goal: str) -> list[Step]:
    """The upgrade steps from ``current`` to ``goal``, oldest first."""
    if current == goal:
        return []
    known = {r.revision for r in script.walk_revisions()}
    if current is not None and current not in known:
        raise Failure(
            f"the database is at revision {current}, which this release does not know "
            "(a newer release migrated it): upgrade hybrid-jobs instead"
        )
    ancestors_of_goal = {r.revision for r in script.iterate_revisions(goal, "base")}
    if current is not None and current not in ancestors_of_goal:
        raise Failure(
            f"the database is at {current}, past --to {goal}: jobctl migrate only "
            "upgrades (use `alembic downgrade` from a checkout to go back)"
        )
    steps = reversed(list(script.iterate_revisions(goal, current or "base")))
    return [_step(script, "upgrade", r.revision, r.down_revision) for r in steps]


def _step(script: ScriptDirectory, direction: str, target: str, source: Any) -> Step:
    revision = script.get_revision(target)
    doc = (revision.doc if revision else "") or ""
    return Step(direction, str(source or "base"), target, doc.strip())


def _upgrade(
    conn: Connection, url: DatabaseUrl, script: ScriptDirectory, goal: str, plan: list[Step]
) -> list[Step]:
    ran: list[Step] = []

    def on_version_apply(*, step: MigrationInfo, **_: Any) -> None:
        done = _step(
            script,
            "upgrade" if step.is_upgrade else "downgrade",
            str(step.up_revision_id),
            step.down_revision_ids[0] if step.down_revision_ids else None,
        )
        ran.append(done)
        say(str(done))

    cfg = revisions.alembic_config()
    cfg.attributes["connection"] = conn
    cfg.attributes["url"] = url
    cfg.attributes["on_version_apply"] = on_version_apply
    try:
        command.upgrade(cfg, goal)
    except sqlalchemy.exc.DBAPIError as exc:
        failed = plan[len(ran)] if len(ran) < len(plan) else plan[-1]
        raise Failure(
            f"{failed} failed: {diagnose.first_line(exc.orig or exc)}; nothing was changed "
            "(the steps run in one transaction)"
        ) from None
    return ran
