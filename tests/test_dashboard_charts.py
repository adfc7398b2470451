"""The overview's charts in Chromium, over jobs a real relay and consumer ran: an
empty state until the collector has read a while, then per queue the jobs ended,
the failures and the queue-wait p95 as inline SVG, drawn from the collector's
history, under the page's CSP."""

from __future__ import annotations

import asyncio
import os

import psycopg
import pytest
from playwright.async_api import ConsoleMessage, expect
from sqlalchemy import Engine

from hybrid_jobs import consumers
from hybrid_jobs.consumers.backoff import Backoff
from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.jobctl.metrics import CollectorSettings
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, ConfigError, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.dashboard import CHROMIUM, Served, chromium, dashboard_served, sign_in
from tests.support.inproc import both_running
from tests.support.jobs import enqueue_many

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="Debian's chromium is not installed (scripts/test installs it: apt-get install "
        "chromium)",
    ),
    pytest.mark.timeout(180),
]

# A file to write the page to, to look at it.
WANTED = os.environ.get("JOBCTL_CHARTS_SCREENSHOT", "")
FAST = Backoff(base=0.05, cap=0.1, jitter=0)
# Rounds only when the test asks for one; a short span of short points, so that a
# few seconds of traffic make a chart of several points.
SETTINGS = CollectorSettings(interval=3600, history_span=120, history_resolution=3)


def registry() -> Registry:
    found = Registry()

    @found.handler("ping", queue="mail")
    async def ping(job: consumers.Job) -> None:
        await asyncio.sleep(0.01)

    @found.handler("flaky", queue="images", max_attempts=2, backoff=FAST)
    async def flaky(job: consumers.Job) -> None:
        if job.attempt == 1:
            raise ConnectionError("the image store hung up")

    return found


def finished(pg: psycopg.Connection) -> int:
    row = pg.execute(
        "SELECT count(*) FROM jobs WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
    ).fetchone()
    assert row is not None
    return int(row[0])


async def rounds(served: Served, n: int, pause: float = 1.0) -> None:
    for _ in range(n):
        await asyncio.sleep(pause)
        assert await served.collector.collect_once()


async def test_the_overview_draws_the_last_span_per_queue_from_the_collectors_history(
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
    engine: Engine,
    pg: psycopg.Connection,
) -> None:
    async with dashboard_served(db_url, collector=SETTINGS) as served:
        async with asyncio.timeout(30):
            while served.collector.status.rounds["collected"] < 1:
                await asyncio.sleep(0.05)
        async with chromium(refresh_seconds=0) as browser:
            page = await browser.new_page()
            blocked: list[str] = []

            def console(message: ConsoleMessage) -> None:
                if "Content Security Policy" in message.text:
                    blocked.append(message.text)

            page.on("console", console)
            await sign_in(page, served.base)
            # One round only notes where the history stands: nothing to draw yet.
            charts = page.get_by_test_id("charts")
            await expect(charts).to_have_attribute("data-state", "collecting")
            await expect(page.get_by_test_id("charts-empty")).to_contain_text("Collecting")

            async with both_running(db_url, amqp_url, topology, registry(), concurrency=8):
                # Two waves a few points apart, the collector reading in between.
                for wave in range(2):
                    enqueue_many(
                        engine,
                        [NewJob("ping", {"n": n}, queue="mail") for n in range(30)]
                        + [NewJob("flaky", {"n": n}, queue="images") for n in range(6)],
                    )
                    async with asyncio.timeout(60):
                        while finished(pg) < 36 * (wave + 1):
                            await asyncio.sleep(0.1)
                    await rounds(served, 4)
            await rounds(served, 2)
            # What the page will draw, from the collector's last round.
            history = served.collector.snapshot
            assert history is not None
            mail_ended = sum(s.ended for s in history.history.queues["mail"] if s)
            assert mail_ended == 60

            await page.reload()
            await expect(charts).to_have_attribute("data-state", "ok")
            rows = page.get_by_test_id("chart-row")
            await expect(rows).to_have_count(2)
            mail = page.locator("[data-testid=chart-row][data-queue=mail]")
            images = page.locator("[data-testid=chart-row][data-queue=images]")
            await expect(mail).to_contain_text("60 ended")
            await expect(images).to_contain_text("12 ended")
            # Each chart is drawn: a line of several points across its plot area
            # (or dots where a run had one point), and the part of the span before
            # collecting began is shaded.
            for row in (mail, images):
                for kind in ("ended", "raised", "wait"):
                    svg = row.locator(f"svg.chart.{kind}")
                    await expect(svg).to_be_visible()
                    drawn = await svg.locator("path.line, circle.dot").count()
                    assert drawn >= 1, (kind, await row.get_attribute("data-queue"))
                    await expect(svg.locator("rect.nodata")).to_have_count(1)
                box = await row.locator("svg.chart.ended path.line").first.bounding_box()
                assert box is not None and box["width"] > 10 and box["height"] > 5
            # Mail never failed: its failures chart is a flat zero; images' first
            # attempts all raised.
            await expect(mail.locator("svg.chart.raised")).to_have_attribute(
                "aria-label", "Failures: 0/min latest, peak 0/min"
            )
            peak = await images.locator("svg.chart.raised").get_attribute("aria-label")
            assert peak is not None and not peak.endswith("peak 0/min")
            # Queue waits were measured: the p95 axis is labelled in time.
            await expect(mail.locator("svg.chart.wait text.tick").nth(2)).to_contain_text("s")
            # The auto-refresh swaps the section in like any other content.
            await page.get_by_test_id("refresh-interval").select_option("1")
            async with asyncio.timeout(20):
                while int(await page.evaluate("document.body.dataset.refreshes || 0")) < 1:
                    await asyncio.sleep(0.1)
            await expect(page.locator("svg.chart")).to_have_count(6)
            await expect(mail).to_contain_text("60 ended")
            assert blocked == []
            if WANTED:
                await page.screenshot(path=WANTED, full_page=True)


def test_settings_reject_a_history_without_points() -> None:
    with pytest.raises(ConfigError):
        CollectorSettings(history_span=10, history_resolution=60)
    with pytest.raises(ConfigError):
        CollectorSettings(history_resolution=0)
