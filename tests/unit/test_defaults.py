"""One module holds every default: each settings object's field defaults to the
constant of its name in hybrid_jobs.defaults, that module imports nothing of the
package, and the configuration reference (docs/gen_pages.py) lists every one of them
with its value. No services."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from hybrid_jobs import defaults
from hybrid_jobs.consumers.settings import ConsumerSettings
from hybrid_jobs.jobctl.api.settings import ApiSettings
from hybrid_jobs.jobctl.metrics import CollectorSettings
from hybrid_jobs.relay.settings import RelaySettings
from hybrid_jobs.schema.topology import Topology

ROOT = Path(__file__).resolve().parents[2]
SETTINGS: dict[str, type[Any]] = {
    "RELAY": RelaySettings,
    "CONSUMER": ConsumerSettings,
    "SERVE": ApiSettings,
    "METRICS": CollectorSettings,
}
# ApiSettings fields whose default is no setting of a user's: the token comes from the
# environment, the tests turn the collector off, and the host list, the public URL
# and open metrics are off unless their flags say.
NOT_DEFAULTS = {
    ("SERVE", name) for name in ("token", "metrics", "allowed_hosts", "public_url", "open_metrics")
} | {("RELAY", "webhook_secret")}  # a credential has no default


def _plain_defaults(settings: type[Any]) -> dict[str, Any]:
    return {
        f.name: f.default
        for f in dataclasses.fields(settings)
        if f.default is not dataclasses.MISSING
    }


@pytest.mark.parametrize("prefix", sorted(SETTINGS))
def test_every_settings_default_is_the_constant_of_its_name(prefix: str) -> None:
    for name, value in _plain_defaults(SETTINGS[prefix]).items():
        if (prefix, name) in NOT_DEFAULTS:
            continue
        constant = f"{prefix}_{name.upper()}"
        assert hasattr(defaults, constant), f"{SETTINGS[prefix].__name__}.{name}: no {constant}"
        assert getattr(defaults, constant) == value, constant


@pytest.mark.parametrize("prefix", sorted(SETTINGS))
def test_every_prefixed_constant_is_a_field_or_documented_as_fixed(prefix: str) -> None:
    fields = {f.name for f in dataclasses.fields(SETTINGS[prefix])}
    # Prefixed figures that belong to no settings object: the liveness of a relay
    # (in the SQL) and the port (a flag of jobctl serve alone).
    free = {"RELAY_LIVE_SECONDS", "SERVE_PORT"}
    for constant in dir(defaults):
        if constant.startswith(f"{prefix}_") and constant not in free:
            assert constant.removeprefix(f"{prefix}_").lower() in fields, constant


def test_the_topology_defaults_are_the_amqp_ones() -> None:
    assert Topology().prefix == defaults.AMQP_PREFIX
    assert Topology().queue_type.value == defaults.AMQP_QUEUE_TYPE


def test_defaults_import_nothing_of_the_package() -> None:
    tree = ast.parse((ROOT / "hybrid_jobs" / "defaults.py").read_text())
    imported = [
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in (n.names if isinstance(n, ast.Import) else [n])
    ]
    assert all(m in ("__future__", "typing") for m in imported), imported


def test_every_default_has_a_docstring() -> None:
    pages = _gen_pages()
    names = [e.name for e in pages.entries()]
    public = [n for n in vars(defaults) if n.isupper()]
    assert sorted(names) == sorted(public)
    assert all(e.doc for e in pages.entries()), [e.name for e in pages.entries() if not e.doc]


def test_the_configuration_reference_lists_every_default_with_its_value() -> None:
    page = _gen_pages().configuration_page()
    for name in (n for n in vars(defaults) if n.isupper()):
        row = next((line for line in page.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, name
        value = getattr(defaults, name)
        shown = row.split(" | ")[1].replace(",", "")
        assert repr(value) in shown or f"{value:g}" in shown, (name, row)
    assert "`--poll-interval` (relay)" in page
    assert "`--concurrency` (consumer)" in page


def _gen_pages() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_pages", ROOT / "docs" / "gen_pages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_pages"] = module
    spec.loader.exec_module(module)
    return module
