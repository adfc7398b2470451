"""Running a benchmark as a user would (``python -m bench.NAME``), from the checkout,
for the tests that check its output end to end at a small size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_bench(
    module: str, *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``python -m bench.<module> args``, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def bench_json(module: str, *args: str, timeout: float = 240) -> Any:
    """The one JSON object a benchmark prints, once it exited 0."""
    result = run_bench(module, *args, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)
