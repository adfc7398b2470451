"""The tables' queue and tenant name CHECKs, as the newest migration writes them, are
schema.tables.name_valid: a migration copies its rule (so that it keeps meaning what
it meant), and once the names' bound or alphabet moves, this fails until a new
migration replaces the constraints. tests/test_name_checks.py shows the rule at work
on the database. No services."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from hybrid_jobs.schema import tables

VERSIONS = Path(__file__).resolve().parents[2] / "schema" / "migrations" / "versions"


def _newest_name_check_migration() -> ModuleType:
    writes = re.compile(r"queues_name_valid")
    found = sorted(p for p in VERSIONS.glob("[0-9]*.py") if writes.search(p.read_text()))
    assert found, "no migration writes queues_name_valid"
    spec = importlib.util.spec_from_file_location(f"_migration_{found[-1].stem}", found[-1])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_migrated_name_rule_is_the_tables() -> None:
    migration = _newest_name_check_migration()
    for column in ("queue", "tenant"):
        assert migration._new(column) == tables.name_valid(column), (
            "the name rule moved: replace the name CHECKs in a new migration"
        )
