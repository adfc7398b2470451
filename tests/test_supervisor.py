"""`consumer --processes N`: a supervisor of N real worker processes. Jobs run in
every worker; a worker killed with -9 is restarted and its jobs come back through
their leases; workers recycled by job count or by memory are replaced and no job
runs twice; SIGTERM stops every worker gracefully; a supervisor killed with -9
leaves no worker behind."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine

from hybrid_jobs.jobctl.check import check, violations
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.apps.processes import RUNS_TABLE
from tests.support.jobs import attempts, enqueue_many, job, wait_for_state, wait_until_all
from tests.support.processes import Daemon, refused, running, service_env

pytestmark = pytest.mark.timeout(240)

APP = ["--app", "tests.apps.processes", "--concurrency", "4"]
LEASE = ["--lease-seconds", "2", "--heartbeat-seconds", "0.5"]
# Each job its own message, which RabbitMQ hands to the workers in turn.
ONE_ID_A_MESSAGE = ["--pack", "1"]
KINDS = {"async": ("run_async", "default"), "plain": ("run_plain", "sync")}


@pytest.fixture
def env(db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, pg: psycopg.Connection):
    pg.execute(RUNS_TABLE)
    return service_env(db_url, amqp_url, topology)


def enqueue(engine: Engine, job_type: str, n: int, queue: str = "default", **payload: Any):
    return enqueue_many(engine, [NewJob(job_type, dict(payload), queue=queue) for _ in range(n)])


def runs_per_job(pg: psycopg.Connection) -> Counter[int]:
    """How many jobs ran their handler once, twice...: {1: n} when none ran twice."""
    rows = pg.execute("SELECT count(*) FROM runs GROUP BY job_id").fetchall()
    return Counter(n for (n,) in rows)


def started(supervisor: Daemon) -> list[dict[str, Any]]:
    return [e for e in supervisor.events() if e["event"] == "consumer.process_started"]


def consuming(supervisor: Daemon) -> set[int]:
    """The pids of the workers that have started consuming."""
    return {e["pid"] for e in supervisor.events() if e["event"] == "consumer.started"}


def live_pids(supervisor: Daemon) -> set[int]:
    exited = {e["pid"] for e in supervisor.events() if e["event"] == "consumer.process_exited"}
    return {e["pid"] for e in started(supervisor)} - exited


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(condition, what: str, timeout: float = 30) -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def assert_ran_once_each(pg: psycopg.Connection, db_url: DatabaseUrl, ids: list[uuid.UUID]):
    report = check(db_url.conninfo, expected=len(ids), require_success=True)
    assert violations(report) == {}, report
    twice = [r[0] for r in pg.execute("SELECT job_id FROM jobs WHERE attempt_count > 1")]
    assert not twice, [
        [(a["worker"], a["outcome"], a["error_code"]) for a in attempts(pg, j)] for j in twice
    ]
    assert report["attempts_per_job"] == {1: len(ids)}, report
    assert runs_per_job(pg) == {1: len(ids)}, "a handler ran twice"


def test_two_processes_share_the_jobs_and_stop_together(
    env: dict[str, str], engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    with (
        running("relay", [], env, "relay.started"),
        running("consumer", [*APP, "--processes", "2"], env, "consumer.supervisor_started") as sup,
    ):
        wait_for(lambda: len(consuming(sup)) == 2, "two workers consuming")
        workers = {e["pid"] for e in started(sup)}
        ids = enqueue(engine, "run_async", 150, seconds=0.02)
        ids += enqueue(engine, "run_plain", 150, queue="sync", seconds=0.02)
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(ids)))
        assert sup.stop() == 0
    assert {pid for (pid,) in pg.execute("SELECT DISTINCT pid FROM runs")} == workers
    assert_ran_once_each(pg, db_url, ids)
    events = sup.events()
    # Each worker's lines name its slot; each stopped gracefully, and so did the rest.
    for slot in (1, 2):
        mine = [e for e in events if e.get("child") == slot]
        assert {"consumer.started", "consumer.stopped"} <= {e["event"] for e in mine}
    exits = [e for e in events if e["event"] == "consumer.process_exited"]
    assert sorted(e["status"] for e in exits) == ["exit 0", "exit 0"]
    assert events[-1]["event"] == "consumer.supervisor_stopped"
    assert not any(alive(pid) for pid in workers)


def test_a_killed_worker_is_restarted_and_its_jobs_recovered(
    env: dict[str, str], engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    args = [*APP, *LEASE, "--processes", "2"]
    with (
        running("relay", [*ONE_ID_A_MESSAGE, "--sweep-interval", "0.3"], env, "relay.started"),
        running("consumer", args, env, "consumer.supervisor_started") as sup,
    ):
        wait_for(lambda: len(consuming(sup)) == 2, "two workers consuming")
        ids = enqueue(engine, "run_async", 8, seconds=1.5)
        owner = wait_for(
            lambda: pg.execute("SELECT lease_owner FROM jobs WHERE state = 'RUNNING'").fetchone(),
            "a running job",
        )[0]
        victim = int(owner.split(":")[1])
        assert victim in {e["pid"] for e in started(sup)}
        held = pg.execute(
            "SELECT job_id FROM jobs WHERE lease_owner LIKE %s", [f"%:{victim}:%"]
        ).fetchall()
        os.kill(victim, signal.SIGKILL)
        crashed = sup.wait_for_event("consumer.process_crashed")
        assert (crashed["pid"], crashed["status"]) == (victim, "SIGKILL")
        wait_for(lambda: len(live_pids(sup)) == 2 and victim not in live_pids(sup), "a new one")
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(ids), timeout=60))
        assert sup.stop() == 0
    for (job_id,) in held:
        history = [(a["outcome"], a["error_code"]) for a in attempts(pg, job_id)]
        assert history == [("RETRY_WAIT", "LEASE_EXPIRED"), ("SUCCEEDED", None)], history
        assert victim not in {a["worker"].split(":")[1] for a in attempts(pg, job_id)[1:]}
    assert violations(check(db_url.conninfo, expected=len(ids), require_success=True)) == {}


@pytest.mark.parametrize("kind", KINDS)
def test_recycling_by_job_count_replaces_workers_and_runs_each_job_once(
    kind: str, env: dict[str, str], engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    job_type, queue = KINDS[kind]
    args = [*APP, "--processes", "2", "--max-jobs-per-process", "20"]
    with (
        running("relay", [], env, "relay.started"),
        running("consumer", args, env, "consumer.supervisor_started") as sup,
    ):
        ids = enqueue(engine, job_type, 200, queue=queue, seconds=0.05)
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(ids), timeout=120))
        assert sup.stop() == 0
    assert_ran_once_each(pg, db_url, ids)
    events = sup.events()
    recycled = [e for e in events if e["event"] == "consumer.recycling"]
    assert len(recycled) >= 5 and {e["reason"] for e in recycled} == {"max_jobs"}
    # Every one of them left cleanly, after finishing what it held: nothing given back.
    exits = [e["status"] for e in events if e["event"] == "consumer.process_exited"]
    assert set(exits) == {"exit 0"} and len(exits) == len(started(sup))
    assert not [e for e in events if e["event"] == "consumer.gave_back"]
    pids = {pid for (pid,) in pg.execute("SELECT DISTINCT pid FROM runs")}
    assert len(pids) >= len(recycled), "the jobs ran in the replacements too"
    per_process = Counter(pid for (pid,) in pg.execute("SELECT pid FROM runs"))
    # A worker stops claiming at its limit; what one claim took on top still runs.
    assert max(per_process.values()) <= 20 + 4 * 2, per_process


def resident_mib(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.parametrize("kind", KINDS)
def test_recycling_by_memory_replaces_a_worker_that_grows(
    kind: str, env: dict[str, str], engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    job_type, queue = ("hog", "default") if kind == "async" else ("hog_plain", "sync")
    with running("consumer", APP, env, "consumer.started") as plain_worker:
        baseline = resident_mib(plain_worker.pid)
    limit = round(baseline + 64)
    args = [*APP, "--processes", "2", "--max-memory-per-process", f"{limit}MiB"]
    with (
        running("relay", [], env, "relay.started"),
        running("consumer", args, env, "consumer.supervisor_started") as sup,
    ):
        ids = enqueue(engine, job_type, 40, queue=queue, mib=16, seconds=0.2)
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(ids), timeout=120))
        assert sup.stop() == 0
    assert_ran_once_each(pg, db_url, ids)
    recycled = [e for e in sup.events() if e["event"] == "consumer.recycling"]
    assert len(recycled) >= 3, f"baseline {baseline:.0f} MiB, limit {limit} MiB"
    assert all(e["reason"] == "max_memory" and e["rss_mib"] >= limit for e in recycled)
    exits = [e["status"] for e in sup.events() if e["event"] == "consumer.process_exited"]
    assert set(exits) == {"exit 0"}


def test_sigterm_gives_back_what_every_worker_still_runs(
    env: dict[str, str], engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    args = [*APP, "--processes", "2", "--drain-seconds", "0.5"]
    with (
        running("relay", ONE_ID_A_MESSAGE, env, "relay.started"),
        running("consumer", args, env, "consumer.supervisor_started") as sup,
    ):
        wait_for(lambda: len(consuming(sup)) == 2, "two workers consuming")
        ids = enqueue(engine, "run_async", 8, seconds=600)
        wait_for(
            lambda: (
                pg.execute(
                    "SELECT count(DISTINCT split_part(lease_owner, ':', 2)) FROM jobs"
                    " WHERE state = 'RUNNING'"
                ).fetchone()[0]
                == 2
            ),
            "long jobs running in both workers",
        )
        sup.signal(signal.SIGINT)  # Ctrl-C: the supervisor passes it on
        assert sup.proc.wait(30) == 0
    events = sup.events()
    gave_back = [e for e in events if e["event"] == "consumer.gave_back"]
    assert {e["child"] for e in gave_back} == {1, 2}
    for job_id in ids:
        row = job(pg, job_id)
        assert (row["state"], row["attempt_count"], row["lease_owner"]) in {
            ("QUEUED", 0, None),
        }, row
    assert not any(alive(e["pid"]) for e in started(sup))


def test_a_killed_supervisor_leaves_no_worker_behind(
    env: dict[str, str], engine: Engine, pg: psycopg.Connection
) -> None:
    sup = Daemon("consumer", [*APP, "--processes", "2"], env)
    try:
        wait_for(lambda: len(consuming(sup)) == 2, "two workers consuming")
        workers = [e["pid"] for e in started(sup)]
        ids = enqueue(engine, "run_async", 1, seconds=0.5)
        with running("relay", [], env, "relay.started"):
            asyncio.run(wait_for_state(pg, ids[0], "RUNNING"))
            sup.kill()
            wait_for(lambda: not any(alive(pid) for pid in workers), "the workers to stop", 60)
    finally:
        sup.kill()
    gone = [e for e in sup.events() if e["event"] == "consumer.supervisor_gone"]
    assert {e["child"] for e in gone} == {1, 2}
    assert job(pg, ids[0])["state"] == "SUCCEEDED", "the running job finished in the drain"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--processes", "0"], "--processes must be at least 1"),
        (["--processes", "2", "--max-jobs-per-process", "0"], "must be at least 1"),
        (["--max-memory-per-process", "lots"], "--max-memory-per-process: 'lots' is not a size"),
        (["--processes", "2", "--app", "no.such.module"], "--app no.such.module: cannot import"),
    ],
)
def test_bad_process_flags_are_refused_in_one_line(
    env: dict[str, str], args: list[str], message: str
) -> None:
    done = refused("consumer", [*APP, *args], env)
    assert message in done.stderr, done.stderr
