"""A private copy of this checkout's source, to build the package from.

pip builds a local project in its own tree (``build/``, ``*.egg-info``): two tests
that build at once from the checkout (the wheel's, the installed ``jobctl
migrate``'s) write the same files, and one build then holds no package, or fails.
Each builds from a copy instead."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.processes import ROOT

# What a build does not read: the virtualenv, caches, earlier builds, the history.
_LEFT_OUT = shutil.ignore_patterns(
    ".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", ".mypy_cache",
    ".ruff_cache", ".pytest_cache", ".hypothesis", "site", "node_modules",
)  # fmt: skip


def source_copy(into: Path) -> Path:
    """A copy of the checkout's source under ``into`` (its links kept as links:
    ``hybrid_jobs/`` links to the folders beside it)."""
    target = into / "source"
    shutil.copytree(ROOT, target, symlinks=True, ignore=_LEFT_OUT)
    return target
