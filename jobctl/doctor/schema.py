"""The schema: the database's revision against this release's, and the tables,
columns, indexes and constraints against ``schema/metadata.py``.

The revision is judged in the daemons' words (``revisions.unready``): a database
behind this release is what stops them at start-up. The drift is alembic's own
comparison (``compare_metadata``, what ``tests/test_migrations.py`` holds a migrated
database to), plus the CHECK constraints, which alembic does not compare; it runs
only on a database at this release's head, where the migrations have nothing left
to do and whatever differs was changed by hand. Alembic and the table definitions
are imported when the drift is checked: alembic alone takes a quarter of a second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from psycopg import AsyncConnection

from hybrid_jobs.jobctl.doctor.findings import Finding, Level
from hybrid_jobs.jobctl.doctor.queries import DOCTOR_CHECK_CONSTRAINTS
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.plumbing.preflight import misplaced_instance
from hybrid_jobs.schema import revisions

if TYPE_CHECKING:
    from sqlalchemy import Column, Constraint, Index, Table

CHECK = "schema"
MIGRATE = "run `jobctl migrate` (it only upgrades, and is safe to run while the daemons run)"


async def revision(conn: AsyncConnection[Any], url: DatabaseUrl) -> tuple[list[Finding], bool]:
    """The revision's findings, and whether the drift is worth comparing (the
    database is at this release's head, or has tables but no revision)."""
    where = f'database "{url.dbname}"'
    misplaced = await misplaced_instance(conn, url.schema)
    if misplaced is not None:
        detail = "the relay and consumers refuse to start"
        return [Finding(CHECK, Level.PROBLEM, f"{where} {misplaced}", detail)], False
    row = await (await conn.execute(revisions.SCHEMA_STATE)).fetchone()
    has_jobs, has_version = row or (False, False)
    found: str | None = None
    if has_version:
        version = await (await conn.execute(revisions.SCHEMA_REVISION)).fetchone()
        found = version[0] if version else None
    head = revisions.head()
    why = revisions.unready(bool(has_jobs), found)
    if why is not None:
        title = f"{where} {why.partition(': run')[0]}"
        detail = f"this release needs migration {head}; the relay and consumers refuse to start"
        return [Finding(CHECK, Level.PROBLEM, title, detail, MIGRATE)], False
    if found is None:
        return [
            Finding(
                CHECK,
                Level.WARNING,
                f"{where} has the tables but no migration revision (alembic_version)",
                "it was made without alembic, so `jobctl migrate` cannot tell what it holds;"
                " the tables are compared below",
                "if the tables match this release, record it with `alembic stamp head` from a "
                "checkout, so later upgrades know where to start",
            )
        ], True
    if found != head:
        return [
            Finding(
                CHECK,
                Level.NOTE,
                f"{where} is at migration {found}, newer than this release ({head})",
                "a later release migrated it (a rolling upgrade does this); its tables hold "
                "everything this release uses, so they are not compared",
                "upgrade hybrid-jobs here, and run `jobctl doctor` from the newer release",
            )
        ], False
    return [Finding(CHECK, Level.OK, f"{where} is at this release's migration ({head})")], True


async def drift(conn: AsyncConnection[Any], url: DatabaseUrl) -> list[Finding]:
    """The differences between the database's tables and this release's, each in
    words with what to do; one ok finding when there is none."""
    import asyncio

    from hybrid_jobs.schema.tables import metadata

    tables = sorted(metadata.tables)
    cur = await conn.execute(DOCTOR_CHECK_CONSTRAINTS, {"tables": tables})
    present = {(table, name) for table, name in await cur.fetchall()}
    # alembic's comparison is synchronous (SQLAlchemy's inspector, a connection of
    # its own): in a thread, off the event loop.
    differences = await asyncio.to_thread(_compare, url)
    found = [f for d in differences if (f := _described(d)) is not None]
    found += [_missing_check(c) for c in _checks(metadata.tables.values(), present)]
    if not found:
        return [Finding(CHECK, Level.OK, "the tables, columns, indexes and constraints match")]
    return found


def _compare(url: DatabaseUrl) -> list[Any]:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import create_engine, pool

    from hybrid_jobs.schema.tables import metadata

    def ours(_obj: Any, name: str | None, kind: str, _reflected: bool, _compare: Any) -> bool:
        # The database holds the application's tables too (enqueue writes beside
        # them): only this release's tables are compared.
        return kind != "table" or name in metadata.tables

    engine = create_engine(
        url.sqlalchemy,
        poolclass=pool.NullPool,
        connect_args={"application_name": "jobctl-doctor", "connect_timeout": 10},
    )
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"include_object": ours})
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def _sql(statement: Any) -> str:
    return " ".join(str(statement.compile(dialect=_dialect())).split())


def _dialect() -> Any:
    from sqlalchemy.dialects.postgresql import psycopg

    return psycopg.dialect()  # type: ignore[no-untyped-call]


def _by_hand(sql: str) -> str:
    return f"it was changed by hand or by another tool; recreate it with: {sql}"


def _described(difference: Any) -> Finding | None:
    """One of alembic's differences in words: what is missing or changed is a
    problem, what the database has besides this release's schema a note."""
    if isinstance(difference, list):  # a column's changes come as a list
        changes = [f for d in difference if (f := _column_change(d)) is not None]
        return changes[0] if changes else None
    kind = difference[0]
    if kind == "add_index":
        return _missing_index(difference[1])
    if kind == "add_column":
        return _missing_column(difference[2], difference[3])
    if kind in ("add_fk", "add_constraint"):
        return _missing_constraint(difference[1])
    if kind == "add_table":
        table: Table = difference[1]
        return Finding(
            CHECK,
            Level.PROBLEM,
            f"table {table.name} is missing",
            "this release's statements read and write it",
            _by_hand(_sql(_create_table(table))),
        )
    if kind == "remove_index":
        index: Index = difference[1]
        return Finding(
            CHECK,
            Level.NOTE,
            f"index {index.name} on {_table_of(index)} is not part of hybrid-jobs' schema",
            "yours, presumably: every write to the table maintains it too",
        )
    if kind == "remove_column":
        return Finding(
            CHECK,
            Level.NOTE,
            f"column {difference[2]}.{difference[3].name} is not part of hybrid-jobs' schema",
            "yours, presumably: hybrid-jobs neither reads nor writes it, so it must accept "
            "a row written without it (a default, or NULL)",
        )
    if kind in ("remove_fk", "remove_constraint"):
        constraint: Constraint = difference[1]
        return Finding(
            CHECK,
            Level.NOTE,
            f"constraint {constraint.name} on {_table_of(constraint)} is not part of "
            "hybrid-jobs' schema",
            "yours, presumably: a write that breaks it fails, and a daemon retries it",
        )
    return Finding(CHECK, Level.WARNING, f"the schema differs: {kind}", str(difference)[:300])


def _table_of(item: Index | Constraint) -> str:
    table = item.table
    return str(table.name) if table is not None else "?"


def _missing_index(index: Index) -> Finding:
    from sqlalchemy.schema import CreateIndex

    create = _sql(CreateIndex(index))
    # Built beside the live table without locking out its writes.
    create = create.replace(" INDEX ", " INDEX CONCURRENTLY ", 1)
    return Finding(
        CHECK,
        Level.PROBLEM,
        f"index {index.name} on {_table_of(index)} is missing",
        "the rule it enforces (no two rows alike) is not enforced"
        if index.unique
        else "the statements that read through it scan the whole table instead",
        _by_hand(create),
    )


def _missing_column(table: str, column: Column[Any]) -> Finding:
    from sqlalchemy.schema import CreateColumn

    return Finding(
        CHECK,
        Level.PROBLEM,
        f"column {table}.{column.name} is missing",
        "the statements that read or write it fail",
        _by_hand(f"ALTER TABLE {table} ADD COLUMN {_sql(CreateColumn(column))}"),
    )


def _missing_constraint(
    constraint: Constraint, why: str = "the rule it enforces is not enforced"
) -> Finding:
    from sqlalchemy.schema import AddConstraint

    return Finding(
        CHECK,
        Level.PROBLEM,
        f"constraint {constraint.name} on {_table_of(constraint)} is missing",
        why,
        _by_hand(_sql(AddConstraint(constraint))),
    )


def _missing_check(constraint: Constraint) -> Finding:
    return _missing_constraint(
        constraint, "the rule it enforces is not enforced: a row the code never writes could be"
    )


def _checks(tables: Any, present: set[tuple[str, str]]) -> list[Constraint]:
    """This release's named CHECK constraints the database does not have."""
    from sqlalchemy import CheckConstraint

    return [
        c
        for table in tables
        for c in sorted(table.constraints, key=lambda c: str(c.name))
        if isinstance(c, CheckConstraint)
        and isinstance(c.name, str)
        and (table.name, c.name) not in present
    ]


def _column_change(change: tuple[Any, ...]) -> Finding | None:
    kind, _schema, table, column = change[:4]
    if kind == "modify_type":
        had, wants = change[5], change[6]
        return Finding(
            CHECK,
            Level.PROBLEM,
            f"column {table}.{column} is {_type(had)}, this release's schema says {_type(wants)}",
            "the statements that read or write it may fail, or store values the code "
            "does not expect",
            _by_hand(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {_type(wants)}"),
        )
    if kind == "modify_nullable":
        wants_null = change[6]
        state = "DROP NOT NULL" if wants_null else "SET NOT NULL"
        said = "allows NULL" if not wants_null else "is NOT NULL"
        return Finding(
            CHECK,
            Level.PROBLEM,
            f"column {table}.{column} {said}, unlike this release's schema",
            "a rule the code relies on is not enforced"
            if not wants_null
            else "a statement that writes no value there fails",
            _by_hand(f"ALTER TABLE {table} ALTER COLUMN {column} {state}"),
        )
    return None


def _type(kind: Any) -> str:
    try:
        return str(kind.compile(dialect=_dialect()))
    except Exception:
        return str(kind)


def _create_table(table: Table) -> Any:
    from sqlalchemy.schema import CreateTable

    return CreateTable(table)
