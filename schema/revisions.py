"""The migrations as the installed package ships them, and what the code needs.

``alembic upgrade head`` from a checkout reads ``alembic.ini``; an installed package
has no ini file and no checkout, so ``jobctl migrate`` and the daemons' start-up
check build alembic's configuration here, pointing at the migrations inside the
package (``schema/migrations``, shipped as package data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from alembic.config import Config
from alembic.script import ScriptDirectory

from hybrid_jobs.schema.locks import LockKey

MIGRATIONS: Final = Path(__file__).resolve().parent / "migrations"

# Is the schema there, and at which revision? to_regclass finds the tables through
# the connection's search_path, as the daemons' statements will.
SCHEMA_STATE: Final = """
SELECT to_regclass('jobs') IS NOT NULL, to_regclass('alembic_version') IS NOT NULL
"""
SCHEMA_REVISION: Final = "SELECT version_num FROM alembic_version"
# Held by `jobctl migrate` for its transaction, so two deployments migrating at once
# take turns (schema.locks).
MIGRATION_LOCK: Final = f"SELECT pg_advisory_xact_lock({int(LockKey.MIGRATION)})"


def alembic_config() -> Config:
    """Alembic's configuration without an ini file: works from any directory."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("path_separator", "os")
    return cfg


def scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head() -> str:
    found = scripts().get_current_head()
    assert found is not None, "the package ships at least one migration"
    return found


def behind(revision: str, script: ScriptDirectory) -> bool:
    """A known revision short of head: this code needs migrations not yet run.

    A revision this code does not know is newer (a later release migrated the
    database first, as a rolling upgrade does); its tables are a superset of what
    this code uses, so that is no reason to refuse to start.
    """
    known = {r.revision for r in script.walk_revisions()}
    return revision in known and revision != script.get_current_head()
