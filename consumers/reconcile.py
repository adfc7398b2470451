"""Reconcile hooks (``@consumers.handler(..., reconcile=fn)``): a consumer whose
claim turned a job down because its resource is uncertain (the lease of a job
that held it expired) asks the hook of that job's type what happened at the
target, and resolves the resource when the hook can say.

The hook runs outside any transaction, once per such refusal (a job turned down
for an uncertain resource has no wake-up until the resource is resolved, so it
is not asked again and again). What it returns is recorded as the resolution's
outcome, by ``reconcile (<worker>)``; None, or an exception, leaves the resource
uncertain for an operator (``jobctl resources resolve``).

The answer is about one hold: the one the hook was shown (``job_id`` and
``lease_generation``), and it resolves that hold only. If it was resolved while the
hook looked, and a later lease (another job's, or the same job's retry) took the
resource and left it uncertain in turn, the answer changes nothing: logged as
``consumer.reconcile_stale``, and the later hold waits for its own answer.

A holder that retention deleted leaves its hold uncertain all the same. Its type is
unknown then, so the hook asked is that of the job turned down for the resource
(the first, by type, with a hook), shown the hold with ``job_type`` and ``payload``
None (``Uncertain.job_gone``). With no such hook nobody is asked, and the hold stays
for an operator: ``jobctl resources list`` shows it, its job state "deleted".
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hybrid_jobs.consumers.registry import Handler, Registry
from hybrid_jobs.consumers.store import JobStore
from hybrid_jobs.plumbing.logfmt import describe_error

log = logging.getLogger("consumer")

# The outcome recorded is cut to this many characters.
MAX_OUTCOME_LENGTH = 2000


@dataclass(frozen=True)
class Uncertain:
    """What a reconcile hook is asked about: ``resource``, and the job whose lease
    expired holding it (``job_id``, ``job_type``, ``payload``), since when, and that
    lease's ``lease_generation`` (the answer resolves this hold only; 0 in one made
    by hand, as a test of a hook does: no lease has generation 0).

    ``job_type`` and ``payload`` are None when retention has deleted the job
    (:attr:`job_gone`): the hook asked then is that of the job waiting for the
    resource, and knows the holder by its id only."""

    resource: str
    job_id: uuid.UUID
    job_type: str | None
    payload: Any
    uncertain_since: datetime
    lease_generation: int = 0

    @property
    def job_gone(self) -> bool:
        """Whether the holder job is gone (retention deleted it): its type and
        payload are unknown."""
        return self.job_type is None


def _hook(registry: Registry, hold: Uncertain, asking: Sequence[str]) -> Handler | None:
    """The handler whose hook is asked about ``hold``: the holder type's; with the
    holder gone, the first of the types turned down for it that has one."""
    types = [hold.job_type] if hold.job_type is not None else asking
    for job_type in types:
        handler = registry.get(job_type)
        if handler is not None and handler.reconcile is not None:
            return handler
    return None


async def reconcile(store: JobStore, registry: Registry, job_ids: list[uuid.UUID]) -> int:
    """Ask the hooks about the uncertain resources of these jobs; the number resolved."""
    resolved = 0
    for row in await store.uncertain_for(job_ids):
        hold = Uncertain(
            resource=row[0],
            job_id=row[1],
            lease_generation=row[2],
            job_type=row[3],
            payload=row[4],
            uncertain_since=row[5],
        )
        handler = _hook(registry, hold, row[6])
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
        about = {
            "resource": hold.resource,
            "job_id": str(hold.job_id),
            "lease_generation": hold.lease_generation,
            "outcome": outcome,
        }
        if await store.resolve_resource(
            hold.resource,
            hold.job_id,
            hold.lease_generation,
            f"reconcile ({store.worker})",
            outcome,
        ):
            resolved += 1
            log.info("consumer.resource_reconciled", extra=about)
        else:
            log.info(
                "consumer.reconcile_stale",
                extra={
                    **about,
                    "action": "nothing resolved: the hold asked about was resolved"
                    " meanwhile (the resource is free, or a later lease's)",
                },
            )
    return resolved
