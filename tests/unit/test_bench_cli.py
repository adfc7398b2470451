"""The benchmarks' --help: the whole description, and every option with its default.
Each module's main() runs in this process, as `python -m` would run it, with no
service needed: --help ends it before anything connects."""

from __future__ import annotations

import importlib
import re
import sys

import pytest


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
        "bench.wait_for",
        "bench.fan_in",
        "bench.rate_limits",
    ],
)
def test_help_shows_the_whole_description_and_every_default(
    module: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = importlib.import_module(module)
    # argparse wraps to the terminal's width; a fixed one, as in a pipe.
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(sys, "argv", [f"{module}.py", "--help"])
    with pytest.raises(SystemExit) as ended:
        bench.main()
    assert ended.value.code == 0
    stdout = capsys.readouterr().out
    last_line = bench.__doc__.strip().splitlines()[-1]
    assert last_line in stdout, "the description is not cut short"
    options = re.findall(r"^  (--[a-z-]+)", stdout, re.MULTILINE)
    assert len(options) >= 3, stdout
    assert stdout.count("(default:") == len(options), stdout
