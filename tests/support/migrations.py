"""The migration modules themselves, loaded as files, for the unit tests that hold a
migration's copied constants to the code's (a migration keeps meaning what it meant,
so it copies them rather than import them). No services."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

VERSIONS = Path(__file__).resolve().parents[2] / "schema" / "migrations" / "versions"


def newest_migration(writes: str) -> ModuleType:
    """The newest migration whose text matches the regular expression ``writes``."""
    pattern = re.compile(writes)
    found = sorted(p for p in VERSIONS.glob("[0-9]*.py") if pattern.search(p.read_text()))
    assert found, f"no migration matches {writes!r}"
    spec = importlib.util.spec_from_file_location(f"_migration_{found[-1].stem}", found[-1])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
