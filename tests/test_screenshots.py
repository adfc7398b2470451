"""Screenshots of the dashboard for docs/screenshots/, over realistic traffic run by
a real relay and two consumers. Skipped unless asked for:

    JOBCTL_SCREENSHOTS=1 .venv/bin/pytest -q tests/test_screenshots.py

(JOBCTL_SCREENSHOTS may also name another folder to write to.)"""

from __future__ import annotations

import asyncio
import math
import os
import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.async_api import Page
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers.backoff import Backoff
from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.jobctl.metrics import CollectorSettings
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.dashboard import CHROMIUM, chromium, dashboard_served, sign_in
from tests.support.inproc import consumer_running, relay_running
from tests.support.jobs import enqueue, enqueue_many, states

ROOT = Path(__file__).resolve().parent.parent
WANTED = os.environ.get("JOBCTL_SCREENSHOTS", "")
OUT = ROOT / "docs" / "screenshots" if WANTED in ("1", "yes", "true") else Path(WANTED)

pytestmark = [
    pytest.mark.skipif(not WANTED, reason="set JOBCTL_SCREENSHOTS=1 to write docs/screenshots"),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]

# The charts cover two minutes, a point every two seconds (one hour, a point a
# minute by default), so that the traffic of a test fills most of them.
CHARTED = CollectorSettings(interval=1.0, history_span=120, history_resolution=2)
TRICKLE_SECONDS = 80.0
QUICK = Backoff(base=0.2, cap=0.5, jitter=0.5)
SHOPS = ("acme", "globex", "initech", None)


def traffic(release: asyncio.Event) -> Registry:
    """Handlers that behave like a small shop's: mostly quick, sometimes flaky,
    one kind that is simply broken for some inputs, one that runs for minutes."""
    registry = Registry()

    @registry.handler("send_receipt", queue="mail", max_attempts=4, backoff=QUICK)
    async def send_receipt(job: consumers.Job) -> dict[str, Any]:
        await asyncio.sleep(random.uniform(0.005, 0.06))
        if random.random() < 0.08:
            raise ConnectionError("SMTP server said 421: too many connections, try later")
        return {"message_id": f"<{job.id.hex[:12]}@mail.example>"}

    @registry.handler("thumbnail", queue="images", max_attempts=3, backoff=QUICK)
    async def thumbnail(job: consumers.Job) -> dict[str, Any]:
        await asyncio.sleep(random.uniform(0.05, 0.35))
        return _render(job.payload)

    @registry.handler("monthly_statement", queue="reports")
    async def monthly_statement(job: consumers.Job) -> dict[str, Any]:
        await job.progress(412, total=1300, stage="summing orders")
        await release.wait()
        return {"pages": 14}

    @registry.handler("charge_card", queue="billing")
    async def charge_card(job: consumers.Job) -> None:
        await asyncio.sleep(0.02)

    @registry.handler("sales_total", queue="reports")
    async def sales_total(job: consumers.Job) -> dict[str, Any]:
        await asyncio.sleep(0.03)
        return {"total_eur": 18234.5}

    return registry


def _render(payload: dict[str, Any]) -> dict[str, Any]:
    if payload["source"].endswith(".heic"):
        _decode(payload["source"])
    return {"width": 320, "height": 240}


def _decode(source: str) -> None:
    try:
        raise KeyError("heic")
    except KeyError:
        raise OSError(f"cannot identify image file {source!r}: no decoder for HEIC") from None


async def trickle(engine: Engine, seconds: float) -> None:
    """Receipts and thumbnails in waves that swell and ebb, a few a second, with a
    burst of undecodable uploads once: the shape a chart is there to show."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    n = 0
    while (left := end - loop.time()) > 0:
        phase = (seconds - left) / seconds
        receipts = int(4 + 14 * math.sin(math.pi * phase) ** 2 + random.randint(0, 4))
        burst = 0.55 < phase < 0.7
        jobs = [
            NewJob("send_receipt", {"order": 20_000 + n + k}, queue="mail", tenant=SHOPS[k % 4])
            for k in range(receipts)
        ] + [
            NewJob(
                "thumbnail",
                {"source": f"uploads/{30_000 + n + k}.{'heic' if burst and k % 2 else 'jpg'}"},
                queue="images",
                tenant=SHOPS[k % 3],
            )
            for k in range(random.randint(1, 3) + (4 if burst else 0))
        ]
        n += len(jobs)
        enqueue_many(engine, jobs)
        await asyncio.sleep(1.0)


async def shoot(page: Page, name: str, *, whole: bool = True) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(OUT / f"{name}.png"), full_page=whole)


async def test_write_screenshots(
    db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, engine: Engine, pg
) -> None:
    random.seed(11)
    release = asyncio.Event()
    registry = traffic(release)
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_running=4, max_queued=5000)
        outbox.set_tenant_limit(session, "globex", max_running=2, weight=2.0)
        outbox.set_tenant_limit(session, "initech", max_running=8, weight=0.5)
        outbox.schedule(
            session,
            "nightly-statements",
            "monthly_statement",
            {"scope": "all shops"},
            cron="0 3 * * *",
            timezone="Europe/Berlin",
            queue="reports",
        )
        outbox.schedule(
            session, "sales-total", "sales_total", None, every=timedelta(seconds=2), queue="reports"
        )
        outbox.schedule(
            session, "purge-carts", "purge_carts", {"older_than_days": 30}, cron="*/15 * * * *"
        )
        outbox.pause_schedule(session, "purge-carts")
        outbox.pause_queue(session, "billing", by="ops (alice)")
    async with dashboard_served(db_url, collector=CHARTED) as served:
        async with asyncio.timeout(30):
            while served.collector.status.rounds["collected"] < 1:
                await asyncio.sleep(0.05)
        async with (
            relay_running(db_url, amqp_url, topology),
            consumer_running(
                db_url,
                amqp_url,
                topology,
                registry,
                queues=("mail", "images"),
                concurrency=8,
                heartbeat_seconds=2,
            ),
            consumer_running(
                db_url,
                amqp_url,
                topology,
                registry,
                queues=("reports", "billing"),
                concurrency=4,
                heartbeat_seconds=2,
            ),
        ):
            await trickle(engine, TRICKLE_SECONDS)
            jobs = [
                NewJob(
                    "send_receipt",
                    {"order": 10_000 + n, "to": f"customer{n}@example.com"},
                    queue="mail",
                    tenant=SHOPS[n % 4],
                )
                for n in range(240)
            ] + [
                NewJob(
                    "thumbnail",
                    {"source": f"uploads/{8000 + n}.{'heic' if n % 7 == 3 else 'jpg'}"},
                    queue="images",
                    tenant=SHOPS[n % 3],
                    priority=1 if n % 5 == 0 else 0,
                )
                for n in range(60)
            ]
            enqueue_many(engine, jobs)
            for shop in ("acme", "initech", "globex"):
                enqueue(engine, "monthly_statement", {"shop": shop}, queue="reports", tenant=shop)
            for n in range(6):
                enqueue(engine, "charge_card", {"invoice": 500 + n}, queue="billing", tenant="acme")
            later = [
                enqueue(
                    engine,
                    "send_receipt",
                    {"order": 11_000 + n},
                    queue="mail",
                    run_after=timedelta(hours=1),
                )
                for n in range(4)
            ]
            with Session(engine) as session, session.begin():
                for job_id in later[:2]:
                    outbox.request_cancel(session, job_id)
            # Mail and images settle, statements run, the schedule fires a few times.
            async with asyncio.timeout(120):
                while not settled(pg):
                    await asyncio.sleep(0.2)
            assert states(pg).get("FAILED", 0) > 0
            assert await served.collector.collect_once()

            async with chromium(refresh_seconds=60) as browser:
                page = await browser.new_page()
                await sign_in(page, served.base)
                await shoot(page, "overview")
                await page.get_by_test_id("charts").screenshot(path=str(OUT / "charts.png"))
                await page.goto(f"{served.base}/jobs")
                await shoot(page, "jobs", whole=False)
                (failed,) = pg.execute(
                    "SELECT job_id FROM jobs WHERE state = 'FAILED' AND job_type = 'thumbnail'"
                    " ORDER BY finished_at DESC LIMIT 1"
                ).fetchone()
                await page.goto(f"{served.base}/jobs/{failed}")
                await page.get_by_test_id("traceback").last.locator("summary").click()
                await shoot(page, "job-failed")
                (running,) = pg.execute(
                    "SELECT job_id FROM jobs WHERE state = 'RUNNING' LIMIT 1"
                ).fetchone()
                await page.goto(f"{served.base}/jobs/{running}")
                await shoot(page, "job-running")
                await page.goto(f"{served.base}/failed")
                await page.locator("input[name=job]").first.check()
                await shoot(page, "failed")
                for name in ("schedules", "tenants", "keys", "workers"):
                    await page.goto(f"{served.base}/{name}")
                    await shoot(page, name)
            release.set()


SETTLED = """
SELECT count(*) FILTER (WHERE state IN ('QUEUED', 'RETRY_WAIT', 'RUNNING')
                          AND queue IN ('mail', 'images') AND run_after < now()) = 0
   AND count(*) FILTER (WHERE job_type = 'sales_total' AND state = 'SUCCEEDED') >= 3
   AND count(*) FILTER (WHERE job_type = 'monthly_statement' AND progress IS NOT NULL) >= 2
FROM jobs
"""


def settled(pg: psycopg.Connection) -> bool:
    row = pg.execute(SETTLED).fetchone()
    return row is not None and bool(row[0])
