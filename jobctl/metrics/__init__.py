"""Prometheus metrics for ``GET /metrics`` of ``jobctl serve``.

One :class:`Collector` reads the tables on an interval, in one read-only snapshot
under an advisory lock, and caches what it found; a scrape renders the cache and
never queries the database. Gauges read only the backlog, through the partial
indexes; counters and histograms read the history incrementally, only the rows that
finished since the last round, so a collection costs what the backlog and the recent
traffic cost, not what the history costs (bench/metrics_cost.py measures it).

Modules: ``queries`` (the statements), ``reading`` (one round's reads),
``cursor`` (the high-water mark over a history), ``totals`` (what has accumulated,
and the snapshot), ``histogram`` (buckets), ``exposition`` (names, definitions and
the prometheus-client collector), ``collector`` (the loop, the lock, the cache).
The metrics are listed in docs/guides/metrics.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybrid_jobs.jobctl.lazy import lazy_exports

if TYPE_CHECKING:
    from hybrid_jobs.jobctl.metrics.collector import Collector, CollectorSettings
    from hybrid_jobs.jobctl.metrics.exposition import Status
    from hybrid_jobs.jobctl.metrics.totals import Snapshot

# The module of each name below, imported on first use (PEP 562): ``jobctl stats``
# reads some of ``queries`` and needs none of prometheus-client, which these bring.
_MODULES: dict[str, str] = {
    "Collector": "collector",
    "CollectorSettings": "collector",
    "Status": "exposition",
    "Snapshot": "totals",
}

__all__ = ["Collector", "CollectorSettings", "Snapshot", "Status"]


__getattr__, __dir__ = lazy_exports(__name__, _MODULES, __all__)
