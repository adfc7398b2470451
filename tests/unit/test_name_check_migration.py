"""The tables' queue and tenant name CHECKs, as the newest migration writes them, are
schema.tables.name_valid: a migration copies its rule (so that it keeps meaning what
it meant), and once the names' bound or alphabet moves, this fails until a new
migration replaces the constraints. tests/test_name_checks.py shows the rule at work
on the database. No services."""

from __future__ import annotations

from hybrid_jobs.schema import tables
from tests.support.migrations import newest_migration


def test_the_migrated_name_rule_is_the_tables() -> None:
    migration = newest_migration("queues_name_valid")
    for column in ("queue", "tenant"):
        assert migration._new(column) == tables.name_valid(column), (
            "the name rule moved: replace the name CHECKs in a new migration"
        )
