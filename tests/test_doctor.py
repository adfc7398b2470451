"""`jobctl doctor` on the real services: a healthy installation passes, and each
thing wrong (a dropped index, a database behind this release, a queue of another
type, a setting that breaks durability, no consumer) is named with what to do,
with exit status 1; never a password."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import aio_pika
import psycopg
import pytest
from psycopg.types.json import Jsonb
from sqlalchemy import Engine

from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.queries import RELAY_SEEN, WORKER_SEEN
from hybrid_jobs.schema.revisions import head
from hybrid_jobs.schema.topology import Declared, QueueType, Topology
from tests.conftest import migrate
from tests.support import processes
from tests.support.jobs import enqueue, until
from tests.support.processes import running

APP = ["--app", "tests.apps.basic"]
SECRET = "hunter2"


def doctor(env: dict[str, str], tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """`jobctl doctor --json` as a user runs it: its exit status and its report."""
    done = processes.jobctl("doctor", "--json", *args, url=env["DATABASE_URL"], cwd=tmp_path, **env)
    assert done.stdout.count("\n") == 1, done.stdout + done.stderr  # one JSON object
    report = json.loads(done.stdout)
    assert report["exit_code"] == done.returncode
    return done.returncode, report


def titled(report: dict[str, Any], title: str) -> dict[str, Any]:
    found = [f for f in report["findings"] if f["title"] == title]
    assert found, (title, [f["title"] for f in report["findings"]])
    return found[0]


def problems(report: dict[str, Any]) -> list[str]:
    return [f["title"] for f in report["findings"] if f["level"] == "problem"]


async def declare(amqp_url: AmqpUrl, topology: Topology, queue: str) -> None:
    """The exchanges, the dead-letter queue and a job queue, as the relay and the
    consumers declare them."""
    connection = await aio_pika.connect(amqp_url.url)
    async with connection:
        await Declared(await connection.channel(), topology).queue(queue)


def announce_consumer(pg: psycopg.Connection, queues: list[str], job_types: list[str]) -> None:
    """A consumer's row, written by the statement a consumer announces itself with."""
    pg.execute(
        WORKER_SEEN,
        {
            "worker": f"{socket.gethostname()}:1:test",
            "host": socket.gethostname(),
            "pid": 1,
            "queues": queues,
            "job_types": job_types,
            "concurrency": 10,
            "prefetch": 10,
            "stopping": False,
            "counts": "{}",
            "tenants": [],
            "worker_ttl": 60,
        },
    )


def announce_relay(pg: psycopg.Connection) -> None:
    params = {"host": socket.gethostname(), "pid": 1, "published": 0, "failing": Jsonb({})}
    pg.execute(RELAY_SEEN, {"relay": "test-relay", "connected": True, **params})


async def test_a_healthy_installation_exits_0_and_a_warning_fails_only_with_strict(
    env: dict[str, str], pg: psycopg.Connection, tmp_path: Path
) -> None:
    # A warning this server has whatever its configuration, so --strict has one to
    # fail on.
    pg.execute("ALTER TABLE outbox SET (autovacuum_enabled = false)")
    with (
        running("relay", [], env, "relay.started"),
        running("consumer", APP, env, "consumer.started"),
    ):

        def both_seen() -> bool:
            relays = pg.execute("SELECT count(*) FROM relays WHERE broker_connected").fetchone()
            workers = pg.execute("SELECT count(*) FROM workers").fetchone()
            return bool(relays and relays[0] and workers and workers[0])

        await until(both_seen, "the relay and the consumer to announce themselves")
        code, report = doctor(env, tmp_path)
        strict, _ = doctor(env, tmp_path, "--strict")
        text = processes.jobctl("doctor", url=env["DATABASE_URL"], cwd=tmp_path, **env)
    assert code == 0, problems(report)
    assert problems(report) == []
    assert report["counts"]["problem"] == 0
    titled(
        report,
        f'database "{DatabaseUrl.parse(env["DATABASE_URL"]).dbname}" is at this '
        f"release's migration ({head()})",
    )
    titled(report, "the tables, columns, indexes and constraints match")
    titled(report, "1 relay(s) live, 1 connected to RabbitMQ")
    prefix = env["AMQP_PREFIX"]
    titled(report, f"exchange {prefix} is direct, durable")
    titled(report, f"queue {prefix}.default is classic, durable")
    assert titled(report, "autovacuum is off for table outbox")["level"] == "warning"
    assert strict == 1
    assert text.returncode == 0, text.stdout
    assert text.stdout.splitlines()[-1].endswith(": exit 0")


async def test_a_dropped_index_is_named_with_how_to_recreate_it(
    env: dict[str, str], pg: psycopg.Connection, tmp_path: Path
) -> None:
    pg.execute("DROP INDEX jobs_claimable_idx")
    code, report = doctor(env, tmp_path)
    assert code == 1
    found = titled(report, "index jobs_claimable_idx on jobs is missing")
    assert found["level"] == "problem"
    assert (
        "CREATE INDEX CONCURRENTLY jobs_claimable_idx ON jobs (queue, state, run_after)"
        in (found["fix"])
    )
    assert "the tables, columns, indexes and constraints match" not in [
        f["title"] for f in report["findings"]
    ]


async def test_a_dropped_check_constraint_is_named_too(
    env: dict[str, str], pg: psycopg.Connection, tmp_path: Path
) -> None:
    """alembic's comparison leaves CHECK constraints out; the doctor does not."""
    pg.execute("ALTER TABLE jobs DROP CONSTRAINT jobs_state_valid")
    code, report = doctor(env, tmp_path)
    assert code == 1
    found = titled(report, "constraint jobs_state_valid on jobs is missing")
    assert "ALTER TABLE jobs ADD CONSTRAINT jobs_state_valid CHECK (state IN (" in found["fix"]


@pytest.mark.parametrize(
    ("revision", "said"),
    [(None, "has no jobs table (not migrated)"), ("0001", "is at migration 0001")],
)
async def test_a_database_behind_this_release_says_run_jobctl_migrate(
    env: dict[str, str], empty_db_url: DatabaseUrl, tmp_path: Path, revision: str | None, said: str
) -> None:
    if revision is not None:
        migrate(empty_db_url, revision)
    env["DATABASE_URL"] = empty_db_url.conninfo
    code, report = doctor(env, tmp_path)
    assert code == 1
    (found,) = [f for f in report["findings"] if f["check"] == "schema"]
    assert found["title"].startswith(f'database "{empty_db_url.dbname}" {said}')
    assert found["level"] == "problem"
    assert "run `jobctl migrate`" in found["fix"]
    assert head() in found["detail"]
    # Behind head, every later table would be "missing": the drift is not compared
    # (the one schema finding above is all).


async def test_a_queue_declared_with_another_type_is_a_problem(
    env: dict[str, str],
    pg: psycopg.Connection,
    amqp_url: AmqpUrl,
    topology: Topology,
    tmp_path: Path,
) -> None:
    assert topology.queue_type is QueueType.CLASSIC
    await declare(amqp_url, Topology(topology.prefix, QueueType.QUORUM), "default")
    announce_consumer(pg, ["default"], ["noop"])
    code, report = doctor(env, tmp_path)
    assert code == 1
    name = topology.queue_name("default")
    found = titled(report, f"queue {name} is a quorum queue, but AMQP_QUEUE_TYPE is classic")
    assert found["level"] == "problem"
    assert "AMQP_QUEUE_TYPE=quorum" in found["fix"] and f"delete_queue {name}" in found["fix"]
    # The same topology, read with the type it was declared with, is right.
    code, report = doctor(env, tmp_path, "--queue-type", "quorum")
    titled(report, f"queue {name} is quorum, durable")


@pytest.mark.parametrize("where", ["database", "client"])
async def test_synchronous_commit_off_is_a_problem_saying_where_it_was_set(
    env: dict[str, str], pg: psycopg.Connection, db_url: DatabaseUrl, tmp_path: Path, where: str
) -> None:
    if where == "database":
        pg.execute(f'ALTER DATABASE "{db_url.dbname}" SET synchronous_commit = off')
        undo = f'ALTER DATABASE "{db_url.dbname}" RESET synchronous_commit'
    else:
        env["PGOPTIONS"] = "-c synchronous_commit=off"
        undo = "PGOPTIONS"
    code, report = doctor(env, tmp_path)
    assert code == 1
    found = titled(report, "synchronous_commit is off")
    assert found["level"] == "problem"
    assert undo in found["fix"]


async def test_idle_in_transaction_timeout_0_is_a_warning_with_the_value_to_set(
    env: dict[str, str], pg: psycopg.Connection, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    pg.execute(f'ALTER DATABASE "{db_url.dbname}" SET idle_in_transaction_session_timeout = 0')
    _, report = doctor(env, tmp_path)
    found = titled(report, "idle_in_transaction_session_timeout is 0 (never)")
    assert found["level"] == "warning"
    assert "idle_in_transaction_session_timeout = '5min'" in found["fix"]
    pg.execute(f'ALTER DATABASE "{db_url.dbname}" SET idle_in_transaction_session_timeout = 300000')
    _, report = doctor(env, tmp_path)
    assert titled(report, "idle_in_transaction_session_timeout is 300 s")["level"] == "ok"


async def test_no_consumer_seen_is_a_problem_naming_the_queue_whose_jobs_wait(
    env: dict[str, str],
    pg: psycopg.Connection,
    engine: Engine,
    amqp_url: AmqpUrl,
    topology: Topology,
    tmp_path: Path,
) -> None:
    await declare(amqp_url, topology, "default")
    announce_relay(pg)
    enqueue(engine, "noop", queue="default")
    code, report = doctor(env, tmp_path)
    assert code == 1
    assert titled(report, "no consumer is live")["level"] == "problem"
    waiting = titled(report, "1 job(s) wait in queue default, and no live consumer serves it")
    assert "--queue default" in waiting["fix"]
    # A consumer on the queue without the job's handler: the job still waits.
    announce_consumer(pg, ["default"], ["something_else"])
    code, report = doctor(env, tmp_path)
    assert code == 1
    titled(
        report,
        "1 job(s) of type noop wait in queue default, and none of its 1 live consumer(s) has a "
        "handler for it",
    )
    assert "no consumer is live" not in problems(report)


async def test_a_consumer_whose_lease_lapsed_is_not_live_and_doctor_says_why(
    env: dict[str, str],
    pg: psycopg.Connection,
    amqp_url: AmqpUrl,
    topology: Topology,
    tmp_path: Path,
) -> None:
    await declare(amqp_url, topology, "default")
    announce_relay(pg)
    announce_consumer(pg, ["default"], ["noop"])
    code, report = doctor(env, tmp_path)
    assert "no consumer is live" not in problems(report)
    # The sweeper took a lease of it back (killed or frozen) after it was last heard
    # from: it is not live, though its row is fresh, and doctor says why.
    pg.execute("UPDATE workers SET lease_lapsed_at = last_seen_at + interval '1 second'")
    code, report = doctor(env, tmp_path)
    assert code == 1
    assert titled(report, "no consumer is live")["level"] == "problem"
    stale = titled(report, "1 consumer(s) stopped being heard from")
    assert stale["level"] == "warning"
    assert f"{socket.gethostname()}:1" in stale["detail"], stale
    assert ", a lease of it lapsed" in stale["detail"], stale
    # Heard from again: live, and nothing said of it.
    announce_consumer(pg, ["default"], ["noop"])
    pg.execute("UPDATE workers SET last_seen_at = lease_lapsed_at + interval '1 second'")
    code, report = doctor(env, tmp_path)
    assert "no consumer is live" not in problems(report)
    assert not [f for f in report["findings"] if "stopped being heard from" in f["title"]]


async def test_json_has_one_object_with_each_finding_and_the_counts(
    env: dict[str, str], tmp_path: Path
) -> None:
    code, report = doctor(env, tmp_path, "--consumers", "2", "--relays", "1")
    assert set(report) == {"database", "amqp", "strict", "exit_code", "counts", "findings"}
    assert report["strict"] is False and report["exit_code"] == code
    assert set(report["counts"]) == {"ok", "note", "warning", "problem"}
    assert sum(report["counts"].values()) == len(report["findings"])
    for finding in report["findings"]:
        assert set(finding) == {"check", "level", "title", "detail", "fix"}
        assert finding["level"] in report["counts"]
    connections = [f for f in report["findings"] if f["title"].startswith("max_connections")]
    assert "2 consumer process(es)" in connections[0]["detail"]


async def test_too_many_consumers_for_max_connections_is_a_problem(
    env: dict[str, str], pg: psycopg.Connection, tmp_path: Path
) -> None:
    (most,) = pg.execute("SELECT current_setting('max_connections')::int").fetchone() or (0,)
    _, report = doctor(env, tmp_path, "--consumers", str(most), "--relays", "2")
    found = titled(
        report, "the relays and consumers would open more connections than the server takes"
    )
    assert found["level"] == "problem"
    assert f"{most} consumer process(es)" in found["detail"]


async def test_the_passwords_are_never_printed(
    env: dict[str, str], db_url: DatabaseUrl, tmp_path: Path
) -> None:
    # Trust authentication ignores the PostgreSQL password; RabbitMQ refuses this one.
    database = f"postgresql://root:pg-{SECRET}@127.0.0.1:5432/{db_url.dbname}"
    env["AMQP_URL"] = f"amqp://guest:amqp-{SECRET}@127.0.0.1:5672/"
    env["DATABASE_URL"] = database
    for args in ([], ["--json"], ["--database-url", database]):
        done = processes.jobctl("doctor", *args, url=database, cwd=tmp_path, **env)
        assert done.returncode == 1
        assert SECRET not in done.stdout + done.stderr
        assert "cannot reach RabbitMQ at 127.0.0.1:5672" in done.stdout
