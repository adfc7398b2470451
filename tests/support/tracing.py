"""OpenTelemetry in the real `relay` and `consumer` processes of a test.

A ``sitecustomize`` put first on the daemon's PYTHONPATH runs before the command:
one gives the process the SDK's tracer provider with its in-memory span exporter,
and writes what it holds as JSON lines when the process exits; the other makes
``opentelemetry`` unimportable, for the daemons as they run without the extra.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.support.processes import ROOT

_RECORDING = """
import atexit
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_exporter = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(_exporter))
trace.set_tracer_provider(_provider)


def _dump():
    path = os.path.join(os.environ["TEST_SPANS_DIR"], f"{os.getpid()}.jsonl")
    with open(path, "w") as out:
        for span in _exporter.get_finished_spans():
            out.write(span.to_json(indent=None) + "\\n")


# after the provider's own atexit hook in registration, so before it at exit
atexit.register(_dump)
"""

_BLOCKING = """
import os
import sys


class _NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            with open(os.environ["TEST_BLOCKED_LOG"], "a") as out:
                out.write(name + "\\n")
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
        return None


sys.meta_path.insert(0, _NoOpenTelemetry())
"""


def _site(directory: Path, source: str) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(source)
    return os.pathsep.join([str(directory), str(ROOT)])


def recording_env(tmp: Path) -> dict[str, str]:
    """Environment for a daemon that records its spans into ``tmp/spans``."""
    spans = tmp / "spans"
    spans.mkdir(parents=True, exist_ok=True)
    return {"PYTHONPATH": _site(tmp / "site-recording", _RECORDING), "TEST_SPANS_DIR": str(spans)}


def blocking_env(tmp: Path) -> dict[str, str]:
    """Environment for a daemon that cannot import opentelemetry; each attempt is
    written to ``tmp/blocked.log``."""
    return {
        "PYTHONPATH": _site(tmp / "site-blocking", _BLOCKING),
        "TEST_BLOCKED_LOG": str(tmp / "blocked.log"),
    }


def recorded_spans(tmp: Path) -> list[dict[str, Any]]:
    """Every span the daemons of ``recording_env(tmp)`` wrote at their exit."""
    spans = []
    for path in sorted((tmp / "spans").glob("*.jsonl")):
        spans += [json.loads(line) for line in path.read_text().splitlines() if line]
    return spans
