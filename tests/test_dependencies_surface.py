"""A job's dependencies where an operator looks: the service's job view and the
dashboard's job page list its parents, in the order of its after=, and the jobs
waiting for it, each with its state and a link to it (in a real Chromium)."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import expect
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.service import get_job
from hybrid_jobs.plumbing.config import DatabaseUrl
from tests.support.dashboard import CHROMIUM, chromium, dashboard_served, sign_in


async def test_a_jobs_parents_and_children_on_its_page(
    engine: Engine, async_engine: AsyncEngine, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    with Session(engine) as session, session.begin():
        fetch = outbox.enqueue(session, "fetch", {})
        thumb = outbox.enqueue(session, "thumbnail", {})
        publish = outbox.enqueue(session, "publish", {}, after=[thumb, fetch])
        notify = outbox.enqueue(session, "notify", {}, after=[publish], on_parent_failure="run")

    async with AsyncSession(async_engine) as session:
        child = await get_job(session, publish)
        parent = await get_job(session, fetch)
    assert child is not None and parent is not None
    # in the order of after=, not of the ids
    assert [(d.job_id, d.job_type, d.state, d.done) for d in child.parents] == [
        (thumb, "thumbnail", "QUEUED", False),
        (fetch, "fetch", "QUEUED", False),
    ]
    assert [(d.job_id, d.state) for d in child.children] == [(notify, "QUEUED")]
    assert [d.job_id for d in parent.children] == [publish] and parent.parents == ()

    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed")
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base)
        await page.goto(f"{served.base}/jobs/{publish}")
        parents = page.get_by_test_id("parent")
        await expect(parents).to_have_count(2)
        await expect(parents.first).to_contain_text("thumbnail")
        await expect(page.get_by_test_id("job-parents")).to_contain_text("After 2 jobs")
        await expect(page.get_by_test_id("child")).to_contain_text("notify")
        await expect(page.locator("[data-testid=blocker][data-code=DEPENDENCY]")).to_have_count(1)
        # held, not "due in 2,912,106 days" (the hold's year 9999)
        await expect(page.get_by_test_id("held")).to_contain_text("until its parents are done")
        await expect(page.locator("body")).not_to_contain_text("2912106")
        await page.screenshot(path=str(tmp_path / "dependencies.png"), full_page=True)
        # a parent's link opens it, and it names the job waiting for it
        await parents.nth(1).locator("a").click()
        await expect(page.get_by_test_id("child")).to_contain_text("publish")
