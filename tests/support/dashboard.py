"""The dashboard for tests and screenshots: `jobctl serve`'s app under a real
uvicorn on a free port, in the caller's event loop (so a test can reach its
metrics collector), and Debian's Chromium driven by Playwright."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
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


class _Browser:
    """One headless Chromium per test process, started at its first use and shared:
    each test gets a context of its own in it (its own cookies, storage and cache,
    as a fresh profile would have). Launching one per test cost about two seconds
    of CPU each, on a runner the suite keeps busy."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._profile: str | None = None
        self._endpoint = ""
        atexit.register(self.stop)

    def endpoint(self) -> str:
        """The running browser's DevTools address (started again if it died)."""
        if self._proc is not None and self._proc.poll() is None:
            return self._endpoint
        self.stop()
        self._profile = tempfile.mkdtemp(prefix="hj-chromium-")
        port = free_port()
        self._proc = subprocess.Popen(
            [
                str(CHROMIUM),
                *CHROMIUM_ARGS,
                f"--remote-debugging-port={port}",
                f"--user-data-dir={self._profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{self._endpoint}/json/version", timeout=1):
                    break
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"chromium did not start ({self._proc.poll()})") from None
                time.sleep(0.05)
        return self._endpoint

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._profile is not None:
            # Chromium's helper processes may still be writing to it as they go.
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None


_BROWSER = _Browser()


@asynccontextmanager
async def chromium(refresh_seconds: float | None = None) -> AsyncIterator[BrowserContext]:
    """A fresh headless Chromium context; ``refresh_seconds`` sets the dashboard's
    auto-refresh before any page loads (the person's choice, in localStorage). A
    test that asks for one where Chromium is not installed is skipped, and says so,
    as scripts/test promises."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (scripts/test installs it)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.connect_over_cdp(_BROWSER.endpoint())
        try:
            context = await browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
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
        finally:
            await browser.close()


async def sign_in(page: Page, base: str, token: str = TOKEN, *, then: str = "/") -> None:
    await page.goto(f"{base}/login?next={then}")
    await page.get_by_test_id("token").fill(token)
    await page.get_by_test_id("sign-in").click()
    await page.wait_for_url(f"{base}{then}")
