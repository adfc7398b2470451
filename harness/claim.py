"""JOB_CLAIM_MANY's parameters as a consumer serving one no-op handler binds them, for
the test of the claim's plan and the benchmark of its cost. The terms come from the
consumer's own ``Registry.claim_terms``, so they follow what it sends."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hybrid_jobs import consumers, defaults
from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.schema.queries import WORKER_TTL_SECONDS

_REGISTRY = Registry()


@_REGISTRY.handler("noop", max_attempts=3)
async def _noop(job: consumers.Job) -> None:
    return None


def claim_params(job_ids: Sequence[Any], worker: str) -> dict[str, Any]:
    """Claim ``job_ids`` for ``worker`` with no thread free, a 30 s lease."""
    return {
        "job_ids": list(job_ids),
        "types": json.dumps(_REGISTRY.claim_terms()),
        "free_threads": 0,
        "worker": worker,
        "lease_seconds": 30,
        "worker_ttl": WORKER_TTL_SECONDS,
        # the tenants the consumer names (consumer --tenant): none
        "tenants": [],
        # the queues it serves: its handler's
        "queues": _REGISTRY.queues(),
        # its --concurrency, all of it free (what a weighed job is measured against):
        # room for the whole batch, as the consumer claims no more than it has room for
        "concurrency": max(defaults.CONSUMER_CONCURRENCY, len(job_ids)),
        "free_slots": max(defaults.CONSUMER_CONCURRENCY, len(job_ids)),
    }
