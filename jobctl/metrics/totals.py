"""What the collector has learnt: this round's gauges, the counters and histograms
accumulated since it started, and the frozen snapshot the exposition reads.

Labels are queue, job_type, state, outcome and operation; never a job id, a worker
id or error text (the worker id is only a key for the increase of its counters).
Queue names and job types are whatever producers write, so each is bounded
(:mod:`jobctl.metrics.labels`): past the first so many, values share the ``_other``
series, and a value unseen for an hour is forgotten with its series.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Final, TypeVar

from hybrid_jobs.jobctl.metrics.cursor import Cursor, Seen
from hybrid_jobs.jobctl.metrics.histogram import (
    ATTEMPT_BUCKETS,
    EXECUTION_BUCKETS,
    LATENCY_BUCKETS,
    WAIT_BUCKETS,
    FrozenHistogram,
    Histogram,
)
from hybrid_jobs.jobctl.metrics.history import EMPTY, History, HistoryView
from hybrid_jobs.jobctl.metrics.labels import LabelBudget
from hybrid_jobs.jobctl.metrics.reading import Attempt, Cursors, Reading, Worker
from hybrid_jobs.schema.states import CLAIMABLE, LEASED, DelayReason, JobState

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
        "SNOOZED": "snoozed",  # the handler raised Snooze: refunded, due later
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
    awaiting_approval: Mapping[str, int]

    rate_limited: Mapping[str, int]
    expired: Mapping[str, int]
    # The last hour by minute, for the dashboard's charts (not exported).
    history: HistoryView = EMPTY
    key_waits: Mapping[tuple[str, str], int] = field(default_factory=dict)
    no_authorized_runner: Mapping[str, int] = field(default_factory=dict)
    resources_uncertain: int = 0
    waiting_for_parents: Mapping[str, int] = field(default_factory=dict)
    resource_waits: Mapping[tuple[str, str], int] = field(default_factory=dict)
    tenant_cap: Mapping[str, int] = field(default_factory=dict)
    concurrency_limit: Mapping[str, int] = field(default_factory=dict)
    queue_limit: Mapping[str, int] = field(default_factory=dict)
    too_heavy: Mapping[str, int] = field(default_factory=dict)
    # Webhook calls per state (PENDING, DELIVERED, GAVE_UP), and their failed attempts.
    webhook_calls: Mapping[str, int] = field(default_factory=dict)
    webhook_failed_attempts: Mapping[str, int] = field(default_factory=dict)


# A webhook call's states, each shown (0 when none is in it).
WEBHOOK_STATES: Final = {"DELIVERED": 0, "GAVE_UP": 0, "PENDING": 0}
# Why a job waits for its key (delay_reason), a label of jobs_waiting_for_key.
KEY_WAITS: Final = (DelayReason.KEY_BUSY, DelayReason.KEY_ORDER)
# Why a job waits for its resource, a label of jobs_waiting_for_resource.
RESOURCE_WAITS: Final = (DelayReason.RESOURCE_BUSY, DelayReason.RESOURCE_UNCERTAIN)

# The bounds on label values (see jobctl.metrics.labels), CollectorSettings' defaults.
MAX_QUEUES: Final = 100
MAX_JOB_TYPES: Final = 200
FORGET_AFTER: Final = timedelta(hours=1)


@dataclass
class Totals:
    cursors: Cursors
    # Queues (and job types) seen lately, each under its label: their gauges read 0
    # when idle rather than vanish, their counters exist before the first increase,
    # and one unseen for FORGET_AFTER goes with its series.
    queue_labels: LabelBudget = field(default_factory=lambda: LabelBudget(MAX_QUEUES, FORGET_AFTER))
    job_type_labels: LabelBudget = field(
        default_factory=lambda: LabelBudget(MAX_JOB_TYPES, FORGET_AFTER)
    )
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
    history: History = field(default_factory=History)
    rounds: int = 0

    @classmethod
    def new(
        cls,
        overlap: float,
        limit: int,
        *,
        max_queues: int = MAX_QUEUES,
        max_job_types: int = MAX_JOB_TYPES,
        forget_after: timedelta = FORGET_AFTER,
        history: History | None = None,
    ) -> Totals:
        return cls(
            Cursors.new(overlap, limit),
            LabelBudget(max_queues, forget_after),
            LabelBudget(max_job_types, forget_after),
            history=history or History(),
        )

    @property
    def queues(self) -> frozenset[str]:
        """The queue labels with series now."""
        return self.queue_labels.labels

    def _queue(self, queue: str, now: datetime) -> str:
        return self.queue_labels.label(queue, now)

    def apply(self, reading: Reading) -> Snapshot:
        """Fold a successful round in; returns the snapshot to serve."""
        now = reading.now
        present = {queue for queue, *_ in reading.waiting}
        present.update(queue for queue, *_ in reading.leased)
        present.update(reading.queues)
        for worker in reading.workers:
            present.update(worker.queues)
        attempts = _take(self.cursors.attempts, reading.attempts, reading)
        # Forgotten first, so a label stays one thing for the whole round.
        self._forget(
            now,
            present | {a.queue for a in attempts if a is not None and a.queue is not None},
            {a.job_type for a in attempts if a is not None and a.job_type is not None},
        )
        # In name order, so which queues get a series of their own when more than
        # the bound appear at once does not depend on the order rows came in.
        for queue in sorted(present):
            self._queue(queue, now)
        self._attempts(attempts, now)
        assert self.cursors.attempts.mark is not None  # taken above
        self.history.read_until(now, self.cursors.attempts.mark)
        for latency in _take(self.cursors.cancellations, reading.cancellations, reading):
            if latency is not None:
                self.cancellation_latency.observe(latency)
        for delay in _take(self.cursors.fires, reading.fires, reading):
            self.scheduler_delay.observe(delay)
        self._fences(reading.workers, now)
        self.rounds += 1
        return self._snapshot(reading)

    def _attempts(self, attempts: list[Attempt | None], now: datetime) -> None:
        for a in attempts:
            if a is None or a.queue is None or a.job_type is None:
                continue  # its job is gone; nothing to label it with
            queue = self._queue(a.queue, now)
            job_type = self.job_type_labels.label(a.job_type, now)
            outcome = OUTCOMES.get(a.outcome, a.outcome.lower())
            # Every outcome of a (queue, job_type) exists from its first attempt on,
            # at 0, so a rate of failures is there before the first failure.
            for other in OUTCOMES.values():
                self.attempts_finished[(queue, job_type, other)] += 0
            key = (queue, job_type, outcome)
            self.attempts_finished[key] += 1
            self.execution.setdefault(key, Histogram(EXECUTION_BUCKETS)).observe(a.execution_s)
            self.history.add(queue, a.finished_at, a.outcome, a.wait_s)
            if a.wait_s is not None:
                self.queue_wait.setdefault(queue, Histogram(WAIT_BUCKETS)).observe(a.wait_s)
            if a.outcome == JobState.SUCCEEDED:
                self.attempts_per_success.setdefault(queue, Histogram(ATTEMPT_BUCKETS)).observe(
                    a.attempt
                )
            if a.lease_expired:
                self.leases_expired[queue] += 1

    def _forget(self, now: datetime, queues_seen: set[str], job_types_seen: set[str]) -> None:
        """Drop the series of queues and job types not seen for FORGET_AFTER (those
        seen in this round are kept)."""
        queues = set(self.queue_labels.forget(now, queues_seen))
        job_types = set(self.job_type_labels.forget(now, job_types_seen))
        if not queues and not job_types:
            return
        for key in [k for k in self.attempts_finished if k[0] in queues or k[1] in job_types]:
            del self.attempts_finished[key]
        for key in [k for k in self.execution if k[0] in queues or k[1] in job_types]:
            del self.execution[key]
        self.history.forget(queues)
        for queue in queues:
            self.queue_wait.pop(queue, None)
            self.attempts_per_success.pop(queue, None)
            self.leases_expired.pop(queue, None)
        for fence in [k for k in self.fence_rejections if k[0] in queues]:
            del self.fence_rejections[fence]

    def _fences(self, workers: list[Worker], now: datetime) -> None:
        first = self.rounds == 0
        for worker in workers:
            counts = (worker.stale_outcomes, worker.leases_lost)
            queue = worker_queue(worker)
            if queue:
                queue = self._queue(queue, now)
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
        now = reading.now
        jobs = {(queue, state): 0 for queue in self.queues for state in GAUGE_STATES}
        oldest = dict.fromkeys(self.queues, 0.0)
        expired = dict.fromkeys(self.queues, 0)
        # Queues past the bound add up under OTHER: counts summed, ages the largest.
        for name, state, count, age in reading.waiting:
            queue = self._queue(name, now)
            jobs[(queue, state)] += count
            if age is not None:
                oldest[queue] = max(oldest[queue], age)
        key_waits: dict[tuple[str, str], int] = {
            (queue, str(why)): 0 for queue in self.queues for why in KEY_WAITS
        }
        for name, why, count in reading.key_waits:
            key_waits[(self._queue(name, now), why)] += count
        resource_waits: dict[tuple[str, str], int] = {
            (queue, str(why)): 0 for queue in self.queues for why in RESOURCE_WAITS
        }
        for name, why, count in reading.resource_waits:
            resource_waits[(self._queue(name, now), why)] += count
        for name, state, count, lapsed in reading.leased:
            queue = self._queue(name, now)
            jobs[(queue, state)] += count
            expired[queue] += lapsed
        awaiting = dict.fromkeys(self.queues, 0)
        for name, count in reading.awaiting_approval:
            awaiting[self._queue(name, now)] += count
        leases = {queue: self.leases_expired.get(queue, 0) for queue in self.queues}
        waits: dict[str, dict[str, int]] = {}
        for kind, rows in (
            ("rate_limited", reading.rate_limited),
            ("expired", reading.expired),
            ("no_authorized_runner", reading.no_authorized_runner),
            ("waiting_for_parents", reading.waiting_for_parents),
            ("tenant_cap", reading.tenant_cap),
            ("concurrency_limit", reading.concurrency_limit),
            ("queue_limit", reading.queue_limit),
            ("too_heavy", reading.too_heavy),
        ):
            counts = waits.setdefault(kind, dict.fromkeys(self.queues, 0))
            for name, count in rows:
                queue = self._queue(name, now)
                counts[queue] = counts.get(queue, 0) + count
        return Snapshot(
            rate_limited=MappingProxyType(waits["rate_limited"]),
            expired=MappingProxyType(waits["expired"]),
            no_authorized_runner=MappingProxyType(waits["no_authorized_runner"]),
            waiting_for_parents=MappingProxyType(waits["waiting_for_parents"]),
            tenant_cap=MappingProxyType(waits["tenant_cap"]),
            concurrency_limit=MappingProxyType(waits["concurrency_limit"]),
            queue_limit=MappingProxyType(waits["queue_limit"]),
            too_heavy=MappingProxyType(waits["too_heavy"]),
            resource_waits=MappingProxyType(resource_waits),
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
            awaiting_approval=MappingProxyType(awaiting),
            history=self.history.view(),
            key_waits=MappingProxyType(key_waits),
            resources_uncertain=reading.resources_uncertain,
            webhook_calls=MappingProxyType(
                WEBHOOK_STATES | {state: n for state, n, _ in reading.webhook_calls}
            ),
            webhook_failed_attempts=MappingProxyType(
                WEBHOOK_STATES | {state: failed for state, _, failed in reading.webhook_calls}
            ),
        )


def _take(cursor: Cursor, rows: list[Seen[T]], reading: Reading) -> list[T]:
    return cursor.take(rows, reading.now)


def _frozen(histograms: Mapping[K, Histogram]) -> Mapping[K, FrozenHistogram]:
    return MappingProxyType({key: h.frozen() for key, h in histograms.items()})
