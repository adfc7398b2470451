"""What the operator surface shows of keys, rate limits and deadlines (issue 18):
`jobctl keys`, `jobctl stats`, the service's reads and the dashboard's Keys & limits
page and overview, in a real headless Chromium. The state comes from the real claim
statement (a JobStore claiming as a consumer does) and the relay's deadline sweep."""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.async_api import expect
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.consumers.store import JobStore
from hybrid_jobs.jobctl.service import list_keys, stats
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema.queries import JOB_EXPIRE_WAITING
from tests.support.dashboard import CHROMIUM, chromium, dashboard_served, sign_in
from tests.support.jobs import enqueue, enqueue_many
from tests.support.processes import jobctl

WORKER = "w:keys-surface"


def _registry() -> Registry:
    registry = Registry()

    @registry.handler("sync_account")
    async def sync_account(job: consumers.Job) -> None:
        return None

    @registry.handler("charge", queue="billing")
    async def charge(job: consumers.Job) -> None:
        return None

    return registry


async def _world(
    engine: Engine, pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection]
) -> dict[str, Any]:
    """Key account:42 (limit 2) held by two jobs with one waiting for it, key
    account:7 held by one with none waiting; a billing job without a token of its
    rate limit; a job past its deadline, ended by the sweep; and key ledger:9 held
    behind a strict head that FAILED."""
    registry = _registry()
    with Session(engine) as session, session.begin():
        outbox.set_rate_limit(session, "stripe", rate=1, per=timedelta(hours=1), burst=1)
    wide = enqueue_many(
        engine, [NewJob("sync_account", {"n": n}, key="account:42", key_limit=2) for n in range(3)]
    )
    single = enqueue(engine, "sync_account", {}, key="account:7")
    paid, unpaid = (
        enqueue(engine, "charge", {"n": n}, queue="billing", rate_limit="stripe") for n in range(2)
    )
    store = JobStore(pool, WORKER, lease_seconds=300)
    claimed = await store.claim(
        [*wide, single, paid, unpaid],
        registry.claim_terms(),
        queues=registry.queues(),
        free_threads=0,
        worker_ttl=60,
    )
    assert sorted(claimed.missed.values()) == ["KEY_BUSY", "RATE_LIMITED"], claimed.missed
    # Delayed past its deadline, as a retry's backoff can leave a job.
    late = enqueue(
        engine, "sync_account", {}, run_after=timedelta(hours=1), expires=timedelta(hours=2)
    )
    pg.execute("UPDATE jobs SET expires_at = now() WHERE job_id = %s", [late])
    assert len(pg.execute(JOB_EXPIRE_WAITING, {"limit": 10}).fetchall()) == 1
    head, behind = (
        enqueue(engine, "post_entry", {"n": n}, key="ledger:9", ordered="strict") for n in range(2)
    )
    # The head's failure as a consumer leaves it (it held no lease since).
    pg.execute(
        "UPDATE jobs SET state = 'FAILED', attempt_count = 1, started_at = now(),"
        " finished_at = now(), last_error_code = 'Boom' WHERE job_id = %s",
        [head],
    )
    holders = [j for j in wide if j in {c.job_id for c in claimed.claimed}]
    return {"holders": holders, "single": single, "head": head, "behind": behind}


async def test_keys_rate_limits_and_expired_jobs_on_every_surface(
    engine: Engine,
    pg: psycopg.Connection,
    pool: AsyncConnectionPool[AsyncConnection],
    async_engine: AsyncEngine,
    db_url: DatabaseUrl,
    tmp_path: Path,
) -> None:
    world = await _world(engine, pg, pool)

    # The service: busy keys with their holders, the failed strict head's key.
    async with AsyncSession(async_engine) as session:
        found = await list_keys(session)
        figures = await stats(session)
    wide, single = found.busy
    assert (wide.key, wide.running, wide.key_limit, wide.waiting) == ("account:42", 2, 2, 1)
    assert sorted(h.job_id for h in wide.holders) == sorted(world["holders"])
    assert {(h.worker, h.state) for h in wide.holders} == {(WORKER, "RUNNING")}
    assert (single.key, single.running, single.waiting) == ("account:7", 1, 0)
    assert found.busy_total == 2
    (held,) = found.held
    assert (held.key, held.job_id, held.error_code, held.waiting) == (
        "ledger:9",
        world["head"],
        "Boom",
        1,
    )
    queues = {q.queue: q for q in figures.queues}
    assert (queues["default"].waiting_for_key, queues["default"].expired) == (1, 1)
    assert (queues["billing"].rate_limited, queues["billing"].waiting_for_key) == (1, 0)
    assert queues["default"].cancelled == 1 and queues["billing"].expired == 0

    # jobctl keys and jobctl stats.
    def cli(*args: str) -> str:
        done = jobctl(*args, url=db_url, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout

    shown = json.loads(cli("keys", "--json"))
    assert [k["key"] for k in shown["busy"]] == ["account:42", "account:7"]
    assert shown["busy"][0]["holders"][0]["worker"] == WORKER
    assert shown["held"][0]["job_id"] == str(world["head"])
    text = cli("keys", "--limit", "1")
    assert text.splitlines()[0].split()[:4] == ["KEY", "RUNNING", "WAITING", "HELD"]
    assert "account:42" in text and "2/2" in text and "account:7" not in text
    assert "1 of 2 busy keys shown" in text
    assert "ledger:9" in text and str(world["head"]) in text
    table = cli("stats").splitlines()
    head = table[0].split("  ")
    columns = [c.strip() for c in head if c.strip()]
    default = next(line for line in table if line.startswith("default"))
    values = dict(zip(columns, [c.strip() for c in default.split("  ") if c.strip()], strict=False))
    assert (values["KEY WAIT"], values["RATE LTD"], values["EXPIRED"]) == ("1", "0", "1")
    by_queue = {q["queue"]: q for q in json.loads(cli("stats", "--json"))["queues"]}
    assert by_queue["billing"]["rate_limited"] == 1

    # The dashboard, in a real Chromium: the overview's new columns and cards, and
    # the Keys & limits page.
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed")
    shots = Path(str(tmp_path))
    # The overview counts the jobs that expired in the last minute; on a loaded
    # machine the checks above can take longer than that since the sweep ended it.
    pg.execute("UPDATE jobs SET finished_at = now() WHERE last_error_code = 'EXPIRED'")
    async with dashboard_served(db_url, metrics=False) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base)
        await expect(page.get_by_test_id("total-expired")).to_have_text("1")
        default_row = page.locator("[data-testid=queue-row][data-queue=default]")
        cells = default_row.locator("td")
        await expect(cells.nth(2)).to_have_text("1")  # key wait
        await expect(cells.nth(3)).to_have_text("0")  # rate-limited
        await expect(cells.nth(11)).to_have_text("1")  # expired
        billing = page.locator("[data-testid=queue-row][data-queue=billing]")
        await expect(billing.locator("td").nth(3)).to_have_text("1")
        await page.screenshot(path=str(shots / "overview.png"), full_page=True)

        await page.get_by_role("link", name="Keys & limits").click()
        await expect(page.get_by_test_id("busy-total")).to_contain_text("2 busy")
        account = page.locator("[data-testid=busy-key-row][data-key='account:42']")
        await expect(account.locator("td").nth(0)).to_have_text("2 / 2")
        await expect(account.locator("td").nth(2)).to_have_text("1")  # waiting
        holders = page.locator("[data-key='account:42'] [data-testid=key-holder] a")
        await expect(holders).to_have_count(2)
        shown_ids = {uuid.UUID(str(await h.get_attribute("title"))) for h in await holders.all()}
        assert shown_ids == set(world["holders"])
        await expect(account).to_contain_text(WORKER)
        ledger = page.locator("[data-testid=held-key-row][data-key='ledger:9']")
        await expect(ledger).to_contain_text("Boom")
        await expect(ledger.locator("td").last).to_have_text("1")
        stripe = page.locator("[data-testid=rate-limit-row][data-rate-limit=stripe]")
        # none left: the bucket refills a token an hour, so a slow run shows 0.0x
        await expect(stripe.locator("[data-testid=tokens]")).to_have_text(re.compile(r"^0\.0\d$"))
        await expect(stripe).to_contain_text("/ 3,600.00 s")
        await page.screenshot(path=str(shots / "keys.png"), full_page=True)
        # A holder's link opens its job.
        await holders.first.click()
        await expect(page.get_by_test_id("job-key")).to_contain_text("account:42")
