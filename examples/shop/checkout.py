"""The shop's producer: checkouts that write an order and enqueue its receipt in one
transaction, then a summary of what ran.

    python -m examples.shop.checkout [--count 200] [--wait 60]

DATABASE_URL names the database (the same one the relay and consumer use). While it
runs, a schedule (sales-total, every 5 s) totals the takings; it removes the schedule
when it ends, so nothing of the demo keeps enqueuing afterwards.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from datetime import timedelta

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import ConfigError, database_url

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
CREATE TABLE IF NOT EXISTS sales_totals (
    occurrence  text PRIMARY KEY,
    orders      bigint NOT NULL,
    total_cents bigint NOT NULL,
    computed_at timestamptz NOT NULL DEFAULT now()
);
"""

# The demo's recurring job: the takings so far, every few seconds (a real shop
# would say cron="0 2 * * *", timezone="Europe/Berlin"). The checkout removes it
# when it ends: left behind, it would go on enqueuing a total_sales job every 5 s
# into whatever database this was (scripts/run's default is the one your own app
# uses), where they would wait as NO_HANDLER once no consumer of the shop runs.
SALES_SCHEDULE = "sales-total"


def create_shop_tables(engine: Engine) -> None:
    with engine.begin() as conn:
        for statement in SHOP_TABLES.split(";"):
            if statement.strip():
                conn.execute(text(statement))


def schedule_sales_total(engine: Engine, every: timedelta = timedelta(seconds=5)) -> None:
    with Session(engine) as session, session.begin():
        outbox.schedule(session, SALES_SCHEDULE, "total_sales", {}, every=every, queue="reports")


def unschedule_sales_total(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        outbox.unschedule(session, SALES_SCHEDULE)


def checkout(
    engine: Engine, email: str, total_cents: int, with_report: bool, shop: str | None = None
) -> None:
    """One checkout: the order, its receipt job and maybe a report, in one commit.
    ``shop`` is the tenant: each shop's receipts get their fair share of the
    mail queue, whatever another shop's burst."""
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
            tenant=shop,
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
        fires = conn.execute(
            text("SELECT count(*) FROM schedule_fires WHERE schedule_name = :n"),
            {"n": SALES_SCHEDULE},
        ).scalar_one()
        latest_total = conn.execute(
            text("SELECT orders FROM sales_totals ORDER BY computed_at DESC LIMIT 1")
        ).scalar()
    return {
        "jobs": {f"{t} {s}": n for t, s, n in jobs},
        "jobs_that_needed_a_retry": retried,
        "orders": orders,
        "receipts_sent": emails,
        "reports": dict(reports),  # type: ignore[arg-type]
        "sales_total_runs": fires,
        "orders_in_latest_sales_total": latest_total,
    }


def settled(engine: Engine, orders: int) -> bool:
    """Every order's jobs are done, and a sales total has counted every order."""
    with engine.connect() as conn:
        open_jobs = conn.execute(
            text(
                "SELECT count(*) FROM jobs WHERE job_type <> 'total_sales'"
                " AND state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
            )
        ).scalar_one()
        counted = conn.execute(text("SELECT max(orders) FROM sales_totals")).scalar()
    return open_jobs == 0 and (counted or 0) >= orders


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
    schedule_sales_total(engine)
    try:
        started = time.monotonic()
        for i in range(args.count):
            checkout(
                engine,
                f"customer{i}@example.com",
                random.randint(500, 50_000),
                with_report=i % 20 == 0,
                shop=f"shop-{i % 3}",
            )
        print(
            f"checkout: {args.count} checkouts committed in {time.monotonic() - started:.2f}s",
            file=sys.stderr,
        )
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline and not settled(engine, args.count):
            time.sleep(0.5)
        print(json.dumps(summary(engine), indent=2))
    finally:
        # Also on Ctrl-C: the schedule is the demo's, not the database's.
        unschedule_sales_total(engine)


if __name__ == "__main__":
    main()
