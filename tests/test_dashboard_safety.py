"""The dashboard safe against what others plant or write, and true in what it says:
each point through a real `jobctl serve` process, in Debian's Chromium.

- The flash cookie is signed with the session's key: one planted unsigned (nested
  1,500 levels deep, or with a link off the site) is ignored, never a 500; a link
  that leads off the site is dropped even when signed; a real action's message
  still shows, once.
- A value someone else wrote (a job type, a dedup key, an error message, a schedule's
  name) cannot reorder the page's own text: on screen, the text after it still runs
  left to right.
- A job held for approval says so (not "due in 2912103 d"); one never claimed shows
  "0" attempts, as the CLI does; one that succeeded after a replay shows its old
  error as an earlier attempt's, not as its error in red; with nothing runnable the
  overview's "Oldest runnable" is a dash, as the queue table's is.
"""

from __future__ import annotations

import base64
import json
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from playwright.async_api import BrowserContext, Locator, Page, expect
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import DatabaseUrl
from tests.support.api import served as served_process
from tests.support.dashboard import CHROMIUM, chromium, sign_in
from tests.support.jobs import enqueue

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is not installed (scripts/test installs it: apt-get install "
    "chromium)",
)

FLASH = "jobctl_flash"
RLO = "\N{RIGHT-TO-LEFT OVERRIDE}"
PDI = "\N{POP DIRECTIONAL ISOLATE}"
# The dashboard's colours (dashboard.css): --muted and --bad.
MUTED = "rgb(107, 115, 133)"
BAD = "rgb(180, 35, 24)"
NONE = "\N{EN DASH}"  # what a table shows for no value

# The left edge on screen of each character of `needle` (spaces left out) where it
# first occurs in a text node under the element: the page's own text reads left to
# right, so the edges must grow; reversed by an override, they shrink.
ON_SCREEN = """(element, needle) => {
  const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const at = node.data.indexOf(needle);
    if (at < 0) continue;
    const edges = [];
    for (let i = at; i < at + needle.length; i++) {
      if (node.data[i] === " ") continue;
      const range = document.createRange();
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      edges.push(range.getBoundingClientRect().left);
    }
    return edges;
  }
  return null;
}"""


async def reads_left_to_right(where: Locator, needle: str) -> None:
    edges = await where.evaluate(ON_SCREEN, needle)
    assert edges, f"{needle!r} is not on the page"
    assert edges == sorted(edges) and len(set(edges)) == len(edges), (
        f"{needle!r} is reordered on screen: {edges}"
    )


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode()


async def session_secret(browser: BrowserContext, base: str) -> str:
    return next(c["value"] for c in await browser.cookies(base) if c["name"] == "jobctl_session")


async def plant(browser: BrowserContext, base: str, value: str) -> None:
    await browser.add_cookies([{"name": FLASH, "value": value, "url": base}])


async def open_ok(page: Page, url: str) -> None:
    answer = await page.goto(url)
    assert answer is not None and answer.status == 200, await page.content()


# ------------------------------------------------------------------ item 4: the flash cookie


async def test_a_planted_flash_cookie_is_ignored_never_a_500_and_links_stay_on_the_site(
    db_url: DatabaseUrl, engine: Engine
) -> None:
    enqueue(engine, "send_email", {}, queue="mail")
    deep = ("[" * 1500 + "]" * 1500).encode()
    with served_process(db_url) as (base, _):
        async with chromium(0) as browser:
            page = await browser.new_page()
            await sign_in(page, base)

            # Planted as the server used to write it, base64 JSON, unsigned: 1,500
            # levels deep (a 500 on every page), or a link to another site.
            off_site = {"level": "ok", "text": "Session ended", "link": "/\\evil.com"}
            for value in (b64(deep), b64(json.dumps(off_site).encode())):
                await plant(browser, base, value)
                await open_ok(page, f"{base}/jobs")
                await expect(page.get_by_test_id("flash")).to_have_count(0)
                await expect(page.locator("a[href*='evil']")).to_have_count(0)
                # Not shown, and gone: it does not stay to be tried on every page.
                assert FLASH not in [c["name"] for c in await browser.cookies(base)]

            from hybrid_jobs.jobctl.dashboard.auth import flash_key
            from hybrid_jobs.jobctl.dashboard.flash import Flash, signed

            # Signed as the server signs (the key comes from this session's secret),
            # to reach what lies behind the signature: the decoding and the link.
            key = flash_key(await session_secret(browser, base))
            await plant(browser, base, signed(key, deep))
            await open_ok(page, f"{base}/")
            await expect(page.get_by_test_id("flash")).to_have_count(0)
            for link in ("/\\evil.com", "//evil.com", "/\t/evil.com", "https://evil.com"):
                await plant(browser, base, Flash("ok", "Done.", link, "evil").value(key))
                await open_ok(page, f"{base}/")
                await expect(page.get_by_test_id("flash")).to_have_text("Done.")
                await expect(page.locator("a[href*='evil']")).to_have_count(0)
            # Another session's message is not this one's.
            await plant(browser, base, Flash("ok", "Elsewhere.").value(flash_key("another")))
            await open_ok(page, f"{base}/")
            await expect(page.get_by_test_id("flash")).to_have_count(0)

            # A real action's message still shows, once, with its link on this site.
            await (
                page.locator("[data-testid=queue-row][data-queue=mail]")
                .get_by_test_id("pause-queue")
                .click()
            )
            await expect(page.get_by_test_id("flash")).to_contain_text("Queue mail paused")
            await plant(browser, base, Flash("ok", "Made.", "/jobs", "See them").value(key))
            await open_ok(page, f"{base}/")
            await page.get_by_test_id("flash").get_by_role("link", name="See them").click()
            await expect(page).to_have_url(f"{base}/jobs")
            await expect(page.get_by_test_id("flash")).to_have_count(0)


# ------------------------------------------------------------------ item 6: bidi isolation


async def test_a_value_with_bidirectional_controls_cannot_reorder_the_pages_text(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection, tmp_path: Path
) -> None:
    job_id = enqueue(
        engine, f"evil{RLO}type", {"note": f"x{RLO}y"}, queue="mail", dedup_key=f"order{RLO}7"
    )
    # Waits to retry after an error whose message overrides the direction, with a
    # stray PDI first: in Chromium it ends the isolate of a <bdi> around it.
    pg.execute(
        "UPDATE jobs SET state = 'RETRY_WAIT', attempt_count = 1, max_attempts = 3,"
        " run_after = now() + interval '1 hour', last_error_code = 'Boom',"
        " last_error_message = %s WHERE job_id = %s",
        [f"disk{PDI}{RLO} is full", job_id],
    )
    with Session(engine) as session, session.begin():
        outbox.schedule(session, f"night{RLO}ly", "report", None, every=timedelta(hours=1))

    with served_process(db_url) as (base, _):
        async with chromium(0) as browser:
            page = await browser.new_page()
            await sign_in(page, base, then=f"/jobs/{job_id}")
            await page.screenshot(path=str(tmp_path / "bidi-job.png"), full_page=True)
            # The blocker's facts after the error message, and the story's sentence
            # after the dedup key, read left to right.
            backoff = page.locator("[data-testid=blocker][data-code=RETRY_BACKOFF]")
            await expect(backoff).to_contain_text("is full")
            await reads_left_to_right(backoff, "attempt")
            story = page.get_by_test_id("story").locator("li").first
            await reads_left_to_right(story, "a budget of")
            # Each value is an isolate of its own: what it holds stays inside it.
            message = backoff.locator("bdi", has_text="is full")
            assert await message.evaluate("e => getComputedStyle(e).unicodeBidi") == "isolate"
            # A name's invisible characters are shown; the title holds none raw.
            await expect(page.get_by_test_id("job-type")).to_have_text("evil\\u202etype")
            assert RLO not in await page.title() and "evil\\u202etype" in await page.title()

            await open_ok(page, f"{base}/jobs")
            row = page.locator(f"[data-testid=job-row][data-job-id='{job_id}']")
            await expect(row.locator("td").nth(1)).to_have_text("evil\\u202etype")

            # A flash that names the schedule: its own words stay in order.
            await open_ok(page, f"{base}/schedules")
            await page.get_by_test_id("pause-schedule").click()
            flash = page.get_by_test_id("flash")
            await expect(flash).to_have_text("Schedule night\\u202ely paused.")
            await reads_left_to_right(flash, "paused.")
            await reads_left_to_right(page.get_by_test_id("schedule-row"), "paused")
            await page.screenshot(path=str(tmp_path / "bidi-schedules.png"), full_page=True)


# ------------------------------------------------------------------ item 15: true output


def replayed_then_succeeded(engine: Engine, pg: psycopg.Connection) -> uuid.UUID:
    """A job that failed (ValueError), was replayed and then succeeded: its row keeps
    the old error, as a real finish leaves it."""
    job_id = enqueue(engine, "resize", {"width": 9000}, queue="images", max_attempts=1)
    pg.execute(
        "INSERT INTO job_attempts (job_id, attempt, lease_generation, worker, ready_at,"
        " started_at, finished_at, outcome, error_code, error_message)"
        " VALUES (%s, 1, 1, 'w1', now(), now(), now(), 'FAILED', 'ValueError',"
        " 'image too large')",
        [job_id],
    )
    pg.execute(
        "UPDATE jobs SET state = 'FAILED', attempt_count = 1, started_at = now(),"
        " finished_at = clock_timestamp(), last_error_code = 'ValueError',"
        " last_error_message = 'image too large' WHERE job_id = %s",
        [job_id],
    )
    with Session(engine) as session, session.begin():
        outbox.retry_job(session, job_id)
    pg.execute(
        "INSERT INTO job_attempts (job_id, attempt, lease_generation, worker, ready_at,"
        " started_at, finished_at, outcome) VALUES (%s, 2, 2, 'w1', now(), now(), now(),"
        " 'SUCCEEDED')",
        [job_id],
    )
    pg.execute(
        "UPDATE jobs SET state = 'SUCCEEDED', attempt_count = 2, started_at = now(),"
        " finished_at = clock_timestamp(), result = '{\"width\": 4500}' WHERE job_id = %s",
        [job_id],
    )
    return job_id


async def test_held_new_and_replayed_jobs_and_an_idle_overview_are_shown_truly(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection, tmp_path: Path
) -> None:
    held = enqueue(engine, "deploy", {}, queue="ops", needs_approval=True)
    later = enqueue(engine, "send_email", {}, queue="mail", run_after=timedelta(hours=1))
    replayed = replayed_then_succeeded(engine, pg)

    with served_process(db_url) as (base, _):
        async with chromium(0) as browser:
            page = await browser.new_page()
            await sign_in(page, base)
            # Nothing is runnable: the card says so as the table does.
            card = page.locator(".card", has=page.locator(".label", has_text="Oldest runnable"))
            await expect(card.locator(".value")).to_have_text(NONE)
            mail = page.locator("[data-testid=queue-row][data-queue=mail]")
            await expect(mail.locator("td").nth(6)).to_have_text(NONE)

            await open_ok(page, f"{base}/jobs")
            await page.screenshot(path=str(tmp_path / "jobs.png"), full_page=True)

            def cells(job_id: uuid.UUID) -> Locator:
                return page.locator(f"[data-testid=job-row][data-job-id='{job_id}'] td")

            # Job, type, queue, tenant, state, attempt, prio, created, due, error.
            await expect(cells(held).nth(8)).to_have_text("waits for approval")
            await expect(cells(held).nth(5)).to_have_text("0")
            await expect(cells(later).nth(5)).to_have_text("0")
            await expect(cells(replayed).nth(5)).to_have_text("2/2")
            await expect(cells(replayed).nth(9)).to_have_text("earlier: ValueError")
            await expect(page.locator("body")).not_to_contain_text("2912")

            await open_ok(page, f"{base}/jobs/{held}")
            run_after = page.locator("dt:text-is('Run after') + dd")
            await expect(run_after).to_have_text("held: waits for approval")
            await expect(page.locator("body")).not_to_contain_text("2912")

            await open_ok(page, f"{base}/jobs/{replayed}")
            await page.screenshot(path=str(tmp_path / "replayed.png"), full_page=True)
            # Not the job's error, in red: an earlier attempt's, muted.
            await expect(page.locator("dt:text-is('Last error')")).to_have_count(0)
            await expect(page.locator("dd.error")).to_have_count(0)
            history = page.locator("dt:text-is('Earlier error') + dd")
            await expect(history).to_have_text("ValueError image too large")
            await expect(history).to_have_css("color", MUTED)
            # The failed attempt keeps its error, in red: that is its history.
            failed = page.locator("[data-testid=attempt][data-outcome=FAILED] .error")
            await expect(failed).to_have_css("color", BAD)
