"""The benchmarks stand on their own: `pip install -e '.[bench]'` has no pytest, so
no module of bench/ (nor harness/, what they share with the tests) may import
pytest or the tests, nor start a consumer on a test app."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST_ONLY = ("pytest", "_pytest", "hypothesis", "tests")
# The peers of bench.compare, each from the bench extra.
PEERS = ("celery", "pgqueuer")


def modules(folder: str) -> list[str]:
    return sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for path in (ROOT / folder).rglob("*.py")
    )


def imported(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("tests.")
        ):
            # A module named in a string: `consumer --app tests.apps.basic`.
            found.add(node.value)
    return found


@pytest.mark.parametrize("folder", ["bench", "harness"])
def test_no_module_names_pytest_or_the_tests(folder: str) -> None:
    offending = {
        str(path.relative_to(ROOT)): sorted(
            name for name in imported(path) if name.split(".")[0] in TEST_ONLY
        )
        for path in (ROOT / folder).rglob("*.py")
    }
    assert {path: names for path, names in offending.items() if names} == {}


def test_every_bench_module_imports_with_pytest_and_the_tests_unimportable() -> None:
    # Run where pytest is installed, with it and the tests made unimportable
    # (None in sys.modules makes an import fail), so an import that only happens
    # through another module is caught too. A peer's modules import its library,
    # which only the bench extra brings; without it they are left out here.
    script = f"""
import importlib, importlib.util, sys
for blocked in {TEST_ONLY!r}:
    sys.modules[blocked] = None
for name in {modules("bench")!r}:
    library = name.split(".")[-1].split("_")[0]
    if library in {PEERS!r} and importlib.util.find_spec(library) is None:
        continue
    importlib.import_module(name)
print("imported")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "imported\n"
