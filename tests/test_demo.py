"""The shop demo end to end: real relay and consumer processes running
examples.shop.handlers, checkouts committing orders with their jobs."""

from __future__ import annotations

import asyncio

import psycopg
from sqlalchemy import Engine

from examples.shop.checkout import checkout, create_shop_tables, summary
from plumbing.config import AmqpUrl, DatabaseUrl
from schema.topology import Topology
from tests.support.jobs import wait_until_all
from tests.support.processes import running, service_env


def test_every_order_gets_exactly_one_receipt(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    create_shop_tables(engine)
    env = service_env(db_url, amqp_url, topology)
    app = ["--app", "examples.shop.handlers", "--concurrency", "20"]
    with (
        running("relay", [], env, "relay.started"),
        running("consumer", app, env, "consumer.started"),
    ):
        for i in range(60):
            checkout(engine, f"c{i}@example.com", 1000 + i, with_report=i % 20 == 0)
        asyncio.run(wait_until_all(pg, "SUCCEEDED", 63, timeout=90))
    result = summary(engine)
    assert result["orders"] == result["receipts_sent"] == 60
    assert result["reports"] == {"PUBLISHED": 3}
    unmatched = pg.execute(
        "SELECT count(*) FROM orders o LEFT JOIN sent_emails e USING (order_id)"
        " WHERE e.order_id IS NULL"
    ).fetchone()[0]
    assert unmatched == 0
