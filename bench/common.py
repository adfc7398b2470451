"""What the benchmarks share: a scratch database migrated to head and a scratch
broker namespace (from tests.support.scratch), percentiles, the environment, and
their command lines' help."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from plumbing.config import AmqpUrl, DatabaseUrl
from schema.topology import Topology
from tests.support.scratch import scratch_database, scratch_topology

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
AMQP = AmqpUrl.parse(os.environ.get("AMQP_URL", "amqp://127.0.0.1:5672/"))


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module's docstring whole and as laid out (its numbered steps, its usage
    line), and every option's default."""


def argument_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's parser: ``--help`` prints ``doc`` (the module's docstring) and
    each option's help with its default."""
    return argparse.ArgumentParser(
        prog=f"python -m {module}", description=doc, formatter_class=_HelpFormatter
    )


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples_ms, n=100, method="inclusive")
    return {"p50_ms": round(q[49], 2), "p95_ms": round(q[94], 2), "p99_ms": round(q[98], 2)}


def service_env(db: DatabaseUrl, topology: Topology) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": db.conninfo,
        "AMQP_URL": AMQP.url,
        "AMQP_PREFIX": topology.prefix,
        "LOG_LEVEL": "WARNING",
    }


def machine() -> dict[str, object]:
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0]}


__all__ = [
    "AMQP",
    "BIN",
    "machine",
    "percentiles",
    "scratch_database",
    "scratch_topology",
    "service_env",
]
