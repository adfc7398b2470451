"""What the benchmarks share: a scratch database migrated to head and a scratch
broker namespace (from harness.scratch), percentiles, the environment, and
their command lines' help."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TypeVar

import aiormq
import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from harness.scratch import scratch_database, scratch_topology
from harness.services import ADMIN_URL
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.tables import CLAIMABLE_SQL, LEASED_SQL
from hybrid_jobs.schema.topology import Topology

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
AMQP = AmqpUrl.parse(os.environ.get("AMQP_URL", "amqp://127.0.0.1:5672/"))

V = TypeVar("V")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module's docstring whole and as laid out (its numbered steps, its usage
    line), and every option's default."""


def argument_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's parser: ``--help`` prints ``doc`` (the module's docstring) and
    each option's help with its default."""
    return argparse.ArgumentParser(
        prog=f"python -m {module}", description=doc, formatter_class=_HelpFormatter
    )


def fleet_options(
    parser: argparse.ArgumentParser, *, consumers: int | None = 2, concurrency: int | None = 50
) -> None:
    """The ``--consumers`` and ``--concurrency`` options of the benchmarks that start a
    fleet, with the given defaults; ``None`` leaves that option out."""
    if consumers is not None:
        parser.add_argument("--consumers", type=int, default=consumers, help="consumer processes")
    if concurrency is not None:
        parser.add_argument(
            "--concurrency", type=int, default=concurrency, help="slots per consumer"
        )


def pace_options(
    parser: argparse.ArgumentParser, *, rate: float = 200, seconds: float, what: str = "the run"
) -> None:
    """``--rate`` and ``--seconds`` of the benchmarks that commit jobs at a steady
    pace for a while (``what`` names that while in the help)."""
    parser.add_argument(
        "--rate", type=float, default=rate, help=f"jobs committed per second in {what}"
    )
    parser.add_argument("--seconds", type=float, default=seconds, help=f"length of {what}")


@contextmanager
def stopping(
    procs: list[subprocess.Popen[bytes]], files: Iterable[IO[bytes]] = ()
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Yield ``procs``; afterwards, however the block ends, terminate them all, then
    wait for each (so none outlives the scratch database dropped next), then close
    ``files`` (their logs, still written until they exit)."""
    try:
        yield procs
    finally:
        stop(procs, files)


def stop(procs: list[subprocess.Popen[bytes]], files: Iterable[IO[bytes]] = ()) -> None:
    """Terminate ``procs`` all, then wait for each, then close ``files``."""
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(60)
    for f in files:
        f.close()


class System:
    """A scratch database and broker namespace, and the relay and consumer processes
    of one benchmark run in them: each started from this environment's bin/ with
    their environment (``env``, plus a process's own). With ``logs``, each one's
    stderr goes to a file of its own there, ``p0.log``, ``p1.log``... in the order
    they started; without, to the benchmark's own."""

    def __init__(
        self, db: DatabaseUrl, topology: Topology, env: dict[str, str], logs: Path | None
    ) -> None:
        self.db = db
        self.topology = topology
        self.env = env
        self.logs = logs
        self.processes: list[subprocess.Popen[bytes]] = []
        self.files: list[IO[bytes]] = []

    def start(
        self, program: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        stderr = None
        if self.logs is not None:
            stderr = (self.logs / f"p{len(self.processes)}.log").open("wb")
            self.files.append(stderr)
        process = subprocess.Popen(
            [str(BIN / program), *args], env=self.env | (env or {}), stderr=stderr
        )
        self.processes.append(process)
        return process

    def stop(self) -> None:
        """Stop every process started so far (the database and namespace stay, for
        what the benchmark reads or runs after them)."""
        stop(self.processes, self.files)
        self.processes.clear()
        self.files.clear()


@contextmanager
def scratch_system(
    prefix: str = "scratch",
    queues: Iterable[str] = ("default",),
    *,
    env: dict[str, str] | None = None,
    logs: Path | None = None,
) -> Iterator[System]:
    """A database named for ``prefix`` and a namespace for ``queues``, both dropped
    afterwards; before that, every process started in them is stopped, so none
    outlives them."""
    with (
        scratch_database(prefix) as db,
        scratch_topology(list(queues)) as topology,
    ):
        system = System(db, topology, service_env(db, topology) | (env or {}), logs)
        try:
            yield system
        finally:
            system.stop()


@contextmanager
def committing(db: DatabaseUrl) -> Iterator[Session]:
    """A session on ``db`` whose transaction commits when the block ends, for a
    benchmark's set-up (its limits, caps, schedules, backlog): on an engine of its
    own, disposed afterwards, so no connection is left to the run it sets up."""
    engine = create_engine(db.sqlalchemy)
    try:
        with Session(engine) as session, session.begin():
            yield session
    finally:
        engine.dispose()


def against_first(rates: dict[str, float], ratio_key: str) -> dict[str, dict[str, float]]:
    """Each variant's drain rate (jobs/s) and, under ``ratio_key``, its ratio to the
    first variant's: the figures a benchmark comparing variants reports."""
    first = next(iter(rates.values()))
    return {
        "drain_jobs_per_s": {k: round(v) for k, v in rates.items()},
        ratio_key: {k: round(v / first, 2) for k, v in rates.items()},
    }


def drain_variants(
    benchmark: str,
    doc: str | None,
    variants: Mapping[str, V],
    drain: Callable[[V, argparse.Namespace], float],
    *,
    jobs: int,
    ratio_key: str,
) -> None:
    """The main of a benchmark that drains the same ``--jobs`` under each variant in
    turn (``drain(variant, args)`` gives the jobs/s of one, on a fleet of
    ``--consumers`` and ``--concurrency``) and reports each against the first."""
    parser = argument_parser(f"bench.{benchmark}", doc)
    parser.add_argument("--jobs", type=int, default=jobs, help="jobs drained per variant")
    fleet_options(parser)
    args = parser.parse_args()
    rates: dict[str, float] = {}
    for name, variant in variants.items():
        rates[name] = drain(variant, args)
    result: dict[str, Any] = {
        "jobs": args.jobs,
        **against_first(rates, ratio_key),
    }
    report(benchmark, result)


def per_count(counts: str, plan: Callable[[int], V]) -> dict[str, V]:
    """``plan(n)`` for each count of a comma-separated list ("1000,100000"), by count:
    the plans a benchmark prints at several sizes."""
    return {str(n): plan(n) for n in (int(c) for c in counts.split(",") if c)}


def rows_handled(node: dict[str, Any]) -> int:
    """The rows a plan node and those below it produced or filtered out, over all
    loops: the work done, free of the machine's speed."""
    rows = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
    rows += node.get("Rows Removed by Join Filter", 0)
    own = int(rows * node.get("Actual Loops", 1))
    return own + sum(rows_handled(child) for child in node.get("Plans", []))


def plan_summary(top: dict[str, Any]) -> dict[str, Any]:
    """Time, buffers and rows handled of one EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
    document's top entry: what the plan benchmarks keep of each plan."""
    plan = top["Plan"]
    return {
        "execution_ms": round(top["Execution Time"], 2),
        "planning_ms": round(top["Planning Time"], 2),
        "shared_buffers_hit": plan.get("Shared Hit Blocks", 0),
        "shared_buffers_read": plan.get("Shared Read Blocks", 0),
        "rows_handled": rows_handled(plan),
    }


@contextmanager
def explaining(
    conn: psycopg.Connection, sql: str, params: dict[str, Any]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """EXPLAIN ANALYZE of ``sql`` as text, then as JSON (the document's top entry),
    each in a transaction rolled back; the block runs inside the second, where what
    the statement wrote can still be read."""
    with conn.transaction(force_rollback=True):
        text = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params).fetchall()
    with conn.transaction(force_rollback=True):
        row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).fetchone()
        assert row is not None
        yield "\n".join(r[0] for r in text), row[0][0]


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples_ms, n=100, method="inclusive")
    return {"p50_ms": round(q[49], 2), "p95_ms": round(q[94], 2), "p99_ms": round(q[98], 2)}


# Whether any job is still to run or running: two probes of the partial indexes on
# waiting and on leased jobs. Waiting must not tax what it measures: a count of the
# jobs table every 10 ms took about a tenth of PostgreSQL's time during a drain
# (pg_stat_statements), more than the relay's statement that picks the wake-ups.
_JOBS_LEFT = f"""
SELECT EXISTS (SELECT 1 FROM jobs WHERE state IN ({CLAIMABLE_SQL}))
    OR EXISTS (SELECT 1 FROM jobs WHERE state IN ({LEASED_SQL}))
"""


def wait_all_done(conn: psycopg.Connection, timeout: float = 600, interval: float = 0.02) -> float:
    """Poll until no job waits or runs; returns that moment (perf_counter)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not conn.execute(_JOBS_LEFT).fetchone()[0]:  # type: ignore[index]
            return time.perf_counter()
        time.sleep(interval)
    raise TimeoutError(f"jobs still waiting or running after {timeout:.0f}s")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far (Linux /proc); 0 once it
    is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def service_env(db: DatabaseUrl, topology: Topology) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": db.conninfo,
        "AMQP_URL": AMQP.url,
        "AMQP_PREFIX": topology.prefix,
        "LOG_LEVEL": "WARNING",
    }


def autovacuum(conninfo: str = ADMIN_URL) -> str:
    """The autovacuum setting a figure was measured under (of the server, or of the
    database ``conninfo`` names): on in production, off on this project's CI, and
    the dead rows it leaves or clears move most figures."""
    with psycopg.connect(conninfo) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
    return str(row[0]) if row else "?"


AUTOVACUUM_CHOICES = ("server", "on", "off")


def autovacuum_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--autovacuum",
        choices=AUTOVACUUM_CHOICES,
        default="server",
        help="autovacuum for this run (on, as production runs it; off, as this project's "
        "CI does), set with ALTER SYSTEM and put back afterwards; server: as it is",
    )


@contextmanager
def autovacuum_set(value: str) -> Iterator[None]:
    """The server's autovacuum ``value`` ('on' or 'off'; 'server' leaves it) for the
    block: with ALTER SYSTEM and a reload (it is a server-wide setting), reset
    afterwards to what the configuration files say. Killed in between, a run
    leaves it set: ``ALTER SYSTEM RESET autovacuum; SELECT pg_reload_conf()``."""
    if value == "server":
        yield
        return
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET autovacuum = {'on' if value == 'on' else 'off'}")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET autovacuum")
            conn.execute("SELECT pg_reload_conf()")


def machine() -> dict[str, object]:
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0], "autovacuum": autovacuum()}


def report(benchmark: str, figures: dict[str, Any]) -> None:
    """Print the one JSON object a benchmark prints: its name, its figures, and the
    machine it ran on, last."""
    print(
        json.dumps({"benchmark": benchmark, **figures, "machine": machine()}, indent=2, default=str)
    )


def server_versions() -> dict[str, str]:
    """The PostgreSQL and RabbitMQ the benchmarks run against, as they report it."""
    with psycopg.connect(ADMIN_URL) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    postgresql = str(row[0]).split()[0] if row else "?"

    async def rabbitmq() -> str:
        connection = await aiormq.connect(AMQP.url)
        try:
            version = connection.server_properties.get("version", b"?")
        finally:
            await connection.close()
        return version.decode() if isinstance(version, bytes) else str(version)

    return {"postgresql": postgresql, "rabbitmq": asyncio.run(rabbitmq())}


__all__ = [
    "AMQP",
    "BIN",
    "System",
    "against_first",
    "committing",
    "drain_variants",
    "explaining",
    "fleet_options",
    "machine",
    "per_count",
    "percentiles",
    "report",
    "scratch_database",
    "scratch_system",
    "scratch_topology",
    "server_versions",
    "service_env",
    "stopping",
]
