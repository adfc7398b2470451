"""Point your own engine at an instance: ``bind_instance(engine)``.

The producer's statements run on your connection, in your transaction, and name the
tables without a schema, as the relay's and the consumers' do; PostgreSQL finds them
through the connection's ``search_path``. The relay and the consumers set theirs to
the instance's schema (``HYBRID_JOBS_SCHEMA``); your engine keeps its own, where
your tables are, and this adds the instance's schema at its end::

    engine = create_engine("postgresql+psycopg://app@db/shop")
    outbox.bind_instance(engine)  # HYBRID_JOBS_SCHEMA, else hybrid_jobs

Your own unqualified names still find your tables first, and the tables you create
unqualified still land in your first schema. A table of yours with the name of one
of the instance's (``jobs``, ``outbox``...) would hide it from the producer: each
new connection checks, and refuses with the names rather than write to your table.

Through a transaction pooler (PgBouncer, transaction mode) a ``SET`` outlives the
transaction on a server connection other clients share: do not bind there; set the
role's search_path instead (``ALTER ROLE app SET search_path = "$user", public,
hybrid_jobs``), which a new server connection starts with.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from hybrid_jobs.plumbing.config import ConfigError, check_schema, instance_schema

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

# Appends the schema unless the search_path names it already (a role's setting).
_APPEND = """
SELECT set_config('search_path', concat_ws(', ', NULLIF(current_setting('search_path'), ''),
                                           quote_ident(%(schema)s)), false)
WHERE NOT quote_ident(%(schema)s) = ANY (string_to_array(
          replace(current_setting('search_path'), ' ', ''), ','))
"""
# Does the schema exist, and which tables earlier in the search_path hide its own?
_SHADOWED = """
SELECT to_regnamespace(%(schema)s) IS NOT NULL,
       array(SELECT format('%%I.%%I', n.nspname, other.relname)
             FROM pg_catalog.pg_class AS c
             JOIN pg_catalog.pg_class AS other ON other.oid = to_regclass(quote_ident(c.relname))
             JOIN pg_catalog.pg_namespace AS n ON n.oid = other.relnamespace
             WHERE c.relnamespace = to_regnamespace(%(schema)s)
               AND c.relkind IN ('r', 'p', 'v', 'S') AND other.oid <> c.oid
             ORDER BY 1)
"""

_BOUND: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def bind_instance(engine: Engine | AsyncEngine, schema: str | None = None) -> str:
    """Make every new connection of ``engine`` find the instance in ``schema``
    (default: ``HYBRID_JOBS_SCHEMA``, else ``hybrid_jobs``) after its own schemas;
    returns the schema. Call it once, before the engine's first connection (a
    connection already in its pool keeps its search_path).

    A new connection raises :class:`~hybrid_jobs.plumbing.config.ConfigError` when
    the schema holds no instance, or when a table of the same name earlier in the
    search_path would hide one of the instance's.
    """
    from sqlalchemy import event

    name = check_schema(schema, "schema") if schema else instance_schema()[0]
    sync = getattr(engine, "sync_engine", engine)
    _BOUND[sync] = name

    @event.listens_for(sync, "connect", insert=True)
    def _enter(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(_APPEND, {"schema": name})
            cursor.execute(_SHADOWED, {"schema": name})
            exists, shadowed = cursor.fetchone()
        finally:
            cursor.close()
        # The set_config above is the session's (not the transaction's): keep it.
        dbapi_connection.commit()
        if not exists:
            raise ConfigError(
                f"schema {name} holds no hybrid-jobs instance: run `jobctl migrate` with "
                f"HYBRID_JOBS_SCHEMA={name}"
            )
        if shadowed:
            hidden = ", ".join(shadowed)
            raise ConfigError(
                f"{hidden} come(s) before schema {name} in this connection's search_path "
                f"and hide(s) the instance's table(s) of that name: rename them, or give "
                f"this engine a search_path that starts with {name}"
            )

    return name


def bound_schema(engine: Engine | AsyncEngine) -> str | None:
    """The schema :func:`bind_instance` bound ``engine`` to, or None."""
    return _BOUND.get(getattr(engine, "sync_engine", engine))
