"""The relay and the consumers through PgBouncer in transaction mode, as run past one
machine: DATABASE_POOLER=transaction turns off what a transaction pooler cannot
carry (prepared statements, startup options), and DATABASE_LISTEN_URL gives the
relay's LISTEN a direct connection."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.check import check, violations
from hybrid_jobs.outbox import NewJob, bulk
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support import pgbouncer
from tests.support.jobs import enqueue_many, wait_until_all
from tests.support.processes import running, service_env

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not pgbouncer.available(), reason="pgbouncer is not installed"),
]


def test_relay_and_consumers_through_pgbouncer_in_transaction_mode(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    pg.execute("CREATE TABLE effects (key text PRIMARY KEY, job_id uuid, worker text, pid int)")
    with pgbouncer.pgbouncer() as port:
        pooled = db_url.conninfo.replace("127.0.0.1:5432", f"127.0.0.1:{port}")
        env = service_env(db_url, amqp_url, topology) | {
            "DATABASE_URL": pooled,
            "DATABASE_POOLER": "transaction",
            "DATABASE_LISTEN_URL": db_url.conninfo,
        }
        app = ["--app", "tests.apps.basic", "--concurrency", "20"]
        with (
            running("relay", [], env, "relay.started"),
            running("consumer", app, env, "consumer.started"),
            running("consumer", app, env, "consumer.started"),
        ):
            jobs = [NewJob("noop", {}) for _ in range(300)]
            jobs += [NewJob("record", {"key": uuid.uuid4().hex}) for _ in range(100)]
            enqueue_many(engine, jobs)
            asyncio.run(wait_until_all(pg, "SUCCEEDED", 400, timeout=120))
        served = pgbouncer.transactions_served(port, db_url.dbname)
    assert served > 50, "the daemons' transactions went through PgBouncer"
    assert pg.execute("SELECT count(*) FROM effects").fetchone()[0] == 100
    assert violations(check(db_url.conninfo, require_success=True)) == {}


def test_a_batch_copied_through_pgbouncer_in_transaction_mode(
    pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """enqueue_many's COPY of a large batch, and the savepoint that takes a refused
    one back, through a transaction pooler, as a producer's engine would meet it."""
    jobs = [NewJob("noop", {"i": i}) for i in range(bulk.COPY_FROM + 100)]
    refused = [*jobs[:-1], NewJob("noop", {"nul": "a\x00b"})]
    with pgbouncer.pgbouncer() as port:
        pooled = create_engine(
            db_url.sqlalchemy.replace("127.0.0.1:5432", f"127.0.0.1:{port}"),
            connect_args={"prepare_threshold": None},
        )
        try:
            with Session(pooled) as session, session.begin():
                with pytest.raises(ValueError, match="NUL character"):
                    outbox.enqueue_many(session, refused)
                ids = outbox.enqueue_many(session, jobs)
        finally:
            pooled.dispose()
        served = pgbouncer.transactions_served(port, db_url.dbname)
    assert served >= 1, "the producer's transaction went through PgBouncer"
    assert pg.execute("SELECT count(*) FROM jobs").fetchone()[0] == len(ids) == len(jobs)
    assert pg.execute("SELECT count(*) FROM outbox").fetchone()[0] == len(jobs)
