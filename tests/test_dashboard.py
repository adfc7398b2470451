"""The dashboard at / of `jobctl serve`, in a real headless Chromium (Debian's
/usr/bin/chromium, driven by Playwright) against a real uvicorn, database and
broker, with jobs run by an in-process relay and consumer.

Every page shows real data; a job enqueued through the API appears by the
auto-refresh; Retry on a failed job's page runs it again to SUCCEEDED; bulk retry
works; a cross-site or token-less POST is refused and writes nothing; pausing the
refresh stops its requests; a server without a token is read-only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
from playwright.async_api import Page, Request, expect
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers.backoff import Backoff
from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.api import BEARER, TOKEN, free_port
from tests.support.api import served as served_process
from tests.support.dashboard import (
    CHROMIUM,
    Served,
    chromium,
    dashboard_served,
    serving,
    sign_in,
)
from tests.support.inproc import both_running
from tests.support.jobs import enqueue, enqueue_many, job, wait_for_state
from tests.support.reverse_proxy import reverse_proxy

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is not installed (scripts/test installs it: apt-get install "
    "chromium)",
)

HOUR = timedelta(hours=1)
FAST = Backoff(base=0.05, cap=0.1, jitter=0)


@dataclass
class World:
    """Jobs in every state, a schedule, a capped tenant and a live worker."""

    registry: Registry
    broken: dict[str, bool] = field(default_factory=lambda: {"resize": True})
    release: asyncio.Event = field(default_factory=asyncio.Event)
    ids: dict[str, uuid.UUID] = field(default_factory=dict)


def handlers(world_broken: dict[str, bool], release: asyncio.Event) -> Registry:
    registry = Registry()

    @registry.handler("send_email", queue="mail")
    async def send_email(job: consumers.Job) -> dict[str, Any]:
        return {"sent_to": job.payload["to"]}

    @registry.handler("resize", queue="images", max_attempts=2, backoff=FAST)
    async def resize(job: consumers.Job) -> dict[str, Any]:
        if world_broken["resize"]:
            raise ValueError(f"image too large: {job.payload['width']}px")
        return {"width": job.payload["width"] // 2}

    @registry.handler("crunch", queue="reports")
    async def crunch(job: consumers.Job) -> str:
        await job.progress(3, total=10, stage="reading orders")
        await release.wait()
        return "done"

    return registry


@contextlib.asynccontextmanager
async def world_running(
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
    engine: Engine,
    pg: psycopg.Connection,
) -> AsyncIterator[World]:
    """Runs a relay and a consumer, and leaves: a SUCCEEDED email, a FAILED resize
    (two attempts, tracebacks), a RUNNING crunch (with progress), a QUEUED job due
    in an hour, a CANCELLED one, a schedule, and tenant acme capped at 2."""
    broken = {"resize": True}
    release = asyncio.Event()
    world = World(handlers(broken, release), broken, release)
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_running=2, max_queued=100)
        outbox.set_rate_limit(session, "stripe", rate=100, burst=10)
        outbox.schedule(session, "nightly-report", "crunch", {"day": "yesterday"}, cron="0 3 * * *")
    async with both_running(db_url, amqp_url, topology, world.registry):
        ids = world.ids
        ids["email"] = enqueue(engine, "send_email", {"to": "ada@example.com"}, queue="mail")
        ids["resize"] = enqueue(engine, "resize", {"width": 9000}, queue="images", tenant="acme")
        ids["crunch"] = enqueue(engine, "crunch", {"month": "2026-11"}, queue="reports")
        ids["later"] = enqueue(
            engine,
            "send_email",
            {"to": "bob@example.com"},
            queue="mail",
            run_after=timedelta(hours=1),
        )
        ids["cancelled"] = enqueue(
            engine,
            "send_email",
            {"to": "eve@example.com"},
            queue="mail",
            run_after=timedelta(hours=1),
        )
        with Session(engine) as session, session.begin():
            outbox.request_cancel(session, ids["cancelled"])
        await wait_for_state(pg, ids["email"], "SUCCEEDED")
        await wait_for_state(pg, ids["resize"], "FAILED")
        async with asyncio.timeout(30):
            while job(pg, ids["crunch"])["progress"] is None:
                await asyncio.sleep(0.05)
        try:
            yield world
        finally:
            release.set()


async def wait_for_round(served: Served) -> None:
    """The collector's first round, which notes where the history stands."""
    async with asyncio.timeout(30):
        while served.collector.status.rounds["collected"] < 1:
            await asyncio.sleep(0.05)


def outside(base: str, requests: list[Request]) -> list[str]:
    return [r.url for r in requests if not r.url.startswith((base, "data:"))]


# ------------------------------------------------------------------ every page


async def test_every_page_shows_real_data_and_loads_nothing_from_elsewhere(
    db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, engine: Engine, pg
) -> None:
    async with dashboard_served(db_url) as served:
        await wait_for_round(served)
        async with (
            world_running(db_url, amqp_url, topology, engine, pg) as world,
            chromium(refresh_seconds=0) as browser,
        ):
            # The collector's next round counts the attempts that ended since.
            assert await served.collector.collect_once()
            page = await browser.new_page()
            requests: list[Request] = []
            page.on("request", lambda r: requests.append(r))
            await sign_in(page, served.base)
            await check_pages(page, served.base, world)
            assert outside(served.base, requests) == []


async def check_pages(page: Page, base: str, world: World) -> None:
    ids = world.ids
    # Overview: every queue with its counts; latency figures from the collector.
    await page.goto(f"{base}/")
    queues = page.get_by_test_id("queue-row")
    await expect(queues.filter(has_text="mail")).to_have_count(1)
    reports = page.locator("[data-testid=queue-row][data-queue=reports]")
    await expect(reports.locator("td").nth(4)).to_have_text("1")  # running
    mail = page.locator("[data-testid=queue-row][data-queue=mail]")
    await expect(mail.locator("td").nth(0)).to_have_text("1")  # the job due in an hour
    await expect(page.get_by_test_id("total-running")).to_have_text("1")
    await expect(page.get_by_test_id("relays")).to_have_text("1 of 1")  # publishing, of live
    images = page.locator("[data-testid=latency-row][data-queue=images]")
    await expect(images).to_contain_text("ms")  # wait and execution percentiles
    await expect(images.locator("td").nth(3)).to_contain_text("1 · 1")  # a retry, a failure
    await expect(page.get_by_test_id("figures-source")).to_contain_text("collected")

    # Jobs: every state, filters, a link to each job.
    await page.goto(f"{base}/jobs")
    rows = page.get_by_test_id("job-row")
    for key, state in (
        ("email", "SUCCEEDED"),
        ("resize", "FAILED"),
        ("crunch", "RUNNING"),
        ("later", "QUEUED"),
        ("cancelled", "CANCELLED"),
    ):
        row = page.locator(f"[data-testid=job-row][data-job-id='{ids[key]}']")
        await expect(row).to_have_attribute("data-state", state)
    await page.goto(f"{base}/jobs?state=FAILED&queue=images")
    await expect(rows).to_have_count(1)
    await page.goto(f"{base}/jobs?tenant=acme")
    await expect(rows).to_have_count(1)

    # A failed job: its story, both attempts with their tracebacks, why it ended.
    await page.goto(f"{base}/jobs/{ids['resize']}")
    attempts = page.get_by_test_id("attempt")
    await expect(attempts).to_have_count(2)
    await expect(attempts.nth(0)).to_have_attribute("data-outcome", "RETRY_WAIT")
    await expect(attempts.nth(1)).to_have_attribute("data-outcome", "FAILED")
    await expect(attempts.nth(1)).to_contain_text("image too large: 9000px")
    traceback = page.get_by_test_id("traceback").nth(1)
    await traceback.locator("summary").click()
    await expect(traceback).to_contain_text("Traceback (most recent call last)")
    await expect(traceback).to_contain_text("ValueError")
    await expect(page.get_by_test_id("finished")).to_contain_text("Failed")
    await expect(page.get_by_test_id("retry")).to_be_enabled()
    await expect(page.get_by_test_id("cancel")).to_have_count(0)

    # A running job: progress and its lease; a waiting one: why it waits.
    await page.goto(f"{base}/jobs/{ids['crunch']}")
    await expect(page.get_by_test_id("progress")).to_contain_text("reading orders")
    await expect(page.get_by_test_id("cancel")).to_be_enabled()
    await page.goto(f"{base}/jobs/{ids['later']}")
    await expect(page.locator("[data-testid=blocker][data-code=NOT_DUE]")).to_have_count(1)

    # Failed: the failed job, selectable; Cancelled beside it.
    await page.goto(f"{base}/failed")
    await expect(page.get_by_test_id("job-row")).to_have_count(1)
    await expect(page.get_by_test_id("job-row")).to_have_attribute(
        "data-job-id", str(ids["resize"])
    )
    await page.goto(f"{base}/failed?state=CANCELLED")
    await expect(page.get_by_test_id("job-row")).to_have_attribute(
        "data-job-id", str(ids["cancelled"])
    )

    # Schedules, tenants, keys and rate limits, workers.
    await page.goto(f"{base}/schedules")
    schedule = page.locator("[data-testid=schedule-row][data-schedule=nightly-report]")
    await expect(schedule).to_contain_text("0 3 * * *")
    await expect(schedule).to_contain_text("never")
    await page.goto(f"{base}/tenants")
    acme = page.locator("[data-testid=tenant-row][data-tenant=acme]")
    await expect(acme.locator("td").nth(0)).to_have_text("0 / 2")
    await expect(page.get_by_test_id("rate-limits-moved")).to_be_visible()
    await page.goto(f"{base}/keys")
    stripe = page.locator("[data-testid=rate-limit-row][data-rate-limit=stripe]")
    await expect(stripe.locator("td").nth(2)).to_have_text("10.00")
    await page.goto(f"{base}/workers")
    worker = page.get_by_test_id("worker-row")
    await expect(worker).to_have_count(1)
    await expect(worker).to_contain_text("live")
    await expect(worker).to_contain_text("reports")


async def test_the_workers_page_names_a_consumer_whose_lease_lapsed(
    db_url: DatabaseUrl, pg: psycopg.Connection
) -> None:
    # One heard from just now; one the sweeper took a lease back from since it was
    # last heard from (killed or frozen); one silent past the TTL.
    pg.execute(
        "INSERT INTO workers (worker_id, host, pid, queues, job_types, concurrency, prefetch,"
        " last_seen_at, lease_lapsed_at) VALUES"
        " ('w-live', 'box', 1, '{mail}', '{greet}', 4, 4, now(), NULL),"
        " ('w-lapsed', 'box', 2, '{mail}', '{greet}', 4, 4, now(), now() + interval '1 s'),"
        " ('w-silent', 'box', 3, '{mail}', '{greet}', 4, 4, now() - interval '1 h', NULL)"
    )
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base, then="/workers")
        for worker, status in (("w-live", "live"), ("w-lapsed", "lapsed"), ("w-silent", "silent")):
            row = page.locator(f"[data-testid=worker-row][data-worker={worker}]")
            await expect(row.locator("td").first).to_have_text(status)
        lapsed = page.locator("[data-testid=worker-row][data-worker=w-lapsed] .badge")
        await expect(lapsed).to_have_attribute("title", re.compile("lapsed since it was last"))


async def test_the_jobs_list_filters_and_pages_by_key(db_url: DatabaseUrl, engine: Engine) -> None:
    enqueue_many(engine, [NewJob("greet", {"n": n}, queue="mail") for n in range(60)])
    enqueue_many(engine, [NewJob("greet", {"n": n}, queue="sms") for n in range(3)])
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base, then="/jobs")
        rows = page.get_by_test_id("job-row")
        await expect(rows).to_have_count(50)
        first = await rows.first.get_attribute("data-job-id")
        await page.get_by_test_id("next-page").click()
        await expect(rows).to_have_count(13)
        await expect(page.get_by_test_id("next-page")).to_have_count(0)
        assert first not in [await r.get_attribute("data-job-id") for r in await rows.all()]
        await page.get_by_test_id("first-page").click()
        await expect(rows.first).to_have_attribute("data-job-id", first or "")
        # The filter form: queue sms, state QUEUED.
        filters = page.get_by_test_id("filters")
        await filters.locator("input[name=queue]").fill("sms")
        await filters.locator("select[name=state]").select_option("QUEUED")
        await filters.get_by_role("button", name="Apply").click()
        await expect(rows).to_have_count(3)
        await expect(page).to_have_url(re.compile(r"state=QUEUED&queue=sms"))
        # A filter the service refuses is said so, not a crash.
        await page.goto(f"{served.base}/jobs?queue=no%20spaces")
        await expect(page.get_by_test_id("problem")).to_contain_text("queue")
        await page.goto(f"{served.base}/jobs/{uuid.uuid4()}")
        await expect(page.get_by_test_id("missing")).to_be_visible()


# ------------------------------------------------------------------ live refresh


async def test_a_job_enqueued_through_the_api_appears_by_the_auto_refresh(
    db_url: DatabaseUrl,
) -> None:
    async with dashboard_served(db_url, metrics=False) as served, chromium(1) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base, then="/jobs")
        await expect(page.get_by_test_id("no-jobs")).to_be_visible()
        # Marks this document: a reload or a navigation would lose it.
        await page.evaluate("window.sameDocument = true")
        async with httpx.AsyncClient(base_url=served.base, headers=BEARER) as client:
            sent = await client.post("/v1/jobs", json={"job_type": "greet", "queue": "mail"})
        assert sent.status_code == 202
        row = page.locator(f"[data-testid=job-row][data-job-id='{sent.json()['id']}']")
        await expect(row).to_have_attribute("data-state", "QUEUED", timeout=15_000)
        assert await page.evaluate("window.sameDocument") is True
        assert int(await page.evaluate("document.body.dataset.refreshes")) >= 1


async def test_pausing_the_refresh_stops_its_requests(db_url: DatabaseUrl) -> None:
    async with dashboard_served(db_url, metrics=False) as served, chromium(1) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base, then="/jobs")
        refreshes: list[str] = []
        page.on(
            "request",
            lambda r: refreshes.append(r.url) if r.headers.get("x-dashboard-refresh") else None,
        )
        async with asyncio.timeout(15):
            while not refreshes:
                await asyncio.sleep(0.05)
        await page.get_by_test_id("refresh-toggle").click()
        await expect(page.get_by_test_id("refresh-status")).to_have_text("updates paused")
        # A refresh already on its way when the button was pressed may still land.
        await page.wait_for_load_state("networkidle")
        seen = len(refreshes)
        ticks = int(await page.evaluate("document.body.dataset.ticks"))
        # Three more ticks of the timer: each would have fetched the page.
        # (Polled from here: the page's CSP forbids wait_for_function's eval.)
        async with asyncio.timeout(15):
            while int(await page.evaluate("document.body.dataset.ticks")) < ticks + 3:
                await asyncio.sleep(0.05)
        assert len(refreshes) == seen
        # The choice is kept: a new page starts paused, and resuming fetches again.
        await page.reload()
        await expect(page.get_by_test_id("refresh-toggle")).to_have_text("Resume updates")
        await page.get_by_test_id("refresh-toggle").click()
        async with asyncio.timeout(15):
            while len(refreshes) == seen:
                await asyncio.sleep(0.05)
        # 0 turns it off: no timer at all.
        await page.get_by_test_id("refresh-interval").select_option("0")
        await expect(page.get_by_test_id("refresh-status")).to_have_text("auto-refresh off")


# ------------------------------------------------------------------ actions


async def test_retry_on_a_failed_jobs_page_runs_it_again_to_succeeded(
    db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, engine: Engine, pg
) -> None:
    async with (
        dashboard_served(db_url, metrics=False) as served,
        world_running(db_url, amqp_url, topology, engine, pg) as world,
        chromium(1) as browser,
    ):
        failed = world.ids["resize"]
        world.broken["resize"] = False
        page = await browser.new_page()
        await sign_in(page, served.base, then=f"/jobs/{failed}")
        await expect(page.locator("h1 [data-state]")).to_have_text("FAILED")
        await page.get_by_test_id("retry").click()
        await expect(page.get_by_test_id("flash")).to_contain_text("Retried")
        # The refresh brings the third attempt and the outcome onto the page.
        await expect(page.locator("h1 [data-state]")).to_have_text("SUCCEEDED", timeout=20_000)
        await expect(page.get_by_test_id("attempt")).to_have_count(3)
        await expect(page.get_by_test_id("result")).to_contain_text("4500")
    row = job(pg, failed)
    assert (row["state"], row["attempt_count"]) == ("SUCCEEDED", 3)
    (by,) = pg.execute("SELECT replayed_by FROM job_replays WHERE job_id = %s", [failed]).fetchone()
    assert by.startswith("dashboard (")


async def test_bulk_retry_of_selected_jobs_and_of_every_match(
    db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, engine: Engine, pg
) -> None:
    registry = Registry()

    @registry.handler("resize", queue="images", max_attempts=1)
    async def resize(job: consumers.Job) -> None:
        raise ValueError("no")

    ids = [enqueue(engine, "resize", {"n": n}, queue="images") for n in range(3)]
    async with both_running(db_url, amqp_url, topology, registry):
        for job_id in ids:
            await wait_for_state(pg, job_id, "FAILED")
    # No consumer now: a retried job stays QUEUED, where the test can see it.
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base, then="/failed")
        await expect(page.get_by_test_id("job-row")).to_have_count(3)
        for job_id in ids[:2]:
            await page.locator(f"input[name=job][value='{job_id}']").check()
        await expect(page.get_by_test_id("selected-count")).to_have_text("2 selected")
        await page.get_by_test_id("retry-selected").click()
        await expect(page.get_by_test_id("flash")).to_have_text("Retried 2 of 2 selected jobs.")
        assert [job(pg, i)["state"] for i in ids] == ["QUEUED", "QUEUED", "FAILED"]
        await expect(page.get_by_test_id("job-row")).to_have_count(1)

        await page.get_by_test_id("retry-matching").click()
        await expect(page.get_by_test_id("matched")).to_have_text("1")
        assert job(pg, ids[2])["state"] == "FAILED", "the count wrote nothing"
        # No queue or type filter: every failed job, which must be said on purpose.
        await page.get_by_test_id("confirm-every").check()
        await page.get_by_test_id("confirm-retry-button").click()
        await expect(page.get_by_test_id("flash")).to_contain_text("Retried 1 FAILED jobs")
        await expect(page.get_by_test_id("no-jobs")).to_be_visible()
    assert job(pg, ids[2])["state"] == "QUEUED"
    replays = pg.execute("SELECT count(*) FROM job_replays").fetchone()
    assert replays == (3,)


async def test_pause_and_resume_a_queue_and_a_schedule(
    db_url: DatabaseUrl, engine: Engine, pg
) -> None:
    enqueue(engine, "send_email", {}, queue="mail")
    with Session(engine) as session, session.begin():
        outbox.schedule(session, "hourly", "tick", None, every=timedelta(hours=1))
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base)
        mail = page.locator("[data-testid=queue-row][data-queue=mail]")
        await mail.get_by_test_id("pause-queue").click()
        await expect(mail.get_by_test_id("paused")).to_be_visible()
        assert pg.execute("SELECT paused FROM queues WHERE queue = 'mail'").fetchone() == (True,)
        await mail.get_by_test_id("resume-queue").click()
        await expect(mail.get_by_test_id("paused")).to_have_count(0)

        await page.goto(f"{served.base}/schedules")
        hourly = page.locator("[data-testid=schedule-row][data-schedule=hourly]")
        await hourly.get_by_test_id("pause-schedule").click()
        await expect(hourly.get_by_test_id("paused")).to_be_visible()
        await hourly.get_by_test_id("resume-schedule").click()
        await expect(hourly.get_by_test_id("paused")).to_have_count(0)
        await hourly.get_by_test_id("trigger-schedule").click()
        await expect(page.get_by_test_id("flash")).to_contain_text("triggered")
        await page.get_by_test_id("flash").get_by_role("link").click()
        await expect(page.locator("h1")).to_contain_text("tick")
    assert pg.execute("SELECT count(*) FROM jobs WHERE job_type = 'tick'").fetchone() == (1,)


# ------------------------------------------------------------------ refusals


EVIL_FORM = """<!doctype html><title>win a prize</title>
<form id="f" method="post" action="{target}"><input name="back" value="/"></form>
<script>document.getElementById("f").submit()</script>"""


@contextlib.asynccontextmanager
async def evil_site(target: str) -> AsyncIterator[str]:
    """Another site (localhost, not 127.0.0.1: another origin and another site)
    whose page posts a form to ``target`` as soon as it loads."""

    async def home(_request: Any) -> HTMLResponse:
        return HTMLResponse(EVIL_FORM.format(target=target))

    async with serving(Starlette(routes=[Route("/", home)])) as port:
        yield f"http://localhost:{port}/"


async def csrf_of(page: Page) -> str:
    value = await page.locator("input[name=csrf]").first.get_attribute("value")
    assert value
    return value


async def test_cross_site_and_forged_posts_are_refused_and_write_nothing(
    db_url: DatabaseUrl, engine: Engine, pg
) -> None:
    waiting = enqueue(engine, "send_email", {}, queue="mail", run_after=timedelta(hours=1))
    cancel = f"/jobs/{waiting}/cancel"
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base)
        token = await csrf_of(page)

        # Another site's page posts to the dashboard in the signed-in browser.
        async with evil_site(served.base + cancel) as evil:
            forged = await browser.new_page()
            async with forged.expect_response(served.base + cancel) as answer:
                await forged.goto(evil)
            assert (await answer.value).status in (401, 403)
            await expect(forged.get_by_test_id("refused")).to_be_visible()

        # The same by hand, with the browser's own cookie: each check alone refuses.
        origin = served.base
        for headers, form, why in (
            ({"Origin": "http://evil.example"}, {"csrf": token}, "another origin"),
            ({"Origin": "null"}, {"csrf": token}, "an opaque origin"),
            ({"Referer": "http://evil.example/x"}, {"csrf": token}, "no Origin, foreign Referer"),
            ({}, {"csrf": token}, "neither Origin nor Referer"),
            ({"Origin": origin}, {}, "no CSRF token"),
            ({"Origin": origin}, {"csrf": token[:-2] + "xx"}, "a wrong CSRF token"),
        ):
            sent = await browser.request.post(
                served.base + cancel, headers=headers, form=form, max_redirects=0
            )
            assert sent.status == 403, why
            assert "Nothing was changed" in await sent.text(), why
        assert job(pg, waiting)["state"] == "QUEUED"

        # Without the session cookie, the right token and origin are not enough.
        async with httpx.AsyncClient() as outsider:
            sent_plain = await outsider.post(
                served.base + cancel, headers={"Origin": origin}, data={"csrf": token}
            )
        assert sent_plain.status_code == 401
        assert job(pg, waiting)["state"] == "QUEUED"

    # The checks can pass: the same request, whole, cancels.
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base)
        sent = await browser.request.post(
            served.base + cancel,
            headers={"Origin": served.base},
            form={"csrf": await csrf_of(page)},
            max_redirects=0,
        )
        assert sent.status == 303
    assert job(pg, waiting)["state"] == "CANCELLED"


async def test_a_server_with_a_token_wants_it_and_a_wrong_one_is_refused(
    db_url: DatabaseUrl, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        # Pages show payloads and errors: like the API's reads, they need the token.
        await page.goto(f"{served.base}/failed")
        await expect(page).to_have_url(re.compile(r"/login\?next=%2Ffailed$"))
        await page.get_by_test_id("token").fill("not-the-token")
        await page.get_by_test_id("sign-in").click()
        await expect(page.get_by_test_id("login-problem")).to_have_text("that is not the token")
        await page.get_by_test_id("token").fill(TOKEN)
        await page.get_by_test_id("sign-in").click()
        await expect(page).to_have_url(f"{served.base}/failed")
        (cookie,) = [c for c in await browser.cookies() if c["name"] == "jobctl_session"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert TOKEN not in cookie["value"]
        await page.get_by_test_id("sign-out").click()
        await expect(page).to_have_url(re.compile(r"/login$"))
        await page.goto(f"{served.base}/jobs")
        await expect(page).to_have_url(re.compile(r"/login"))
    logged = [str(vars(record)) for record in caplog.records]
    assert any("/login" in line for line in logged), "the requests were logged"
    assert not [line for line in logged if TOKEN in line or cookie["value"] in line]


async def test_without_a_token_the_dashboard_is_read_only(
    db_url: DatabaseUrl, engine: Engine, pg
) -> None:
    waiting = enqueue(engine, "send_email", {}, queue="mail", run_after=timedelta(hours=1))
    async with (
        dashboard_served(db_url, token=None, metrics=False) as served,
        chromium(0) as browser,
    ):
        page = await browser.new_page()
        await page.goto(f"{served.base}/jobs/{waiting}")
        await expect(page.get_by_test_id("read-only-banner")).to_be_visible()
        await expect(page.get_by_test_id("cancel")).to_be_disabled()
        sent = await browser.request.post(
            f"{served.base}/jobs/{waiting}/cancel",
            headers={"Origin": served.base},
            form={"csrf": "x"},
            max_redirects=0,
        )
        assert sent.status == 403 and "read-only" in await sent.text()
        await page.goto(f"{served.base}/login")
        await expect(page.get_by_test_id("login")).to_contain_text("nothing to sign in to")
    assert job(pg, waiting)["state"] == "QUEUED"


# ------------------------------------------------------------------ sign-out, a proxy, names


async def test_signing_out_ends_the_session_for_a_copied_cookie_too(db_url: DatabaseUrl) -> None:
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base, then="/jobs")
        (cookie,) = [c for c in await browser.cookies() if c["name"] == "jobctl_session"]
        assert TOKEN not in cookie["value"]
        # The cookie, copied elsewhere (another browser, a stolen backup), works...
        async with chromium(0) as thief:
            await thief.add_cookies([cookie])  # type: ignore[list-item]
            stolen = await thief.new_page()
            await stolen.goto(f"{served.base}/jobs")
            await expect(stolen.get_by_test_id("sign-out")).to_be_visible()
            # ...until its owner signs out: then nowhere.
            await page.get_by_test_id("sign-out").click()
            await expect(page).to_have_url(re.compile(r"/login$"))
            await stolen.goto(f"{served.base}/jobs")
            await expect(stolen).to_have_url(re.compile(r"/login\?next="))
        async with httpx.AsyncClient(base_url=served.base) as client:
            client.cookies.set("jobctl_session", cookie["value"])
            again = await client.get("/jobs")
        assert again.status_code == 303 and "/login" in again.headers["location"]


async def test_the_dashboard_works_behind_a_proxy_on_its_public_url(
    db_url: DatabaseUrl, engine: Engine, pg
) -> None:
    """The proxy is another host and port than the server, and mounts it at /ops:
    the buttons' Origin is the proxy's, which the public URL names."""
    enqueue(engine, "send_email", {}, queue="mail")
    port = free_port()
    public = f"http://localhost:{port}/ops"
    with served_process(db_url, args=("--public-url", public)) as (base, _):
        async with (
            reverse_proxy(base, prefix="/ops", port=port) as proxy,
            chromium(0) as browser,
        ):
            page = await browser.new_page()
            await sign_in(page, proxy + "/ops")
            mail = page.locator("[data-testid=queue-row][data-queue=mail]")
            await mail.get_by_test_id("pause-queue").click()
            await expect(page.get_by_test_id("flash")).to_contain_text("Queue mail paused")
            await expect(mail.get_by_test_id("paused")).to_be_visible()
            assert page.url == f"{proxy}/ops/"
            # Every link stays under the mount point.
            await page.get_by_role("link", name="Failed").click()
            await expect(page).to_have_url(f"{proxy}/ops/failed")
    assert pg.execute("SELECT paused FROM queues WHERE queue = 'mail'").fetchone() == (True,)
    (by,) = pg.execute("SELECT paused_by FROM queues WHERE queue = 'mail'").fetchone()
    assert by == "dashboard (127.0.0.1)"


async def test_one_pause_button_per_thing_and_each_says_what_it_pauses(
    db_url: DatabaseUrl, engine: Engine
) -> None:
    enqueue(engine, "send_email", {}, queue="mail")
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base)
        await expect(page.get_by_role("button", name="Pause", exact=True)).to_have_count(0)
        await expect(page.get_by_role("button", name="Pause updates")).to_have_count(1)
        await expect(page.get_by_role("button", name="Pause queue mail")).to_have_count(1)


async def test_bad_names_and_names_with_a_slash_on_the_dashboard(
    db_url: DatabaseUrl, engine: Engine, pg
) -> None:
    with Session(engine) as session, session.begin():
        outbox.schedule(session, "reports/nightly", "render", None, every=timedelta(hours=1))
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base, then="/schedules")
        row = page.locator("[data-testid=schedule-row][data-schedule='reports/nightly']")
        await row.get_by_test_id("pause-schedule").click()
        await expect(page.get_by_test_id("flash")).to_contain_text("paused")
        await expect(row.get_by_test_id("paused")).to_be_visible()
        await row.get_by_test_id("resume-schedule").click()
        await expect(row.get_by_test_id("paused")).to_have_count(0)
        # A queue name with a newline: refused in words, not a 500.
        sent = await browser.request.post(
            f"{served.base}/queues/mail%0A/pause",
            headers={"Origin": served.base},
            form={"csrf": await csrf_of(page), "back": "/"},
            max_redirects=0,
        )
        assert sent.status == 303
        await page.goto(served.base + "/")
        await expect(page.get_by_test_id("flash")).to_contain_text("control characters")
    assert pg.execute("SELECT count(*) FROM queues").fetchone() == (0,)


async def test_a_job_stored_too_deep_to_decode_has_its_page(
    db_url: DatabaseUrl, engine: Engine, pg
) -> None:
    job_id = enqueue(engine, "send_email", {}, queue="mail")
    pg.execute(
        "UPDATE jobs SET payload = %s::jsonb WHERE job_id = %s", ["[" * 3000 + "]" * 3000, job_id]
    )
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base, then=f"/jobs/{job_id}")
        await expect(page.get_by_test_id("as-text")).to_contain_text("deeper than 100 levels")
        await expect(page.get_by_test_id("payload")).to_contain_text("[[[[")
        await page.goto(f"{served.base}/jobs")
        await expect(page.locator(f"[data-testid=job-row][data-job-id='{job_id}']")).to_be_visible()
