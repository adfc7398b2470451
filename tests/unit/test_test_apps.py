"""The test apps (tests/apps/) share the default registry when one pytest process
imports several of them: no two may register a handler for the same job type, or
the second import fails and takes every test of its module with it."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import tests.apps


def test_every_test_app_imports_beside_every_other() -> None:
    names = sorted(m.name for m in pkgutil.iter_modules(tests.apps.__path__))
    assert names, "no test apps found"
    # In a process of its own: the default registry of this one holds what the
    # tests already imported.
    code = "; ".join(f"importlib.import_module('tests.apps.{n}')" for n in names)
    done = subprocess.run(
        [sys.executable, "-c", f"import importlib; {code}"],
        cwd=Path(tests.apps.__path__[0]).parents[1],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
