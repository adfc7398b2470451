"""The dashboard for tests and screenshots: `jobctl serve`'s app under a real
uvicorn on a free port, in the caller's event loop (so a test can reach its
metrics collector), and Debian's Chromium driven by Playwright."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import uvicorn
from fastapi import FastAPI
from playwright.async_api import BrowserContext, Page, async_playwright
from starlette.types import ASGIApp

from hybrid_jobs.jobctl.api import ApiSettings, create_app
from hybrid_jobs.jobctl.metrics import Collector
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from tests.support.api import TOKEN, free_port
from tests.support.services import AMQP_URL

CHROMIUM: Final = Path("/usr/bin/chromium")
# As the machine notes say works here: no sandbox as root, and none of the
# background connections a closed network refuses.
CHROMIUM_ARGS: Final = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT: Final = {"width": 1440, "height": 900}


class QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the test runner owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass(frozen=True)
class Served:
    base: str
    app: FastAPI

    @property
    def collector(self) -> Collector:
        collector: Collector = self.app.state.collector
        return collector


@asynccontextmanager
async def dashboard_served(
    db: DatabaseUrl, *, token: str | None = TOKEN, **settings: Any
) -> AsyncIterator[Served]:
    """The whole app (API, /metrics, dashboard) served over real HTTP; the metrics
    collector runs (its first round at start-up; ``collect_once`` for more)."""
    app = create_app(ApiSettings(db, AmqpUrl.parse(AMQP_URL), token, **settings))
    async with serving(app, lifespan="on") as port:
        yield Served(f"http://127.0.0.1:{port}", app)


@asynccontextmanager
async def serving(app: ASGIApp, port: int | None = None, **config: Any) -> AsyncIterator[int]:
    """``app`` served by uvicorn on 127.0.0.1 (at ``port``, or a free one) from when
    it listens until the block ends; the port."""
    port = port or free_port()
    server = QuietServer(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_config=None, access_log=False, **config
        )
    )
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(30):
        while not server.started:
            if task.done():
                task.result()
                raise AssertionError("uvicorn stopped before it started")
            await asyncio.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


@asynccontextmanager
async def chromium(refresh_seconds: float | None = None) -> AsyncIterator[BrowserContext]:
    """A fresh headless Chromium profile; ``refresh_seconds`` sets the dashboard's
    auto-refresh before any page loads (the person's choice, in localStorage)."""
    async with async_playwright() as playwright:
        with tempfile.TemporaryDirectory(prefix="hj-chromium-") as profile:
            context = await playwright.chromium.launch_persistent_context(
                profile,
                executable_path=str(CHROMIUM),
                args=CHROMIUM_ARGS,
                headless=True,
                viewport=VIEWPORT,  # type: ignore[arg-type]
            )
            context.set_default_timeout(30_000)
            if refresh_seconds is not None:
                await context.add_init_script(
                    "if (localStorage.getItem('jobctl.refresh.seconds') === null)"
                    f" localStorage.setItem('jobctl.refresh.seconds', '{refresh_seconds:g}');"
                )
            try:
                yield context
            finally:
                await context.close()


async def sign_in(page: Page, base: str, token: str = TOKEN, *, then: str = "/") -> None:
    await page.goto(f"{base}/login?next={then}")
    await page.get_by_test_id("token").fill(token)
    await page.get_by_test_id("sign-in").click()
    await page.wait_for_url(f"{base}{then}")
