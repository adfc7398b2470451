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
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
import yarl
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.check import check, violations
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema.topology import Topology
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
# One job in eight takes a token of one of two buckets under a prefix limit (each
# its own bucket), arriving a little faster than the limit lets them start, so they
# wait RATE_LIMITED through the faults: the starts of each, by the claims' clock,
# must never exceed burst + rate x t in any window (jobctl.check:
# rate_limit_exceeded).
RATE_LIMIT, RATE, BURST = "sms:*", 4.0, 3.0
RATE_BUCKETS = ["sms:acme", "sms:globex"]


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
            outbox.set_rate_limit(session, RATE_LIMIT, rate=RATE, burst=BURST)
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
                    with Session(engine) as session, session.begin():
                        made = produce(session, rng, enqueued, min(due - enqueued, 500))
                    enqueued += made
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
            settling = time.monotonic()
            settled = wait_terminal(db, enqueued, settle_timeout)
            settle_seconds = round(time.monotonic() - settling, 1)
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
        report = check(db.conninfo, expected=enqueued)
        report.update(planned_outcomes(db))
    report["cap_peak"] = sampler.peak
    report["cap_samples"] = sampler.samples
    report["cap_exceeded"] = max(0, sampler.peak - CAP)
    report["key_limit_exceeded"] = sampler.key_over
    report["settled"] = settled
    report["settle_seconds"] = settle_seconds
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


@dataclass(frozen=True)
class Node:
    """One job of a dependency graph: its type, its parents (indexes of earlier
    nodes) and what a failed parent does to it."""

    job_type: str
    parents: tuple[int, ...] = ()
    on_parent_failure: str = "cancel"


_E, _P = "effect", "permanent"  # permanent: raises Permanent, ends FAILED
# Small graphs, each written in one transaction with the flat jobs around it: a
# chain, a diamond with a tail, a fan-in, and diamonds whose B fails, D cancelled
# with its tail under "cancel" and run under "run".
SHAPES: dict[str, tuple[tuple[Node, ...], int]] = {
    "chain": ((Node(_E), Node(_E, (0,)), Node(_E, (1,))), 3),
    "diamond": ((Node(_E), Node(_E, (0,)), Node(_E, (0,)), Node(_E, (1, 2)), Node(_E, (3,))), 3),
    "fan_in": ((*[Node(_E)] * 12, Node(_E, tuple(range(12)))), 1),
    "diamond_failing": (
        (Node(_E), Node(_P, (0,)), Node(_E, (0,)), Node(_E, (1, 2)), Node(_E, (3,))),
        1,
    ),
    "diamond_failing_run": (
        (Node(_E), Node(_P, (0,)), Node(_E, (0,)), Node(_E, (1, 2), "run"), Node(_E, (3,))),
        1,
    ),
}
# The odds that the next job drawn is a whole graph instead: about 1 job in 7 of
# the traffic is then a graph's (about 5 jobs each).
GRAPH_ODDS = 0.03


def planned(nodes: tuple[Node, ...]) -> list[str]:
    """The state each node must end in: a permanent failure FAILED, a job under
    "cancel" of a parent that did not succeed CANCELLED, every other SUCCEEDED."""
    ends: list[str] = []
    for node in nodes:
        if node.job_type == _P:
            ends.append("FAILED")
        elif node.on_parent_failure == "cancel" and any(
            ends[p] != "SUCCEEDED" for p in node.parents
        ):
            ends.append("CANCELLED")
        else:
            ends.append("SUCCEEDED")
    return ends


def depth(nodes: tuple[Node, ...], i: int) -> int:
    return 1 + max((depth(nodes, p) for p in nodes[i].parents), default=-1)


def produce(session: Session, rng: random.Random, first: int, count: int) -> int:
    """Enqueues about ``count`` jobs in the session's transaction, flat ones and (a
    share of them) whole graphs, layer by layer: after= names only jobs enqueued
    already. Returns how many."""
    # Per job: its layer, the job, and its parents as positions in this list.
    specs: list[tuple[int, outbox.NewJob, list[int]]] = []
    while len(specs) < count:
        n = first + len(specs)
        if rng.random() >= GRAPH_ODDS:
            specs.append((0, job(rng, n), []))
            continue
        shape = rng.choices(list(SHAPES), weights=[w for _, w in SHAPES.values()])[0]
        nodes = SHAPES[shape][0]
        # Not the capped tenant's: a child released behind its backlog would
        # lengthen the settle by the whole backlog (caps are the flat jobs' to test).
        base, tenant = len(specs), rng.choice([t for t in TENANTS if t != CAPPED])
        for i, (node, end) in enumerate(zip(nodes, planned(nodes), strict=True)):
            payload = job_payload(rng, n + i) | {"graph": shape}
            if end != "SUCCEEDED":
                payload["expect"] = end
            new = outbox.NewJob(
                node.job_type, payload, tenant=tenant, on_parent_failure=node.on_parent_failure
            )
            specs.append((depth(nodes, i), new, [base + p for p in node.parents]))
    ids: dict[int, uuid.UUID] = {}
    for layer in sorted({d for d, _, _ in specs}):
        chosen = [(at, new, parents) for at, (d, new, parents) in enumerate(specs) if d == layer]
        batch = [replace(new, after=[ids[p] for p in parents]) for _, new, parents in chosen]
        made = outbox.enqueue_many(session, batch)
        ids.update(zip([at for at, _, _ in chosen], made, strict=True))
    return len(specs)


def planned_outcomes(db: DatabaseUrl) -> dict[str, Any]:
    """Every job must end as the workload planned it: SUCCEEDED (the budget lets
    every effect succeed), but for the graphs' permanent failures (FAILED) and the
    jobs that depend on them under "cancel" (CANCELLED, code PARENT_FAILED, never
    started: the checker's dependency counts prove the last). Also how much of the
    traffic was graphs, so a run that carried none cannot pass for one that did."""
    with psycopg.connect(db.conninfo, autocommit=True) as conn:

        def one(sql: str) -> Any:
            return conn.execute(sql).fetchone()[0]  # type: ignore[index]

        return {
            "not_succeeded": one(
                "SELECT count(*) FROM jobs WHERE state <> coalesce(payload->>'expect', 'SUCCEEDED')"
            ),
            "graph_jobs": one("SELECT count(*) FROM jobs WHERE payload ? 'graph'"),
            "dependency_edges": one("SELECT count(*) FROM job_dependencies"),
            "children_succeeded": one(
                "SELECT count(DISTINCT child_id) FROM job_dependencies AS d"
                " JOIN jobs AS c ON c.job_id = d.child_id WHERE c.state = 'SUCCEEDED'"
            ),
            "cancelled_for_a_parent": one(
                "SELECT count(*) FROM jobs WHERE last_error_code = 'PARENT_FAILED'"
            ),
            "rate_limited_starts": one(
                "SELECT count(*) FROM job_attempts AS a JOIN jobs AS j USING (job_id)"
                " WHERE j.rate_limit IS NOT NULL"
            ),
        }


def job(rng: random.Random, i: int) -> outbox.NewJob:
    tenant = rng.choice(TENANTS)
    if rng.random() < 0.25:
        key = rng.choice(KEYS)
        limit = 2 if key.endswith(("0", "5")) else 1
        return outbox.NewJob("effect", job_payload(rng, i), tenant=tenant, key=key, key_limit=limit)
    if rng.random() < 1 / 6:  # of the three quarters left: one job in eight
        bucket = rng.choice(RATE_BUCKETS)
        return outbox.NewJob("effect", job_payload(rng, i), tenant=tenant, rate_limit=bucket)
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
