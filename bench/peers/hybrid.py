"""This project, measured by `python -m bench.drain --no-baseline` in a child process:
N no-op jobs committed at once with one relay and K `consumer` processes (jobs/s from
the commit until all are SUCCEEDED), then one job per transaction at a fixed rate
(from each commit to its handler's first line).

Only two keys of the JSON it prints are read, `drain_jobs_per_s` and
`commit_to_handler_start` {p50_ms, p95_ms, p99_ms}: the relay and the consumer can
change underneath without this module noticing.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from bench.common import ROOT
from bench.peers.base import Contender, Figures, Settings, drain_timeout


def last_report(stdout: str) -> dict[str, object]:
    """The last JSON object printed with a `drain_jobs_per_s` key (anything else the
    child or its daemons print is skipped)."""
    decoder = json.JSONDecoder()
    found: dict[str, object] | None = None
    for at, char in enumerate(stdout):
        if char == "{" and (at == 0 or stdout[at - 1] == "\n"):
            try:
                value, _ = decoder.raw_decode(stdout, at)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict) and "drain_jobs_per_s" in value:
                found = value
    if found is None:
        raise RuntimeError("bench.drain printed no report")
    return found


def run_drain(settings: Settings) -> dict[str, object]:
    command = [
        sys.executable,
        "-m",
        "bench.drain",
        "--jobs",
        str(settings.jobs),
        "--consumers",
        str(settings.workers),
        "--rate",
        str(settings.rate),
        "--seconds",
        str(settings.seconds),
        "--no-baseline",
    ]
    child = subprocess.Popen(
        command,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C reaches only us; we pass it on once, below.
        start_new_session=True,
    )
    try:
        stdout, stderr = child.communicate(
            timeout=drain_timeout(settings.jobs) + settings.seconds + 120
        )
    except BaseException:
        # bench.drain stops its relay and consumers and drops its database and broker
        # namespace on SIGTERM.
        child.send_signal(signal.SIGTERM)
        child.wait(90)
        raise
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode != 0:
        tail = "\n".join(stderr.splitlines()[-20:])
        raise RuntimeError(f"bench.drain exited with {child.returncode}:\n{tail}")
    return last_report(stdout)


def measure(settings: Settings) -> Figures:
    report = run_drain(settings)
    latency = report["commit_to_handler_start"]
    assert isinstance(latency, dict)
    drain = report["drain_jobs_per_s"]
    assert isinstance(drain, int | float)
    details = {k: report[k] for k in ("concurrency_per_process",) if k in report}
    return Figures(float(drain), latency, details)


def contenders() -> list[Contender]:
    return [
        Contender(
            name="hybrid-jobs",
            group="hybrid-jobs",
            setup="this project: 1 relay and K `consumer` processes (bench.drain defaults), "
            "PostgreSQL + RabbitMQ",
            measure=measure,
        )
    ]
