"""Every library the installed package imports is one it declares.

A module imported by the package but installed only through another's requirements,
or only by an extra, works in this checkout's environment (which has every extra)
and fails on a user's `pip install hybrid-jobs`: the relay imported httpx, which only
the test extra named, so a plain install's relay could not start. Read from the
source: each module's imports, except those under ``TYPE_CHECKING`` and those that
an ``except ImportError`` guards (an optional extra's, as plumbing/tracing.py takes
opentelemetry), mapped to the distributions that provide them and looked up among
pyproject.toml's dependencies. A library an optional extra names (``otel``) may be
imported only inside a function, where a plain install never gets to it.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("consumers", "jobctl", "outbox", "plumbing", "relay", "schema")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _Imports(ast.NodeVisitor):
    """The top-level names a module imports, unguarded."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        # imported inside a function: reached only when that function is called
        self.lazy: set[str] = set()
        self.guarded = 0
        self.depth = 0

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def _add(self, name: str) -> None:
        if not self.guarded:
            (self.lazy if self.depth else self.names).add(name)

    def visit_Try(self, node: ast.Try) -> None:
        guards = any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
            for h in node.handlers
        )
        self.guarded += guards
        for child in node.body:
            self.visit(child)
        self.guarded -= guards
        for handler in node.handlers:
            self.visit(handler)
        for child in [*node.orelse, *node.finalbody]:
            self.visit(child)

    def visit_If(self, node: ast.If) -> None:
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self._add(node.module.split(".")[0])


def _imported(lazy: bool) -> dict[str, set[str]]:
    """Third-party top-level module -> the package's files that import it (``lazy``:
    inside a function)."""
    found: dict[str, set[str]] = {}
    for part in PARTS:
        for path in sorted((ROOT / part).rglob("*.py")):
            visitor = _Imports()
            visitor.visit(ast.parse(path.read_text(), str(path)))
            for name in visitor.lazy if lazy else visitor.names:
                if name in sys.stdlib_module_names or name in (*PARTS, "hybrid_jobs"):
                    continue
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def _names(requirements: list[str]) -> set[str]:
    names = set()
    for requirement in requirements:
        match = _NAME.match(requirement)
        assert match, requirement
        names.add(_normal(match.group(0)))
    return names


# The extras for working on the project, not for running it.
_OWN_EXTRAS = ("test", "docs", "bench")


def test_every_library_the_package_imports_is_a_declared_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _names(project["dependencies"])
    optional = _names(
        [r for extra, rs in project["optional-dependencies"].items()
         if extra not in _OWN_EXTRAS for r in rs]
    )  # fmt: skip
    providers = importlib.metadata.packages_distributions()

    def provided(module: str) -> set[str]:
        return {_normal(d) for d in providers.get(module, [module])}

    undeclared = {
        module: sorted(files)[:3]
        for module, files in _imported(lazy=False).items()
        if not provided(module) & declared
    } | {
        module: sorted(files)[:3]
        for module, files in _imported(lazy=True).items()
        if not provided(module) & (declared | optional)
    }
    assert not undeclared, (
        f"imported but not in pyproject.toml's dependencies: {undeclared}"
        " (a plain install would fail to import them)"
    )


def test_the_check_sees_an_unguarded_import_and_not_a_guarded_one() -> None:
    visitor = _Imports()
    visitor.visit(
        ast.parse(
            "import httpx\n"
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    import sqlalchemy\n"
            "def f():\n    try:\n        import opentelemetry\n    except ImportError:\n"
            "        return None\n"
        )
    )
    assert visitor.names == {"httpx", "typing"} and not visitor.lazy
