"""The shop demo end to end: real relay and consumer processes running
examples.shop.handlers, checkouts committing orders with their jobs."""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg
from sqlalchemy import Engine

from examples.shop.checkout import (
    checkout,
    create_shop_tables,
    schedule_sales_total,
    settled,
    summary,
)
from tests.support.processes import running


def test_every_order_gets_exactly_one_receipt(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    create_shop_tables(engine)
    schedule_sales_total(engine, every=timedelta(seconds=1))
    app = ["--app", "examples.shop.handlers", "--concurrency", "20"]
    with (
        running("relay", [], env, "relay.started"),
        running("consumer", app, env, "consumer.started"),
    ):
        for i in range(60):
            checkout(engine, f"c{i}@example.com", 1000 + i, i % 20 == 0, shop=f"shop-{i % 3}")
        deadline = time.monotonic() + 60
        while not settled(engine, 60):
            assert time.monotonic() < deadline, "the recurring sales total never counted them all"
            time.sleep(0.2)
    result = summary(engine)
    assert result["orders"] == result["receipts_sent"] == 60
    assert result["reports"] == {"PUBLISHED": 3}
    assert result["sales_total_runs"] >= 1 and result["orders_in_latest_sales_total"] == 60
    progress = pg.execute(
        "SELECT progress, result FROM jobs WHERE job_type = 'render_report' LIMIT 1"
    ).fetchone()
    assert progress[0] == {"done": 3, "total": 3, "stage": "UPLOADING"}
    assert progress[1]["artifact_uri"].startswith("reports/")
    unmatched = pg.execute(
        "SELECT count(*) FROM orders o LEFT JOIN sent_emails e USING (order_id)"
        " WHERE e.order_id IS NULL"
    ).fetchone()[0]
    assert unmatched == 0
