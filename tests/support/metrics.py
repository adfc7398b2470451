"""Reading the metrics collector's Prometheus text back in tests."""

from __future__ import annotations

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from hybrid_jobs.jobctl.metrics import Collector
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.plumbing.db import make_pool


class Scrape:
    """A parsed exposition, with lookups by sample name and labels."""

    def __init__(self, collector: Collector) -> None:
        body, content_type = collector.render()
        assert content_type.startswith("text/plain; version=0.0.4")
        self.families: dict[str, Metric] = {
            f.name: f for f in text_string_to_metric_families(body.decode())
        }

    def value(self, sample: str, **labels: str) -> float:
        """The one sample of that name whose labels include these; 0 if none."""
        found = [
            s.value
            for f in self.families.values()
            for s in f.samples
            if s.name == sample and labels.items() <= s.labels.items()
        ]
        assert len(found) <= 1, f"{sample} {labels} is ambiguous: {found}"
        return found[0] if found else 0.0

    def label_values(self) -> set[str]:
        return {v for f in self.families.values() for s in f.samples for v in s.labels.values()}

    def label_names(self) -> set[str]:
        return {n for f in self.families.values() for s in f.samples for n in s.labels}


async def scrape_once(db_url: DatabaseUrl, application_name: str) -> Scrape:
    """One collector round on a pool of its own, closed before the text is read."""
    pool = make_pool(db_url, application_name, max_size=1)
    await pool.open(wait=True)
    try:
        collector = Collector(pool)
        assert await collector.collect_once()
        return Scrape(collector)
    finally:
        await pool.close()
