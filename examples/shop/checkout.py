"""The shop's producer: checkouts that write an order and enqueue its receipt in one
transaction, then a summary of what ran.

    python -m examples.shop.checkout [--count 200] [--wait 60]

DATABASE_URL names the database (the same one the relay and consumer use).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

import outbox
from plumbing.config import ConfigError, database_url

SHOP_TABLES = """
CREATE TABLE IF NOT EXISTS orders (
    order_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email       text NOT NULL,
    total_cents integer NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS sent_emails (
    order_id  bigint PRIMARY KEY REFERENCES orders,
    recipient text NOT NULL,
    job_id    uuid NOT NULL,
    sent_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS reports (
    report_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stage        text NOT NULL DEFAULT 'QUEUED',
    artifact_uri text,
    published_at timestamptz
);
"""


def create_shop_tables(engine: Engine) -> None:
    with engine.begin() as conn:
        for statement in SHOP_TABLES.split(";"):
            if statement.strip():
                conn.execute(text(statement))


def checkout(engine: Engine, email: str, total_cents: int, with_report: bool) -> None:
    """One checkout: the order, its receipt job and maybe a report, in one commit."""
    with Session(engine) as session, session.begin():
        order_id = session.execute(
            text("INSERT INTO orders (email, total_cents) VALUES (:e, :t) RETURNING order_id"),
            {"e": email, "t": total_cents},
        ).scalar_one()
        outbox.enqueue(
            session,
            "send_receipt",
            {"order_id": order_id, "email": email},
            queue="mail",
            dedup_key=f"receipt:{order_id}",
        )
        if with_report:
            report_id = session.execute(
                text("INSERT INTO reports DEFAULT VALUES RETURNING report_id")
            ).scalar_one()
            outbox.enqueue(session, "render_report", {"report_id": report_id}, queue="reports")


def summary(engine: Engine) -> dict[str, object]:
    with engine.connect() as conn:
        jobs = conn.execute(
            text("SELECT job_type, state, count(*) FROM jobs GROUP BY 1, 2 ORDER BY 1, 2")
        ).all()
        retried = conn.execute(
            text("SELECT count(DISTINCT job_id) FROM job_attempts WHERE attempt > 1")
        ).scalar_one()
        orders = conn.execute(text("SELECT count(*) FROM orders")).scalar_one()
        emails = conn.execute(text("SELECT count(*) FROM sent_emails")).scalar_one()
        reports = conn.execute(
            text("SELECT stage, count(*) FROM reports GROUP BY stage ORDER BY stage")
        ).all()
    return {
        "jobs": {f"{t} {s}": n for t, s, n in jobs},
        "jobs_that_needed_a_retry": retried,
        "orders": orders,
        "receipts_sent": emails,
        "reports": dict(reports),  # type: ignore[arg-type]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="Run a burst of checkouts.")
    parser.add_argument("--count", type=int, default=200, help="checkouts to run")
    parser.add_argument("--wait", type=float, default=60, help="seconds to wait for the jobs")
    args = parser.parse_args()
    try:
        engine = create_engine(database_url().sqlalchemy)
    except ConfigError as exc:
        sys.exit(f"checkout: {exc}")
    create_shop_tables(engine)
    started = time.monotonic()
    for i in range(args.count):
        checkout(engine, f"customer{i}@example.com", random.randint(500, 50_000), i % 20 == 0)
    print(
        f"checkout: {args.count} checkouts committed in {time.monotonic() - started:.2f}s",
        file=sys.stderr,
    )
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            open_jobs = conn.execute(
                text(
                    "SELECT count(*) FROM jobs"
                    " WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
                )
            ).scalar_one()
        if open_jobs == 0:
            break
        time.sleep(0.5)
    print(json.dumps(summary(engine), indent=2))


if __name__ == "__main__":
    main()
