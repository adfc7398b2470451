"""The migrations as the installed package ships them, and what the code needs.

``alembic upgrade head`` from a checkout reads ``alembic.ini``; an installed package
has no ini file and no checkout, so ``jobctl migrate`` builds alembic's configuration
here, pointing at the migrations inside the package (``schema/migrations``, shipped as
package data).

The daemons' start-up check (is the database at this code's revision?) needs only the
revision ids: :func:`graph` reads them from the migration files' ``revision`` and
``down_revision`` lines, without importing alembic or running the migrations (which
would add about a quarter of a second to every daemon's start).
``tests/unit/test_lazy_imports.py`` checks that it agrees with alembic's
``ScriptDirectory``.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Final

from hybrid_jobs.schema.locks import MIGRATION_LOCK_PREFIX

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

MIGRATIONS: Final = Path(__file__).resolve().parent / "migrations"
VERSIONS: Final = MIGRATIONS / "versions"

# Is the schema there, and at which revision? to_regclass finds the tables through
# the connection's search_path, as the daemons' statements will.
SCHEMA_STATE: Final = """
SELECT to_regclass('jobs') IS NOT NULL, to_regclass('alembic_version') IS NOT NULL
"""
SCHEMA_REVISION: Final = "SELECT version_num FROM alembic_version"
# Where the connection finds the jobs table (NULL: nowhere); and every schema of the
# database that holds an install (a jobs table and alembic's version table), to say
# where the tables are when they are not where the setting points.
SCHEMA_FOUND_IN: Final = """
SELECT (SELECT relnamespace::regnamespace::text FROM pg_catalog.pg_class
        WHERE oid = to_regclass('jobs'))
"""
INSTALLS: Final = """
SELECT n.nspname FROM pg_catalog.pg_namespace AS n
WHERE to_regclass(quote_ident(n.nspname) || '.jobs') IS NOT NULL
  AND to_regclass(quote_ident(n.nspname) || '.alembic_version') IS NOT NULL
ORDER BY n.nspname <> 'public', n.nspname
"""
# Held by `jobctl migrate` for its transaction, so two deployments migrating one
# instance at once take turns (schema.locks); %(schema)s is the instance's schema.
MIGRATION_LOCK: Final = (
    f"SELECT pg_advisory_xact_lock(hashtextextended('{MIGRATION_LOCK_PREFIX}' || %(schema)s, 0))"
)

# The files alembic reads as migrations (alembic.script.base._only_source_rev_file):
# every *.py of the versions folder but __init__.py (and editors' .# lock files).
_MIGRATION_FILE: Final = re.compile(r"(?!\.\#|__init__)(.*\.py)$")
# A module-level `revision = "..."` or `down_revision: str | None = ...` line.
_ASSIGNED: Final = re.compile(
    r"^(revision|down_revision)[ \t]*(?::[^=\n]*)?=[ \t]*(.+?)[ \t]*(?:#[^\"'\n]*)?$", re.MULTILINE
)


def alembic_config() -> Config:
    """Alembic's configuration without an ini file: works from any directory."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("path_separator", "os")
    return cfg


def scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def read_graph(versions: Path) -> dict[str, tuple[str, ...]]:
    """Each migration's revision id and the ids it follows (``down_revision``), as
    written in the files of ``versions``; the files are read, not run."""
    found: dict[str, tuple[str, ...]] = {}
    for path in sorted(versions.iterdir()):
        if not path.is_file() or not _MIGRATION_FILE.match(path.name):
            continue
        values: dict[str, object] = {}
        for match in _ASSIGNED.finditer(path.read_text(encoding="utf-8")):
            if match[1] not in values:
                values[match[1]] = _literal(path, match[2])
        revision, down = values.get("revision"), values.get("down_revision")
        if not isinstance(revision, str):
            raise ValueError(f"{path}: no `revision = '...'` line")
        follows = [down] if isinstance(down, str) else down or []
        if not isinstance(follows, tuple | list) or not all(isinstance(d, str) for d in follows):
            raise ValueError(f"{path}: down_revision is neither None, an id nor a tuple of ids")
        found[revision] = tuple(str(d) for d in follows)
    return found


def _literal(path: Path, text: str) -> object:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ValueError(f"{path}: not a literal revision id: {text}") from None


@cache
def graph() -> dict[str, tuple[str, ...]]:
    """The shipped migrations: each revision id and the ids it follows."""
    return read_graph(VERSIONS)


def heads_of(revisions: dict[str, tuple[str, ...]]) -> list[str]:
    """The revisions no other revision follows."""
    followed = {d for downs in revisions.values() for d in downs}
    return sorted(r for r in revisions if r not in followed)


def head() -> str:
    """The revision this code needs: the newest migration it ships."""
    found = heads_of(graph())
    assert len(found) == 1, f"the package ships one head revision, not {found}"
    return found[0]


def unready(has_jobs: bool, revision: str | None) -> str | None:
    """Why this code cannot run on a database whose schema is so, said after the
    database's name ("database "jobs" has no jobs table ..."), or None when it can.
    The daemons' start-up check and ``jobctl doctor`` say it in these words.

    A database made without alembic (no revision) is the operator's business."""
    if not has_jobs:
        return "has no jobs table (not migrated): run `jobctl migrate`"
    if revision is not None and behind(revision):
        return f"is at migration {revision}, this version needs {head()}: run `jobctl migrate`"
    return None


def misplaced(schema: str | None, found_in: str | None, installs: list[str]) -> str | None:
    """Why a connection meant for the instance in ``schema`` cannot use what it
    finds (the jobs table in ``found_in``; installs in ``installs``), said after the
    database's name, or None when it finds that instance (or no schema is set)."""
    if schema is None or found_in == schema:
        return None
    if found_in is not None:
        # The search_path did not reach the server: a transaction pooler drops
        # startup options, and the role's own search_path found another instance.
        return (
            f"has its jobs table in schema {found_in} for this connection, not in "
            f"{schema} (HYBRID_JOBS_SCHEMA): through a transaction pooler, set the role's "
            f"search_path (ALTER ROLE <role> SET search_path = {schema})"
        )
    if installs:
        return (
            f"has no jobs table in schema {schema} (HYBRID_JOBS_SCHEMA); an instance is in "
            f"{in_schemas(installs)}: set HYBRID_JOBS_SCHEMA={installs[0]} to use it "
            "(see the upgrading guide)"
        )
    return None


def second_instance(schema: str, installs: list[str]) -> str | None:
    """Why migrating ``schema`` with HYBRID_JOBS_SCHEMA unset, where the database
    holds ``installs`` elsewhere (one from before the setting, in public), is
    refused: creating an empty instance beside the one the user means would split
    producers from daemons. None when there is none."""
    if not installs:
        return None
    return (
        f"HYBRID_JOBS_SCHEMA is not set, so this would create a new instance in schema "
        f"{schema}, but the database already holds one in {in_schemas(installs)}: "
        f"set HYBRID_JOBS_SCHEMA={installs[0]} to upgrade that one (see the upgrading "
        f"guide), or HYBRID_JOBS_SCHEMA={schema} to create a second instance beside it"
    )


def in_schemas(names: list[str]) -> str:
    """``schema a``, or ``schemas a, b``."""
    return f"schema{'s' if len(names) > 1 else ''} {', '.join(names)}"


def behind(revision: str) -> bool:
    """A known revision short of head: this code needs migrations not yet run.

    A revision this code does not know is newer (a later release migrated the
    database first, as a rolling upgrade does); its tables are a superset of what
    this code uses, so that is no reason to refuse to start.
    """
    return revision in graph() and revision != head()
