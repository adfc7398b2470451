"""Keeping this worker's leases, and its row in ``workers``, alive.

Every heartbeat interval one fenced statement extends every lease the worker holds
(running jobs and outcomes not yet recorded). What comes back per job:

- its state: the lease was extended; CANCEL_REQUESTED is passed on to the handler,
  and a forced one to ``on_forced`` (consumers/forced_cancel.py), which interrupts it;
- LOCKED: the lease is still ours but another transaction holds the row (a
  producer's open cancel request, say): renewed alone, every half second, until it
  goes through or the lease surely ran out;
- nothing: the fence turned it away (the lease expired and the job moved on), and
  the handler is cancelled without reporting anything.

If the database cannot be reached, a lease that has surely run out by the worker's
own clock is given up the same way; the fence would refuse its outcome anyway.

The worker's row says which queues and job types it serves, with what capacity,
and its counters; the relay sizes its window from it, the claim of a job with no
handler here checks whether any live worker has one, and the operator surface lists
it. It is refreshed at the heartbeat, at least every third of the worker TTL, and
as soon as the prefetch changes (the relay packs by it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

from hybrid_jobs.consumers.job import Job
from hybrid_jobs.consumers.ledger import Ledger
from hybrid_jobs.consumers.settings import ConsumerSettings
from hybrid_jobs.consumers.store import Beat, JobStore
from hybrid_jobs.plumbing.logfmt import describe_error
from hybrid_jobs.schema.states import JobState

log = logging.getLogger("consumer")

LOCKED_RENEW_INTERVAL = 0.5


class LeaseKeeper:
    def __init__(
        self,
        settings: ConsumerSettings,
        store: JobStore,
        ledger: Ledger,
        job_types: list[str],
        counts: Callable[[], Mapping[str, int]],
        on_forced: Callable[[Job], None] = lambda job: None,
        policies: Sequence[Mapping[str, object]] = (),
        webhooks: Sequence[Mapping[str, object]] = (),
        limits: Sequence[Mapping[str, object]] = (),
        prefetch: Callable[[], int] | None = None,
    ) -> None:
        """``prefetch``: the ids held beyond the free slots now, for the workers
        row (the relay packs by it); :meth:`prefetch_changed` writes it soon."""
        self.settings = settings
        self.store = store
        self.ledger = ledger
        self.job_types = job_types
        self.counts = counts
        self.on_forced = on_forced
        self.policies = [dict(p) for p in policies]
        self.webhooks = [dict(w) for w in webhooks]
        self.limits = [dict(x) for x in limits]
        self.prefetch = prefetch or (lambda: settings.effective_prefetch)
        self.row_changed = asyncio.Event()
        self.locked: set[uuid.UUID] = set()
        self.stopping = False
        # Back (WORKER_SEEN) and its waiting jobs not woken yet (came_back).
        self.owes_wake = False

    def worker_row(self) -> dict[str, object]:
        s = self.settings
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": list(s.queues),
            "job_types": self.job_types,
            "tenants": list(s.tenants),
            "concurrency": s.concurrency,
            "prefetch": self.prefetch(),
            "stopping": self.stopping,
            "counts": _json_counts(self.counts()),
            "worker_ttl": s.worker_ttl,
        }

    async def announce(self) -> None:
        """Register the worker, record what its handlers' job types allow (the
        last consumer to start wins), and wake the jobs that waited for a consumer
        that knows their type, or names their dedicated tenant: they start now, not
        at the relay's next re-wake."""
        await self.store.seen(self.worker_row())
        if self.policies:
            changed = await self.store.record_policies(self.policies)
            for policy in self.policies:
                if policy["job_type"] in changed:
                    log.info("consumer.job_type_policy_recorded", extra=policy)
        if self.webhooks:
            changed = await self.store.record_webhooks(self.webhooks)
            for hook in self.webhooks:
                if hook["job_type"] in changed:
                    log.info("consumer.job_type_webhook_recorded", extra=hook)
        if self.limits:
            changed = await self.store.record_limits(self.limits)
            for limit in self.limits:
                if limit["job_type"] in changed:
                    log.info("consumer.concurrency_limit_recorded", extra=limit)
        if self.settings.queue_limits:
            recorded = await self.store.record_queue_limits(self.settings.queue_limits)
            for queue, n in self.settings.queue_limits:
                if queue in recorded:
                    log.info("consumer.queue_limit_recorded", extra={"queue": queue, "limit": n})
        woken = await self.store.wake_parked(
            self.settings.queues, self.job_types, self.settings.concurrency
        )
        if woken:
            log.info(
                "consumer.woke_waiting_jobs",
                extra={"count": woken, "why": "a consumer that can run them arrived"},
            )

    async def run(self) -> None:
        s = self.settings
        heartbeat_every = s.effective_heartbeat
        seen_every = min(heartbeat_every, s.worker_ttl / 3)
        next_heartbeat = next_seen = time.monotonic()
        while True:
            now = time.monotonic()
            wake_at = min(next_heartbeat, next_seen)
            if self.locked:
                wake_at = min(wake_at, now + LOCKED_RENEW_INTERVAL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.row_changed.wait(), max(0.0, wake_at - now))
            now = time.monotonic()
            if self.row_changed.is_set():
                self.row_changed.clear()
                next_seen = now
            if now >= next_heartbeat:
                next_heartbeat = now + heartbeat_every
                await self.renew([h.job.fence for h in self.ledger.leases()])
            elif self.locked:
                for job_id in list(self.locked):
                    waiting = self.ledger.held.get(job_id)
                    if waiting is None:
                        self.locked.discard(job_id)
                    else:
                        await self.renew([waiting.job.fence])
            if now >= next_seen:
                next_seen = now + seen_every
                try:
                    back = await self.store.seen(self.worker_row())
                except Exception as exc:
                    log.warning("consumer.worker_row_failed", extra={"error": describe_error(exc)})
                    continue
                # (owed until it succeeds: the next row refresh no longer says so)
                self.owes_wake = (self.owes_wake or back) and not self.stopping
                if self.owes_wake:
                    try:
                        await self.came_back()
                        self.owes_wake = False
                    except Exception as exc:
                        log.warning(
                            "consumer.wake_waiting_failed", extra={"error": describe_error(exc)}
                        )

    def prefetch_changed(self) -> None:
        """The prefetch changed: say so in the workers row now, not at the next
        refresh, so that the relay packs by it."""
        self.row_changed.set()

    async def came_back(self) -> None:
        """Its row had expired, or a lease of it had lapsed (it was frozen, say):
        it was not live meanwhile, and the jobs only it could run were left to wait
        for a consumer to come. It has come: wake them, as at start."""
        woken = await self.store.wake_parked(
            self.settings.queues, self.job_types, self.settings.concurrency
        )
        log.info(
            "consumer.back",
            extra={"woke_waiting_jobs": woken, "why": "its row had expired or a lease lapsed"},
        )

    async def renew(self, fences: list[tuple[uuid.UUID, int]]) -> None:
        if not fences:
            return
        sent_at = time.monotonic()
        try:
            beats = await self.store.heartbeat(fences)
        except Exception as exc:
            log.warning("consumer.heartbeat_failed", extra={"error": describe_error(exc)})
            for lease in self.ledger.leases():
                if lease.job.lease_surely_expired():
                    self.ledger.lose(lease.job, "the lease ran out while heartbeats failed")
            return
        for job_id, generation in fences:
            held = self.ledger.held.get(job_id)
            if held is None or held.job.generation != generation:
                continue
            job = held.job
            state, forced = beats.get(job_id, Beat(None))
            if state == "LOCKED":
                if job.lease_surely_expired():
                    self.locked.discard(job_id)
                    self.ledger.lose(
                        job, "the lease ran out while another transaction held the row"
                    )
                elif job_id not in self.locked:
                    self.locked.add(job_id)
                    log.info(
                        "consumer.heartbeat_deferred",
                        extra={"job_id": str(job_id), "why": "another transaction holds the row"},
                    )
                continue
            self.locked.discard(job_id)
            if state is None:
                self.ledger.lose(job, "the heartbeat was rejected by the fence")
                continue
            job.lease_deadline = sent_at + self.settings.lease_seconds
            if state == JobState.CANCEL_REQUESTED and not job.cancel_requested:
                job.cancel_requested = True
                log.info("consumer.cancel_requested", extra={"job_id": str(job_id)})
            if forced:
                self.on_forced(job)


def _json_counts(counts: Mapping[str, int]) -> str:
    return json.dumps({str(k): int(v) for k, v in counts.items()})
