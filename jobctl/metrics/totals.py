"""What the collector has learnt: this round's gauges, the counters and histograms
accumulated since it started, and the frozen snapshot the exposition reads.

Labels are queue, job_type, state, outcome and operation, each from a small set the
operator controls; never a job id, a worker id or error text (the worker id is only
a key for the increase of its counters).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Final, TypeVar

from jobctl.metrics.cursor import Cursor, Seen
from jobctl.metrics.histogram import (
    ATTEMPT_BUCKETS,
    EXECUTION_BUCKETS,
    LATENCY_BUCKETS,
    WAIT_BUCKETS,
    FrozenHistogram,
    Histogram,
)
from jobctl.metrics.reading import Attempt, Cursors, Reading, Worker
from schema.states import CLAIMABLE, LEASED, JobState

T = TypeVar("T")
K = TypeVar("K")

# The non-terminal states, in the order the exposition lists them.
GAUGE_STATES: Final = tuple(str(state) for state in sorted(CLAIMABLE | LEASED))

# The outcome label of an attempt: what it left the job in, in words.
OUTCOMES: Final[Mapping[str, str]] = MappingProxyType(
    {
        JobState.SUCCEEDED: "succeeded",
        JobState.RETRY_WAIT: "retry_scheduled",
        JobState.FAILED: "failed",
        JobState.CANCELLED: "cancelled",
        JobState.QUEUED: "given_back",  # a graceful stop refunded the attempt
    }
)

# The operation label of a fence rejection, by the consumer's counter name.
FENCE_OPERATIONS: Final[Mapping[str, str]] = MappingProxyType(
    {"stale_outcome": "outcome", "lease_lost": "heartbeat"}
)


WORKER_MEMORY: Final = timedelta(hours=1)


def worker_queue(worker: Worker) -> str:
    """The queue label of a worker's fence rejections. A consumer counts them per
    process, not per queue: one that serves a single queue names it; one that serves
    several cannot say which, and says "" (an empty label, which Prometheus treats
    as absent) rather than pretend."""
    return worker.queues[0] if len(worker.queues) == 1 else ""


@dataclass(frozen=True)
class Snapshot:
    """One successful round, as the exposition shows it. Immutable: a scrape reads
    it while the next round builds the next one."""

    jobs: Mapping[tuple[str, str], int]
    oldest_runnable_age: Mapping[str, float]
    running_lease_expired: Mapping[str, int]
    outbox_unsent_rows: int
    outbox_oldest_unsent_age: float
    relays_live: int
    relays_publishing: int
    publish_failing: Mapping[tuple[str, str], int]
    attempts_finished: Mapping[tuple[str, str, str], int]
    leases_expired: Mapping[str, int]
    fence_rejections: Mapping[tuple[str, str], int]
    queue_wait: Mapping[str, FrozenHistogram]
    execution: Mapping[tuple[str, str, str], FrozenHistogram]
    attempts_per_success: Mapping[str, FrozenHistogram]
    scheduler_delay: FrozenHistogram
    cancellation_latency: FrozenHistogram


@dataclass
class Totals:
    cursors: Cursors
    # Queues seen since the collector started: their gauges read 0 when idle rather
    # than vanish, and their counters exist before the first increase.
    queues: set[str] = field(default_factory=set)
    attempts_finished: defaultdict[tuple[str, str, str], int] = field(
        default_factory=lambda: defaultdict(int)
    )
    leases_expired: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    fence_rejections: defaultdict[tuple[str, str], int] = field(
        default_factory=lambda: defaultdict(int)
    )
    queue_wait: dict[str, Histogram] = field(default_factory=dict)
    execution: dict[tuple[str, str, str], Histogram] = field(default_factory=dict)
    attempts_per_success: dict[str, Histogram] = field(default_factory=dict)
    scheduler_delay: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    cancellation_latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    # Each worker's counters as last seen, and when, by worker id (never a label).
    workers: dict[str, tuple[tuple[int, int], datetime]] = field(default_factory=dict)
    rounds: int = 0

    @classmethod
    def new(cls, overlap: float, limit: int) -> Totals:
        return cls(Cursors.new(overlap, limit))

    def apply(self, reading: Reading) -> Snapshot:
        """Fold a successful round in; returns the snapshot to serve."""
        self.queues.update(queue for queue, *_ in reading.waiting)
        self.queues.update(queue for queue, *_ in reading.leased)
        self.queues.update(reading.queues)
        for worker in reading.workers:
            self.queues.update(worker.queues)
        self._attempts(_take(self.cursors.attempts, reading.attempts, reading))
        for latency in _take(self.cursors.cancellations, reading.cancellations, reading):
            if latency is not None:
                self.cancellation_latency.observe(latency)
        for delay in _take(self.cursors.fires, reading.fires, reading):
            self.scheduler_delay.observe(delay)
        self._fences(reading.workers, reading.now)
        self.rounds += 1
        return self._snapshot(reading)

    def _attempts(self, attempts: list[Attempt | None]) -> None:
        for a in attempts:
            if a is None or a.queue is None or a.job_type is None:
                continue  # its job is gone; nothing to label it with
            self.queues.add(a.queue)
            outcome = OUTCOMES.get(a.outcome, a.outcome.lower())
            # Every outcome of a (queue, job_type) exists from its first attempt on,
            # at 0, so a rate of failures is there before the first failure.
            for other in OUTCOMES.values():
                self.attempts_finished[(a.queue, a.job_type, other)] += 0
            key = (a.queue, a.job_type, outcome)
            self.attempts_finished[key] += 1
            self.execution.setdefault(key, Histogram(EXECUTION_BUCKETS)).observe(a.execution_s)
            if a.wait_s is not None:
                self.queue_wait.setdefault(a.queue, Histogram(WAIT_BUCKETS)).observe(a.wait_s)
            if a.outcome == JobState.SUCCEEDED:
                self.attempts_per_success.setdefault(a.queue, Histogram(ATTEMPT_BUCKETS)).observe(
                    a.attempt
                )
            if a.lease_expired:
                self.leases_expired[a.queue] += 1

    def _fences(self, workers: list[Worker], now: datetime) -> None:
        first = self.rounds == 0
        for worker in workers:
            counts = (worker.stale_outcomes, worker.leases_lost)
            queue = worker_queue(worker)
            for operation in FENCE_OPERATIONS.values():
                self.fence_rejections[(queue, operation)] += 0
            before = self.workers.get(worker.worker_id)
            self.workers[worker.worker_id] = (counts, now)
            if first:
                continue  # what workers counted before the collector started
            # A worker first seen now counts from zero, as does one whose counters
            # went down (its process restarted under the same id).
            old = before[0] if before else (0, 0)
            for operation, value, was in (
                (FENCE_OPERATIONS["stale_outcome"], counts[0], old[0]),
                (FENCE_OPERATIONS["lease_lost"], counts[1], old[1]),
            ):
                self.fence_rejections[(queue, operation)] += value - was if value >= was else value
        # A worker whose row the relay expired (frozen past the worker TTL) may come
        # back under its id with its counters: remembered for a while, it is not
        # counted from zero again. What a worker counted between our last look and
        # its exit is lost.
        horizon = now - WORKER_MEMORY
        self.workers = {w: seen for w, seen in self.workers.items() if seen[1] >= horizon}

    def _snapshot(self, reading: Reading) -> Snapshot:
        jobs = {(queue, state): 0 for queue in self.queues for state in GAUGE_STATES}
        oldest = dict.fromkeys(self.queues, 0.0)
        expired = dict.fromkeys(self.queues, 0)
        for queue, state, count, age in reading.waiting:
            jobs[(queue, state)] = count
            if age is not None:
                oldest[queue] = max(oldest[queue], age)
        for queue, state, count, lapsed in reading.leased:
            jobs[(queue, state)] = count
            expired[queue] += lapsed
        leases = {queue: self.leases_expired.get(queue, 0) for queue in self.queues}
        return Snapshot(
            jobs=MappingProxyType(jobs),
            oldest_runnable_age=MappingProxyType(oldest),
            running_lease_expired=MappingProxyType(expired),
            outbox_unsent_rows=reading.outbox_due,
            outbox_oldest_unsent_age=max(0.0, reading.outbox_oldest_age or 0.0),
            relays_live=reading.relays[0],
            relays_publishing=reading.relays[1],
            publish_failing=MappingProxyType(
                {(queue, reason): n for queue, reason, n in reading.publish_failing}
            ),
            attempts_finished=MappingProxyType(dict(self.attempts_finished)),
            leases_expired=MappingProxyType(leases),
            fence_rejections=MappingProxyType(dict(self.fence_rejections)),
            queue_wait=_frozen(self.queue_wait),
            execution=_frozen(self.execution),
            attempts_per_success=_frozen(self.attempts_per_success),
            scheduler_delay=self.scheduler_delay.frozen(),
            cancellation_latency=self.cancellation_latency.frozen(),
        )


def _take(cursor: Cursor, rows: list[Seen[T]], reading: Reading) -> list[T]:
    return cursor.take(rows, reading.now)


def _frozen(histograms: Mapping[K, Histogram]) -> Mapping[K, FrozenHistogram]:
    return MappingProxyType({key: h.frozen() for key, h in histograms.items()})
