"""Queues the relay cannot publish to right now, each backed off on its own.

A failure that belongs to one queue (relay.broker.QueueFailure: RabbitMQ refused
its wake-ups or its declaration, confirmed none in time, or its decision statement
timed out) must not slow the others: that queue alone waits an exponential backoff
with jitter, capped, before the relay tries it again, and its wake-ups wait in the
outbox meanwhile (the failed batch rolled back). Which queue fails and why is logged
when it starts, then at most once a minute while it lasts, and when it ends; the
relay's heartbeat publishes the current set on its row in ``relays``
(``failing_queues``), where ``jobctl stats``, the metrics and the dashboard read it.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hybrid_jobs.relay.broker import QueueFailure

log = logging.getLogger("relay")

# A failing queue is logged once when it starts failing, then at most this often.
LOG_EVERY = 60.0


@dataclass
class Failing:
    reason: str
    detail: str
    # Wall-clock time of the first failure in this run of them, for people.
    since: float
    failures: int
    # Monotonic: when the queue may be tried again, and when it was last logged.
    retry_at: float
    logged_at: float
    # Failures since the last log line.
    unlogged: int


class QueueBackoff:
    def __init__(self, base: float, cap: float) -> None:
        self.base = base
        self.cap = cap
        self.failing: dict[str, Failing] = {}

    def ready(self, queue: str) -> bool:
        """Whether the queue may be tried now: not failing, or its backoff is over."""
        failing = self.failing.get(queue)
        return failing is None or failing.retry_at <= time.monotonic()

    def failed(self, failure: QueueFailure) -> None:
        now = time.monotonic()
        f = self.failing.get(failure.queue)
        if f is None:
            f = self.failing[failure.queue] = Failing(
                failure.reason, failure.detail, time.time(), 0, now, -LOG_EVERY, 0
            )
        f.failures += 1
        f.unlogged += 1
        f.reason, f.detail = failure.reason, failure.detail
        # 0.5, 1, 2, 4 ... up to the cap, each spread by +-20% so that relays (and
        # the queues of one relay) do not retry in step.
        delay = min(self.cap, self.base * 2 ** min(f.failures - 1, 30))
        f.retry_at = now + delay * random.uniform(0.8, 1.2)
        if now - f.logged_at >= LOG_EVERY:
            log.warning(
                "relay.queue_publish_failing",
                extra={
                    "queue": failure.queue,
                    "reason": f.reason,
                    "detail": f.detail,
                    "failures": f.unlogged,
                    "failing_for_s": round(time.time() - f.since, 1),
                    "retry_in_s": round(f.retry_at - now, 2),
                    "action": "this queue alone is backed off; its wake-ups wait in the "
                    "outbox, and every other queue's go out as usual",
                },
            )
            f.logged_at, f.unlogged = now, 0

    def succeeded(self, queue: str) -> None:
        f = self.failing.pop(queue, None)
        if f is not None:
            log.info(
                "relay.queue_publish_recovered",
                extra={
                    "queue": queue,
                    "reason": f.reason,
                    "failures": f.failures,
                    "failed_for_s": round(time.time() - f.since, 1),
                },
            )

    def keep_only(self, due: set[str]) -> None:
        """Forget failing queues that have no wake-up due any more (their jobs were
        cancelled, say): nothing is waiting on them, so nothing fails."""
        for queue in [q for q in self.failing if q not in due]:
            f = self.failing.pop(queue)
            log.info(
                "relay.queue_publish_failing_ended",
                extra={
                    "queue": queue,
                    "reason": f.reason,
                    "why": "no wake-up of the queue is due any more",
                },
            )

    def next_retry(self) -> float | None:
        """Seconds until the first failing queue may be tried again; None if none
        is failing."""
        if not self.failing:
            return None
        return max(0.0, min(f.retry_at for f in self.failing.values()) - time.monotonic())

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """The failing queues as the relay's row in ``relays`` carries them."""
        return {
            queue: {
                "reason": f.reason,
                "detail": f.detail,
                "since": datetime.fromtimestamp(f.since, UTC).isoformat(),
                "failures": f.failures,
            }
            for queue, f in sorted(self.failing.items())
        }
