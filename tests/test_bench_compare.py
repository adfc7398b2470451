"""`python -m bench.compare` end to end at a small size: it runs each contender, cleans
up after it and prints figures that make sense. No timing is asserted (benchmarks
print figures; tests never judge them), only that they are there and consistent."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.bench import run_bench

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--jobs", "300", "--rate", "50", "--seconds", "2"]


def compare(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_bench("compare", *args, env=env)


def figures(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    settings = {"jobs": 300, "workers": 2, "rate": 50.0, "seconds": 2.0}
    assert data["settings"] == settings | {"repeat": data["settings"]["repeat"]}
    assert data["machine"]["autovacuum"] in ("on", "off")
    assert data["machine"]["cpus"] >= 1
    assert data["machine"]["postgresql"] and data["machine"]["rabbitmq"]
    for row in data["results"]:
        assert row["error"] is None, row
        assert row["drain_jobs_per_s"] > 0, row
        latency = row["latency"]
        # Ordered, but not necessarily above zero: a job is timed from the moment its
        # producer's enqueue returned, and a peer whose worker hears the commit's
        # notification directly (PgQueuer) can start the handler first, while the
        # producer waits for a core on a loaded machine (p50 -1.05 ms was seen).
        assert all(math.isfinite(latency[k]) for k in ("p50_ms", "p95_ms", "p99_ms")), row
        assert latency["p50_ms"] <= latency["p95_ms"] <= latency["p99_ms"], row
        assert latency["jobs"] == 100, row  # 50 jobs/s for 2 s, every one measured
    return data


def test_this_project_next_to_the_skip_locked_loop() -> None:
    data = figures(compare(*SMALL, "--json", "--only", "skiplocked", "hybrid-jobs"))
    rows = {row["name"]: row for row in data["results"]}
    assert list(rows) == ["hybrid-jobs", "skiplocked b=1", "skiplocked b=10"]
    assert rows["hybrid-jobs"]["ours_to_peer"] is None
    for name in ("skiplocked b=1", "skiplocked b=10"):
        ratio = rows[name]["ours_to_peer"]
        assert set(ratio) == {"jobs_per_s", "p50_ms", "p95_ms", "p99_ms"}
        assert all(value > 0 for value in ratio.values())
        expected = rows["hybrid-jobs"]["drain_jobs_per_s"] / rows[name]["drain_jobs_per_s"]
        assert ratio["jobs_per_s"] == pytest.approx(expected, rel=0.05, abs=0.01)


def test_the_floor_of_this_design_runs_its_hops_and_loses_no_job() -> None:
    """The floor contender: a relay and consumers of its own on the same services; its
    run fails unless every job it committed reached its recorded end."""
    data = figures(compare(*SMALL, "--json", "--only", "floor", "--repeat", "2"))
    assert [row["name"] for row in data["results"]] == ["floor"]
    (row,) = data["results"]
    assert row["details"] == {"pack": 20, "relay_batch": 500}
    # Two rounds, each kept; the row's figures are their medians (of two, the mean).
    assert data["settings"]["repeat"] == 2 and len(row["rounds"]) == 2
    drains = [r["drain_jobs_per_s"] for r in row["rounds"]]
    assert min(drains) - 1 <= row["drain_jobs_per_s"] <= max(drains) + 1
    p50s = [r["latency"]["p50_ms"] for r in row["rounds"]]
    assert row["latency"]["p50_ms"] == pytest.approx(sum(p50s) / 2)


@pytest.mark.parametrize(
    ("group", "package", "rows"),
    [
        ("pgqueuer", "pgqueuer", ["pgqueuer b=10", "pgqueuer b=100"]),
        ("celery", "celery", ["celery"]),
    ],
)
def test_a_peer_from_the_bench_extra(group: str, package: str, rows: list[str]) -> None:
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (pip install -e '.[bench]')")
    data = figures(compare(*SMALL, "--json", "--only", group))
    assert [row["name"] for row in data["results"]] == rows
    assert data["machine"][package]


def test_a_missing_peer_is_skipped_in_one_line(tmp_path: Path) -> None:
    # A package that cannot be imported, as on a machine without the bench extra.
    shadow = tmp_path / "celery"
    shadow.mkdir()
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'celery'\", name='celery')\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    result = compare(*SMALL, "--only", "celery", env=env)
    assert result.returncode == 0, result.stderr
    assert "celery: skipped, celery is not installed (pip install -e '.[bench]')" in (result.stderr)
    assert "Traceback" not in result.stderr


def test_help_shows_the_whole_description_and_every_default() -> None:
    result = compare("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "missing one is skipped with a note." in text
    for described in (
        "jobs drained at once (default: 20000)",
        "(our consumer processes) (default: 2)",
        "jobs committed per second in the latency run (default: 200)",
        "length of the latency run (default: 10)",
        "skiplocked, floor (default: all)",
    ):
        assert described in text
