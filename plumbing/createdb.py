"""Create the database named in DATABASE_URL if it does not exist yet.

``python -m hybrid_jobs.plumbing.createdb [--fresh]``; used by scripts/run and scripts/demo on a
machine whose PostgreSQL is already running. Connects to the server's ``postgres``
database to do it. ``--fresh`` drops the database first (the demo's, never yours).
"""

from __future__ import annotations

import sys

import psycopg
import psycopg.conninfo
from psycopg import sql

from hybrid_jobs.plumbing.config import ConfigError, database_url


def main() -> None:
    try:
        url = database_url()
    except ConfigError as exc:
        sys.exit(f"createdb: {exc}")
    params = psycopg.conninfo.conninfo_to_dict(url.conninfo)
    name = params.get("dbname")
    if not name:
        return
    admin = psycopg.conninfo.make_conninfo(url.conninfo, dbname="postgres")
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            if "--fresh" in sys.argv[1:]:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(str(name))
                    )
                )
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(str(name))))
                print(f"createdb: created {name}", file=sys.stderr)
    except psycopg.OperationalError as exc:
        sys.exit(f"createdb: cannot reach {url.redacted()}: {str(exc).strip().splitlines()[0]}")


if __name__ == "__main__":
    main()
