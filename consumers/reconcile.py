"""Reconcile hooks (``@consumers.handler(..., reconcile=fn)``): a consumer whose
claim turned a job down because its resource is uncertain (the lease of a job
that held it expired) asks the hook of that job's type what happened at the
target, and resolves the resource when the hook can say.

The hook runs outside any transaction, once per such refusal (a job turned down
for an uncertain resource has no wake-up until the resource is resolved, so it
is not asked again and again). What it returns is recorded as the resolution's
outcome, by ``reconcile (<worker>)``; None, or an exception, leaves the resource
uncertain for an operator (``jobctl resources resolve``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.consumers.store import JobStore
from hybrid_jobs.plumbing.logfmt import describe_error

log = logging.getLogger("consumer")

# The outcome recorded is cut to this many characters.
MAX_OUTCOME_LENGTH = 2000


@dataclass(frozen=True)
class Uncertain:
    """What a reconcile hook is asked about: ``resource``, and the job whose lease
    expired holding it (``job_id``, ``job_type``, ``payload``), since when."""

    resource: str
    job_id: uuid.UUID
    job_type: str
    payload: Any
    uncertain_since: datetime


async def reconcile(store: JobStore, registry: Registry, job_ids: list[uuid.UUID]) -> int:
    """Ask the hooks about the uncertain resources of these jobs; the number resolved."""
    resolved = 0
    for row in await store.uncertain_for(job_ids):
        hold = Uncertain(*row)
        handler = registry.get(hold.job_type)
        if handler is None or handler.reconcile is None:
            continue
        try:
            if inspect.iscoroutinefunction(handler.reconcile):
                said = await handler.reconcile(hold)
            else:
                said = await asyncio.to_thread(handler.reconcile, hold)
        except Exception as exc:
            log.warning(
                "consumer.reconcile_failed",
                extra={
                    "resource": hold.resource,
                    "job_id": str(hold.job_id),
                    "error": describe_error(exc),
                    "action": "the resource stays uncertain",
                },
            )
            continue
        if said is None:
            continue
        outcome = str(said)[:MAX_OUTCOME_LENGTH]
        if await store.resolve_resource(hold.resource, f"reconcile ({store.worker})", outcome):
            resolved += 1
            log.info(
                "consumer.resource_reconciled",
                extra={"resource": hold.resource, "job_id": str(hold.job_id), "outcome": outcome},
            )
    return resolved
