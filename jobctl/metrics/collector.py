"""The collector: one round of reads on an interval, a cached snapshot, and the
Prometheus text rendered from that cache.

``jobctl serve`` owns one::

    collector = Collector.for_database(settings.database)
    await collector.start()          # at startup: first round now, then every ~15 s
    body, content_type = collector.render()   # GET /metrics, never a query
    await collector.stop()           # at shutdown

Several ``jobctl serve`` processes may each run one: a transaction-scoped advisory
lock lets one collection run at a time (another process skips that round and keeps
serving its cache), so the database does the work once per interval at most. Each
process still keeps its own counters, computed from the same tables: scrape one
process, or aggregate counters across them with ``max``, not ``sum``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from types import MappingProxyType

from prometheus_client import CollectorRegistry, generate_latest
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from hybrid_jobs import defaults
from hybrid_jobs.jobctl.metrics.exposition import SnapshotExporter, Status
from hybrid_jobs.jobctl.metrics.history import History
from hybrid_jobs.jobctl.metrics.reading import read_round
from hybrid_jobs.jobctl.metrics.totals import Snapshot, Totals
from hybrid_jobs.plumbing.config import ConfigError, DatabaseUrl
from hybrid_jobs.plumbing.db import make_pool
from hybrid_jobs.plumbing.logfmt import describe_error

log = logging.getLogger("jobctl")

# The classic text format, which generate_latest writes and every Prometheus reads
# (prometheus-client's CONTENT_TYPE_LATEST names a newer version that is meant to be
# negotiated through the Accept header).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class CollectorSettings:
    """Each field\'s default, and what it means, is ``METRICS_<FIELD>`` of
    :mod:`hybrid_jobs.defaults`."""

    interval: float = defaults.METRICS_INTERVAL
    jitter: float = defaults.METRICS_JITTER
    statement_timeout: float = defaults.METRICS_STATEMENT_TIMEOUT
    overlap: float = defaults.METRICS_OVERLAP
    batch: int = defaults.METRICS_BATCH
    max_queues: int = defaults.METRICS_MAX_QUEUES
    max_job_types: int = defaults.METRICS_MAX_JOB_TYPES
    forget_after: float = defaults.METRICS_FORGET_AFTER
    history_span: float = defaults.METRICS_HISTORY_SPAN
    history_resolution: float = defaults.METRICS_HISTORY_RESOLUTION

    def __post_init__(self) -> None:
        if self.interval <= 0 or not 0 <= self.jitter < 1:
            raise ConfigError("the metrics interval must be positive, its jitter in [0, 1)")
        if self.statement_timeout <= 0 or self.overlap < 0 or self.batch < 1:
            raise ConfigError("metrics statement timeout, overlap and batch must be positive")
        if self.max_queues < 1 or self.max_job_types < 1 or self.forget_after <= 0:
            raise ConfigError("the metrics label bounds and forget_after must be positive")
        if self.history_resolution <= 0 or self.history_span < self.history_resolution:
            raise ConfigError("the history resolution must be positive and within its span")


class Collector:
    def __init__(
        self,
        pool: AsyncConnectionPool[AsyncConnection],
        settings: CollectorSettings | None = None,
        *,
        owns_pool: bool = False,
    ) -> None:
        """Collects through ``pool``; ``owns_pool``: open and close it with start/stop."""
        self.settings = settings or CollectorSettings()
        self._pool = pool
        self._owns_pool = owns_pool
        self._totals = Totals.new(
            self.settings.overlap,
            self.settings.batch,
            max_queues=self.settings.max_queues,
            max_job_types=self.settings.max_job_types,
            forget_after=timedelta(seconds=self.settings.forget_after),
            history=History(self.settings.history_span, self.settings.history_resolution),
        )
        self._snapshot: Snapshot | None = None
        self._status = Status()
        self._round_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        # Its own registry, not prometheus-client's global one: the process's other
        # metrics (or a second collector in a test) never collide with these.
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotExporter(self._cached))

    @classmethod
    def for_database(
        cls, database: DatabaseUrl, settings: CollectorSettings | None = None
    ) -> Collector:
        """A collector with a pool of its own (one connection: rounds never overlap)."""
        pool = make_pool(database, "jobctl-metrics", max_size=1)
        return cls(pool, settings, owns_pool=True)

    # ------------------------------------------------------------------ the cache

    def _cached(self) -> tuple[Snapshot | None, Status]:
        return self._snapshot, self._status

    @property
    def status(self) -> Status:
        return self._status

    @property
    def snapshot(self) -> Snapshot | None:
        """The last successful round (None before the first); the dashboard reads
        its figures from here, as a scrape does."""
        return self._snapshot

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition of the cached snapshot, and its content
        type. Reads no table; safe to call from any thread."""
        return generate_latest(self.registry), CONTENT_TYPE

    # ------------------------------------------------------------------ rounds

    async def collect_once(self) -> bool:
        """One round: True if it collected, False if another process was collecting
        (the cache stays). A failure raises, and changes nothing but the round count."""
        async with self._round_lock:
            started = time.perf_counter()
            try:
                async with self._pool.connection() as conn:
                    reading = await read_round(
                        conn, self._totals.cursors, self.settings.statement_timeout
                    )
            except Exception:
                self._count("failed")
                raise
            if reading is None:
                self._count("skipped")
                return False
            self._snapshot = self._totals.apply(reading)
            self._status = replace(
                self._status,
                last_success=time.time(),
                duration=time.perf_counter() - started,
            )
            self._count("collected")
            return True

    def _count(self, result: str) -> None:
        rounds = dict(self._status.rounds)
        rounds[result] += 1
        self._status = replace(self._status, rounds=MappingProxyType(rounds))

    # ------------------------------------------------------------------ background

    async def start(self) -> None:
        """Start collecting in the background: a round now, then one every interval."""
        if self._task is not None:
            return
        if self._owns_pool:
            # Not waiting for a connection: serving must not depend on the database
            # being up; a round that finds it down fails and the next one retries.
            await self._pool.open(wait=False)
        self._task = asyncio.create_task(self._run(), name="metrics-collector")

    @property
    def running(self) -> bool:
        """Whether the background rounds are going."""
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._owns_pool:
            await self._pool.close()

    def next_delay(self) -> float:
        s = self.settings
        return s.interval * (1 + random.uniform(-s.jitter, s.jitter))

    async def _run(self) -> None:
        failing = False
        while True:
            try:
                await self.collect_once()
            except Exception as exc:
                # Logged when it starts failing and when it recovers, not every round.
                if not failing:
                    log.warning(
                        "metrics.collect_failed",
                        extra={
                            "error": describe_error(exc),
                            "action": "serving the last snapshot; retrying every round",
                        },
                    )
                failing = True
            else:
                if failing:
                    log.info("metrics.collect_recovered")
                failing = False
            await asyncio.sleep(self.next_delay())
