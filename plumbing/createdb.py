"""Create the database named in DATABASE_URL when it does not exist yet.

``jobctl migrate --create-database`` calls :func:`create_database` before it
migrates; ``python -m hybrid_jobs.plumbing.createdb --fresh`` is the demo's reset
(it drops the database first: the demo's, never yours). Either connects to the
server's ``postgres`` database to do it, as ``createdb`` does.
"""

from __future__ import annotations

import sys

import psycopg
import psycopg.conninfo
from psycopg import sql

from hybrid_jobs.plumbing.config import ConfigError, DatabaseUrl, database_url


def database_name(url: DatabaseUrl) -> str | None:
    """The database ``url`` names; None when it names none (libpq's default)."""
    name = psycopg.conninfo.conninfo_to_dict(url.conninfo).get("dbname")
    return str(name) if name else None


def create_database(url: DatabaseUrl, *, fresh: bool = False) -> bool:
    """Create the database ``url`` names unless it exists; True if it was created.

    ``fresh`` drops it first. Raises ``psycopg.Error`` when the server cannot be
    reached or refuses (a role without CREATEDB, say)."""
    name = database_name(url)
    if name is None:
        return False
    admin = psycopg.conninfo.make_conninfo(url.conninfo, dbname="postgres")
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        if fresh:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists:
            return False
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.DuplicateDatabase:
            return False  # created meanwhile by another `jobctl migrate --create-database`
        return True


def main() -> None:
    try:
        url = database_url()
    except ConfigError as exc:
        sys.exit(f"createdb: {exc}")
    try:
        if create_database(url, fresh="--fresh" in sys.argv[1:]):
            print(f"createdb: created {database_name(url)}", file=sys.stderr)
    except psycopg.Error as exc:
        sys.exit(
            f"createdb: cannot create it at {url.redacted()}: {str(exc).strip().splitlines()[0]}"
        )


if __name__ == "__main__":
    main()
