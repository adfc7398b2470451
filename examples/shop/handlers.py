"""The shop's handlers: run them with `consumer --app examples.shop.handlers`.

send_receipt is the seeds' example: a checkout enqueues it in the same transaction
as the order, and the handler "sends" the receipt by writing a sent_emails row
keyed on the order, in the transaction that completes the job. A re-run (a crash
after sending, a duplicated wake-up) finds the effect key taken and sends nothing.

render_report moves a report through stages a status page can show, then
publishes the result pointer in the same transaction that completes the job.

total_sales runs on a schedule (examples/shop/checkout.py sets it up with
outbox.schedule): each occurrence writes one row of the running total, keyed on
the occurrence, so a repeated run changes nothing.
"""

from __future__ import annotations

import asyncio
import random

from hybrid_jobs import consumers


@consumers.handler("send_receipt", queue="mail", max_attempts=8, timeout=30)
async def send_receipt(job: consumers.Job) -> None:
    order_id = job.payload["order_id"]
    if job.attempt == 1 and random.random() < 0.1:
        # A flaky mail server: the job retries with backoff and then goes through.
        raise ConnectionError("SMTP server timed out")
    async with job.transaction() as tx:
        if await tx.once(f"receipt:{order_id}"):
            await tx.execute(
                "INSERT INTO sent_emails (order_id, recipient, job_id) VALUES (%s, %s, %s)",
                [order_id, job.payload["email"], job.id],
            )


STAGES = ("GATHERING", "RENDERING", "UPLOADING")


@consumers.handler("render_report", queue="reports", max_attempts=3, timeout=120)
async def render_report(job: consumers.Job) -> None:
    report_id = job.payload["report_id"]
    for stage in STAGES:
        if job.cancel_requested:
            raise consumers.Cancel(f"stopped before {stage}")
        # Progress is honest about stages, not a made-up percentage. It is written
        # outside the job's transaction on purpose: a status page sees it live.
        async with job.connection() as conn:
            await conn.execute(
                "UPDATE reports SET stage = %s WHERE report_id = %s", [stage, report_id]
            )
        await job.progress(STAGES.index(stage) + 1, total=len(STAGES), stage=stage)
        await asyncio.sleep(0.05)
    async with job.transaction() as tx:
        await tx.execute(
            "UPDATE reports SET stage = 'PUBLISHED', artifact_uri = %s, published_at = now()"
            " WHERE report_id = %s",
            [f"reports/{report_id}/report.csv", report_id],
        )
        tx.set_result({"artifact_uri": f"reports/{report_id}/report.csv"})


@consumers.handler("total_sales", queue="reports", max_attempts=3)
async def total_sales(job: consumers.Job) -> dict[str, int]:
    """A recurring job: the shop's takings so far, one row per occurrence."""
    async with job.transaction() as tx:
        cur = await tx.execute("SELECT count(*), coalesce(sum(total_cents), 0) FROM orders")
        orders, cents = await cur.fetchone()
        await tx.execute(
            "INSERT INTO sales_totals (occurrence, orders, total_cents) VALUES (%s, %s, %s)"
            " ON CONFLICT (occurrence) DO NOTHING",
            [job.payload.get("occurrence") or str(job.id), orders, cents],
        )
        tx.set_result({"orders": orders, "total_cents": cents})
    return {"orders": orders, "total_cents": cents}
