"""The chaos soak: jobs flow through 2 relays and 3 consumers while processes are
killed, frozen and restarted and connections are cut; then everything settles and
the invariant checker says whether any promise broke.

    python -m tests.chaos.run [--jobs 20000] [--seconds 120] [--seed N]

Runs against the local services in a scratch database and broker namespace of its
own. Prints the checker's report plus what chaos was done; exits 1 on a violation.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
import yarl
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import outbox
from jobctl.check import check, violations
from plumbing.config import DatabaseUrl
from schema.topology import Topology
from tests.chaos.app import EFFECTS_TABLE
from tests.support.processes import Daemon, service_env
from tests.support.proxy import TcpProxy
from tests.support.scratch import scratch_database, scratch_topology
from tests.support.services import AMQP_URL

LEASE = 3.0
RELAY_ARGS = [
    "--sweep-interval",
    "0.5",
    "--rewake-interval",
    "3",
    "--poll-interval",
    "0.5",
]
CONSUMER_ARGS = [
    "--app",
    "tests.chaos.app",
    "--lease-seconds",
    str(LEASE),
    "--heartbeat-seconds",
    "1",
    "--drain-seconds",
    "2",
    "--concurrency",
    "20",
]
APP_NAMES = ("relay", "relay-listen", "consumer", "consumer-sync")
# Tenants of the workload: one capped (its cap is sampled throughout the run and must
# never be exceeded), one weighted, and jobs of no tenant.
CAPPED, CAP = "capped", 4
TENANTS: list[str | None] = [None, CAPPED, "heavy", "light"]
# One job in four is about one of a few entity keys (key_limit 1, a few with 2):
# the leases of a key are sampled throughout the run and must never exceed it.
KEYS = [f"account:{i}" for i in range(24)]


@dataclass
class Role:
    name: str
    command: str
    args: list[str]
    env: dict[str, str]
    log_dir: str
    daemon: Daemon | None = None
    stopped_until: float = 0.0
    dead_until: float = 0.0
    logs: list[str] = field(default_factory=list)

    def start(self) -> None:
        self.daemon = Daemon(self.command, self.args, self.env, self.log_dir)
        self.logs.append(str(self.daemon.log_path))

    @property
    def alive(self) -> bool:
        return self.daemon is not None and self.daemon.proc.poll() is None


@contextmanager
def scratch() -> Iterator[tuple[DatabaseUrl, Topology]]:
    with scratch_database("chaos") as db, scratch_topology(["default"], "chaos") as topology:
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            conn.execute(EFFECTS_TABLE)
        engine = create_engine(db.sqlalchemy)
        with Session(engine) as session, session.begin():
            outbox.set_tenant_limit(session, CAPPED, max_running=CAP)
            outbox.set_tenant_limit(session, "light", weight=3.0)
        engine.dispose()
        yield db, topology


class CapSampler:
    """Samples how many of the capped tenant's jobs hold a lease, every few ms, for
    the whole run: the cap must hold at every moment, not just at the end."""

    def __init__(self, db: DatabaseUrl) -> None:
        self.db = db
        self.peak = 0
        self.samples = 0
        self.key_over = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        sql = (
            "SELECT count(*) FROM jobs WHERE tenant = %s"
            " AND state IN ('RUNNING', 'CANCEL_REQUESTED')"
        )
        # each key's leases beyond its limit, at one instant (one snapshot)
        keys = (
            "SELECT coalesce(max(n - key_limit), 0) FROM ("
            " SELECT count(*) AS n, min(key_limit) AS key_limit FROM jobs"
            " WHERE key IS NOT NULL AND state IN ('RUNNING', 'CANCEL_REQUESTED')"
            " GROUP BY key) AS k"
        )
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.db.conninfo, autocommit=True) as conn:
                    while not self.stop.is_set():
                        running = conn.execute(sql, [CAPPED]).fetchone()[0]  # type: ignore[index]
                        over = conn.execute(keys).fetchone()[0]  # type: ignore[index]
                        self.key_over = max(self.key_over, over)
                        self.peak, self.samples = max(self.peak, running), self.samples + 1
                        time.sleep(0.01)
            except psycopg.OperationalError:  # terminated with the others: reconnect
                time.sleep(0.05)


def terminate_backends(db: DatabaseUrl) -> int:
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = ANY(%s)",
            [list(APP_NAMES)],
        ).fetchall()
    return len(rows)


def run(jobs: int, seconds: float, seed: int, settle_timeout: float = 240) -> dict[str, Any]:
    rng = random.Random(seed)
    done: Counter[str] = Counter()
    broker = yarl.URL(AMQP_URL)
    proxy = TcpProxy(broker.host or "127.0.0.1", broker.port or 5672)
    with scratch() as (db, topology):
        env = service_env(db, f"amqp://127.0.0.1:{proxy.port}/", topology, LOG_LEVEL="INFO")
        log_dir = tempfile.mkdtemp(prefix="chaos-logs-")
        roles = [Role(f"relay{i}", "relay", RELAY_ARGS, env, log_dir) for i in range(2)]
        roles += [Role(f"consumer{i}", "consumer", CONSUMER_ARGS, env, log_dir) for i in range(3)]
        for role in roles:
            role.start()
        engine = create_engine(db.sqlalchemy, pool_pre_ping=True)
        sampler = CapSampler(db)
        sampler.thread.start()
        enqueued = 0
        started = time.monotonic()
        produce_until = started + seconds * 0.8
        next_chaos = started + 2
        try:
            # Jobs arrive at a steady rate through most of the run, so faults land
            # while work is in flight.
            while time.monotonic() < started + seconds:
                now = time.monotonic()
                due = (
                    jobs if now >= produce_until else int(jobs * (now - started) / (seconds * 0.8))
                )
                if due > enqueued:
                    batch = [job(rng, i) for i in range(enqueued, min(due, enqueued + 500))]
                    with Session(engine) as session, session.begin():
                        outbox.enqueue_many(session, batch)
                    enqueued += len(batch)
                for role in roles:
                    if role.stopped_until and now >= role.stopped_until and role.daemon:
                        role.daemon.signal(signal.SIGCONT)
                        role.stopped_until = 0
                    if not role.alive and now >= role.dead_until:
                        role.start()
                        done["restart"] += 1
                if now >= next_chaos:
                    done[inflict(rng, roles, proxy, db, now)] += 1
                    next_chaos = now + rng.uniform(0.5, 2.5)
                time.sleep(0.05)
            # Let it settle: everything running, no more faults.
            for role in roles:
                if role.daemon and role.stopped_until:
                    role.daemon.signal(signal.SIGCONT)
                if not role.alive:
                    role.start()
            settled = wait_terminal(db, enqueued, settle_timeout)
        finally:
            sampler.stop.set()
            for role in roles:
                if role.alive and role.daemon:
                    role.daemon.signal(signal.SIGCONT)
                    role.daemon.signal(signal.SIGTERM)
            for role in roles:
                if role.daemon:
                    try:
                        role.daemon.proc.wait(30)
                    except subprocess.TimeoutExpired:
                        role.daemon.kill()
            engine.dispose()
            proxy.close()
        report = check(db.conninfo, expected=enqueued, require_success=True)
    report["cap_peak"] = sampler.peak
    report["cap_samples"] = sampler.samples
    report["cap_exceeded"] = max(0, sampler.peak - CAP)
    report["key_limit_exceeded"] = sampler.key_over
    report["settled"] = settled
    report["chaos"] = dict(done)
    report["seconds"] = round(time.monotonic() - started, 1)
    report["fence_rejections_seen"] = fence_rejections(roles)
    report["logs"] = log_dir
    return report


def fence_rejections(roles: list[Role]) -> dict[str, int]:
    """What the workers' logs say the fence turned away: proof the stale writes were
    attempted, next to the checker's proof that none landed."""
    seen: Counter[str] = Counter()
    for role in roles:
        for path in role.logs:
            for line in open(path, errors="replace"):  # noqa: SIM115
                for event in ("consumer.lease_lost", "consumer.stale_outcome"):
                    if f'"event": "{event}"' in line:
                        seen[event] += 1
    return dict(seen)


def job(rng: random.Random, i: int) -> outbox.NewJob:
    tenant = rng.choice(TENANTS)
    if rng.random() < 0.25:
        key = rng.choice(KEYS)
        limit = 2 if key.endswith(("0", "5")) else 1
        return outbox.NewJob("effect", job_payload(rng, i), tenant=tenant, key=key, key_limit=limit)
    return outbox.NewJob("effect", job_payload(rng, i), tenant=tenant)


def job_payload(rng: random.Random, i: int) -> dict[str, Any]:
    # One job in ten is slow, so a frozen or killed worker is usually holding some:
    # that is when a lease lapses mid-handler and the fence has work to do.
    seconds = rng.uniform(0.3, 1.5) if rng.random() < 0.1 else rng.uniform(0, 0.02)
    return {"key": f"k{i}", "fail_rate": 0.05, "seconds": round(seconds, 3)}


def inflict(
    rng: random.Random, roles: list[Role], proxy: TcpProxy, db: DatabaseUrl, now: float
) -> str:
    action = rng.choices(
        ["kill9", "freeze", "sigterm", "broker_cut", "db_terminate"],
        weights=[3, 3, 1, 2, 2],
    )[0]
    live = [r for r in roles if r.alive and not r.stopped_until]
    if action in ("kill9", "freeze", "sigterm") and not live:
        return "skipped"
    if action == "kill9":
        role = rng.choice(live)
        role.daemon.kill()  # type: ignore[union-attr]
        role.dead_until = now + rng.uniform(0.2, 2.0)
    elif action == "freeze":
        role = rng.choice(live)
        role.daemon.signal(signal.SIGSTOP)  # type: ignore[union-attr]
        # Sometimes well past the lease: the frozen worker comes back stale.
        role.stopped_until = now + rng.choice(
            [rng.uniform(0.5, 2), rng.uniform(LEASE + 1, LEASE * 2.5)]
        )
    elif action == "sigterm":
        rng.choice(live).daemon.signal(signal.SIGTERM)  # type: ignore[union-attr]
    elif action == "broker_cut":
        proxy.cut()
    else:
        terminate_backends(db)
    return action


def wait_terminal(db: DatabaseUrl, expected: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        while time.monotonic() < deadline:
            open_jobs = conn.execute(
                "SELECT count(*) FROM jobs WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
            ).fetchone()[0]  # type: ignore[index]
            total = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]  # type: ignore[index]
            if open_jobs == 0 and total >= expected:
                return True
            time.sleep(0.5)
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    report = run(args.jobs, args.seconds, seed)
    report["seed"] = seed
    print(json.dumps(report, indent=2, default=str))
    bad = violations(report)
    sys.exit(1 if bad or not report["settled"] else 0)


if __name__ == "__main__":
    main()
