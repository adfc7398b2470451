"""The SQL function hybrid_jobs_enqueue holds the limits of hybrid_jobs/defaults.py.

A migration copies its constants (so that it keeps meaning what it meant), and the
function's limits are written into it when it is created: once a default moves,
this fails until a new migration replaces the function with the new figure. The
test reads the newest migration that writes the function; tests/test_sql_enqueue.py
shows the same limits at work on the database. No services."""

from __future__ import annotations

from types import ModuleType

from hybrid_jobs import defaults
from hybrid_jobs.schema import tables
from tests.support.migrations import newest_migration

LIMITS = (
    "MAX_JOB_TYPE_LENGTH",
    "MAX_QUEUE_NAME_LENGTH",
    "MAX_DEDUP_KEY_LENGTH",
    "MAX_PAYLOAD_BYTES",
    "MAX_PAYLOAD_DEPTH",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_TAGS",
    "MAX_TAG_LENGTH",
    "MAX_META_BYTES",
    "MIN_RETRY_AFTER",
    "MAX_RETRY_AFTER",
    "UNKNOWN_DRAIN_RETRY_AFTER",
)


def _newest_function_migration() -> ModuleType:
    return newest_migration(r"CREATE (OR REPLACE )?FUNCTION hybrid_jobs_enqueue\(")


def test_the_sql_functions_limits_are_the_defaults() -> None:
    migration = _newest_function_migration()
    for name in LIMITS:
        assert getattr(migration, name) == getattr(defaults, name), (
            f"defaults.{name} moved: replace hybrid_jobs_enqueue in a new migration"
        )


def test_the_sql_functions_alphabets_are_the_tables() -> None:
    migration = _newest_function_migration()
    assert migration.QUEUE_NAME_PATTERN == tables.QUEUE_NAME_PATTERN
    assert migration.TAG_PATTERN == tables.TAG_PATTERN
