"""Effect keys (tx.once) outlive the jobs that marked them: retention of finished
jobs leaves them, so a later job with the same key skips the effect; they have a
retention of their own (relay --keep-effects), by age, batched, off by default.
Real relay, consumer and PostgreSQL."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine

from hybrid_jobs import consumers
from hybrid_jobs.consumers import Registry
from hybrid_jobs.plumbing.config import AmqpUrl, ConfigError, DatabaseUrl
from hybrid_jobs.relay.retention import delete_old_effects
from hybrid_jobs.relay.settings import RelaySettings
from hybrid_jobs.schema.queries import EFFECT_RETENTION_DELETE
from hybrid_jobs.schema.topology import Topology
from tests.support.inproc import consumer_running, relay_running
from tests.support.jobs import enqueue, job, until, wait_for_state
from tests.support.plans import plan

DAY = 86400.0


def receipts(registry: Registry) -> None:
    """The README's example: a receipt sent once per order, whatever re-runs."""

    @registry.handler("send_receipt")
    async def send_receipt(j: consumers.Job) -> dict[str, bool]:
        async with j.transaction() as tx:
            first = await tx.once(f"receipt:{j.payload['order_id']}")
            if first:
                await tx.execute(
                    "INSERT INTO sent_emails (order_id) VALUES (%s)", [j.payload["order_id"]]
                )
            tx.set_result({"sent": first})
        return {"sent": first}


async def test_a_job_deleted_by_retention_leaves_its_effect_key_for_the_next(
    db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, engine: Engine, pg
) -> None:
    """Order 42's receipt job runs and is deleted by retention (--keep-finished),
    which frees its dedup key; the same order enqueued again is a new job, and its
    tx.once says the receipt went already. Retention used to delete the key with
    the job: the receipt went twice."""
    pg.execute("CREATE TABLE sent_emails (order_id int NOT NULL)")
    registry = Registry()
    receipts(registry)
    services = (db_url, amqp_url, topology)
    async with (
        relay_running(*services, keep_finished=600, retention_interval=0.1),
        consumer_running(*services, registry),
    ):
        first = enqueue(engine, "send_receipt", {"order_id": 42}, dedup_key="receipt:42")
        assert (await wait_for_state(pg, first, "SUCCEEDED"))["result"] == {"sent": True}
        pg.execute(
            "UPDATE jobs SET finished_at = now() - interval '1 hour' WHERE job_id = %s", [first]
        )
        await until(
            lambda: pg.execute("SELECT 1 FROM jobs WHERE job_id = %s", [first]).fetchone() is None,
            "retention to delete the job",
        )
        again = enqueue(engine, "send_receipt", {"order_id": 42}, dedup_key="receipt:42")
        assert again != first, "its dedup key was freed with it"
        assert (await wait_for_state(pg, again, "SUCCEEDED"))["result"] == {"sent": False}
    assert pg.execute("SELECT count(*) FROM sent_emails").fetchone() == (1,)
    assert pg.execute("SELECT effect_key, job_id FROM job_effects").fetchall() == [
        ("receipt:42", first)
    ], "the key still names the job that did the effect"
    assert job(pg, again)["attempt_count"] == 1


async def test_keep_effects_forgets_keys_by_age_in_batches(
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
    engine: Engine,
    pg: psycopg.Connection,
    pool: AsyncConnectionPool[AsyncConnection],
) -> None:
    """2,500 keys two days old and 10 fresh ones, --keep-effects one day: the old go,
    1,000 a transaction, oldest first by their own index; a key forgotten is marked
    afresh by the next job that has it (the documented cost of a horizon)."""
    pg.execute(
        "INSERT INTO job_effects (effect_key, job_id, created_at)"
        " SELECT 'old:' || g, gen_random_uuid(), now() - interval '2 days' - g * interval '1 s'"
        " FROM generate_series(1, 2500) AS g"
    )
    pg.execute(
        "INSERT INTO job_effects (effect_key, job_id)"
        " SELECT 'new:' || g, gen_random_uuid() FROM generate_series(1, 10) AS g"
    )
    pg.execute("ANALYZE job_effects")
    found = plan(pg, EFFECT_RETENTION_DELETE, {"keep_seconds": DAY, "limit": 1000})
    assert "job_effects_created_idx" in str(found), "the oldest read from their index"
    assert await delete_old_effects(pool, keep_seconds=DAY, batch=1000) == 2500
    assert pg.execute(
        "SELECT count(*), bool_and(effect_key LIKE 'new:%%') FROM job_effects"
    ).fetchone() == (10, True)
    assert await delete_old_effects(pool, keep_seconds=DAY, batch=1000) == 0

    pg.execute("CREATE TABLE sent_emails (order_id int NOT NULL)")
    pg.execute("INSERT INTO job_effects (effect_key, job_id, created_at) VALUES"
               " ('receipt:7', gen_random_uuid(), now() - interval '2 days')")  # fmt: skip
    registry = Registry()
    receipts(registry)
    services = (db_url, amqp_url, topology)
    async with (
        relay_running(*services, keep_finished=DAY, keep_effects=DAY, retention_interval=0.1),
        consumer_running(*services, registry),
    ):
        await until(
            lambda: pg.execute("SELECT 1 FROM job_effects WHERE effect_key = 'receipt:7'")
            .fetchone() is None,
            "the relay to forget the old key",
        )  # fmt: skip
        late = enqueue(engine, "send_receipt", {"order_id": 7})
        assert (await wait_for_state(pg, late, "SUCCEEDED"))["result"] == {"sent": True}


def test_keep_effects_must_outlive_the_jobs(db_url: DatabaseUrl, amqp_url: AmqpUrl) -> None:
    with pytest.raises(ConfigError, match="keep_effects must be at least keep_finished"):
        RelaySettings(db_url, amqp_url, keep_finished=7 * DAY, keep_effects=DAY)
    with pytest.raises(ConfigError, match="keep_effects must be positive"):
        RelaySettings(db_url, amqp_url, keep_finished=1, keep_effects=0)
    assert RelaySettings(db_url, amqp_url).keep_effects is None, "for ever, by default"
