"""The benchmarks' --help: the whole description, and every option with its default."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize(
    "module",
    [
        "bench.drain",
        "bench.load",
        "bench.metrics_cost",
        "bench.relay_throughput",
        "bench.control_plans",
        "bench.retention",
        "bench.fairness",
        "bench.priority",
        "bench.tenants_cost",
        "bench.tenants_scale",
        "bench.notify",
        "bench.scale",
        "bench.latency",
        "bench.scheduler_delay",
        "bench.cpu_split",
        "bench.processes",
        "bench.refused_queue",
        "bench.refusals",
        "bench.rewake_backlog",
        "bench.spread",
        "bench.enqueue_async",
        "bench.rate_limits",
    ],
)
def test_help_shows_the_whole_description_and_every_default(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    doc = __import__(module, fromlist=["__doc__"]).__doc__
    last_line = doc.strip().splitlines()[-1]
    assert last_line in done.stdout, "the description is not cut short"
    options = re.findall(r"^  (--[a-z-]+)", done.stdout, re.MULTILINE)
    assert len(options) >= 3, done.stdout
    assert done.stdout.count("(default:") == len(options), done.stdout
