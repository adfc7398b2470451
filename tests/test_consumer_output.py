"""What a person sees running `consumer`, as they would run Celery's worker: a line
per job that succeeded (bounded at high rates), a warning for a queue no handler
names, one line for an --app that does not import, a warning when a handler's
return value cannot be kept."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine

from hybrid_jobs.consumers.journal import LINES_PER_SECOND
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.jobs import enqueue, enqueue_many, job, wait_for_state, wait_until_all
from tests.support.processes import fleet, refused, running, service_env

pytestmark = pytest.mark.timeout(120)

APP = ["--app", "tests.apps.basic"]


def test_every_job_that_succeeds_gets_a_line_and_a_burst_is_counted(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    pg.execute("CREATE TABLE effects (key text, job_id uuid, worker text, pid int)")
    with fleet(env, APP) as (_, (consumer,)):
        one = enqueue(engine, "noop")
        two = enqueue(engine, "record", {"key": 1})  # completes in its own transaction
        asyncio.run(wait_for_state(pg, one, "SUCCEEDED"))
        asyncio.run(wait_for_state(pg, two, "SUCCEEDED"))
        lines = {
            e["job_id"]: e for e in consumer.events() if e["event"] == "consumer.job_succeeded"
        }
        assert set(lines) == {str(one), str(two)}
        assert {k: lines[str(one)][k] for k in ("job_type", "queue", "attempt")} == {
            "job_type": "noop",
            "queue": "default",
            "attempt": 1,
        }
        assert lines[str(one)]["ran_ms"] >= 0 and lines[str(two)]["job_type"] == "record"
        burst = 500
        enqueue_many(engine, [NewJob("noop", {}) for _ in range(burst)])
        asyncio.run(wait_until_all(pg, "SUCCEEDED", burst + 2))
        assert consumer.stop() == 0
    events = consumer.events()
    listed = sum(1 for e in events if e["event"] == "consumer.job_succeeded")
    counted = sum(e["count"] for e in events if e["event"] == "consumer.jobs_succeeded")
    assert listed + counted == burst + 2, "every job is listed or counted, once"
    assert counted > 0, f"a burst is counted past {LINES_PER_SECOND} lines a second"


def test_a_queue_no_handler_names_draws_a_warning(
    env: dict[str, str],
) -> None:
    with running("consumer", [*APP, "--queue", "defualt"], env, "consumer.started") as consumer:
        (warning,) = [
            e for e in consumer.events() if e["event"] == "consumer.queue_without_handlers"
        ]
    assert warning["queues"] == ["defualt"]
    assert warning["not_consumed"] == ["default", "sync"]
    with running("consumer", APP, env, "consumer.started") as quiet:
        pass
    assert not quiet.has_event("consumer.queue_without_handlers")


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import consumers\nundefined_name\n", "NameError: name 'undefined_name' is not defined"),
        ("def broken(:\n    pass\n", "SyntaxError: invalid syntax"),
        ("import no_such_dependency_xyz\n", "No module named 'no_such_dependency_xyz'"),
        ("raise RuntimeError('needs SETTING')\n", "RuntimeError: needs SETTING"),
    ],
)
def test_an_app_that_fails_to_import_is_one_line_naming_the_module_and_the_error(
    tmp_path: Path,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
    source: str,
    expected: str,
) -> None:
    (tmp_path / "brokenapp.py").write_text(source)
    env = service_env(db_url, amqp_url, topology, PYTHONPATH=str(tmp_path))
    done = refused("consumer", ["--app", "brokenapp"], env)
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("consumer: --app brokenapp: importing it failed: "), done.stderr
    assert expected in done.stderr and "brokenapp.py, line " in done.stderr


def test_a_value_returned_after_the_jobs_transaction_draws_one_warning(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    with fleet(env, APP) as (_, (consumer,)):
        ids = enqueue_many(engine, [NewJob("tx_returns", {}) for _ in range(3)])
        for job_id in ids:
            asyncio.run(wait_for_state(pg, job_id, "SUCCEEDED"))
    assert {str(job(pg, i)["result"]) for i in ids} == {"{'stored': 'yes'}"}
    (warning,) = [e for e in consumer.events() if e["event"] == "consumer.result_ignored"]
    assert warning["job_type"] == "tx_returns" and "tx.set_result" in warning["action"]
