"""The shop demo end to end: real relay and consumer processes running
examples.shop.handlers, checkouts committing orders with their jobs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import psycopg
from sqlalchemy import Engine

from examples.shop.checkout import (
    SALES_SCHEDULE,
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


def test_the_checkout_command_leaves_no_schedule_behind(
    pg: psycopg.Connection, env: dict[str, str]
) -> None:
    """The checkout as scripts/run's banner suggests it, against a relay and a
    consumer of the shop: it schedules the sales total, reports it, and when it ends
    the schedule is gone, so nothing keeps enqueuing total_sales jobs into the
    database (scripts/run's default is the user's own)."""
    app = ["--app", "examples.shop.handlers", "--concurrency", "20"]
    with (
        running("relay", [], env, "relay.started"),
        running("consumer", app, env, "consumer.started"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "examples.shop.checkout", "--count", "20", "--wait", "30"],
            env=env,
            cwd=Path(__file__).resolve().parents[1],
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["receipts_sent"] == 20 and result["sales_total_runs"] >= 1, result
    left = pg.execute("SELECT name FROM schedules").fetchall()
    assert left == [], f"the demo left {left} behind"
    assert pg.execute(
        "SELECT count(*) FROM schedule_fires WHERE schedule_name = %s", (SALES_SCHEDULE,)
    ).fetchone() == (0,)
