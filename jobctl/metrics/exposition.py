"""The metrics as Prometheus sees them: a prometheus-client custom collector that
turns the cached snapshot into metric families. A scrape runs only this; it never
touches the database.

Names follow the Prometheus conventions: a ``hybrid_jobs_`` prefix, base units
(seconds), ``_total`` on counters (prometheus-client adds it), histograms rather
than summaries so several processes aggregate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, TypeVar

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from hybrid_jobs.jobctl.metrics.histogram import FrozenHistogram
from hybrid_jobs.jobctl.metrics.totals import Snapshot

# A series' label values, in the order of its family's label names.
L = TypeVar("L", bound=tuple[str, ...])

PREFIX: Final = "hybrid_jobs_"

# The results a round can have, for hybrid_jobs_collector_rounds_total.
ROUND_RESULTS: Final = ("collected", "skipped", "failed")


@dataclass(frozen=True)
class Status:
    """The collector's own health; replaced whole after every round."""

    last_success: float = 0.0  # unix time; 0 until the first successful round
    duration: float = 0.0  # seconds the last successful round took
    rounds: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType(dict.fromkeys(ROUND_RESULTS, 0))
    )


def _histogram(
    name: str, doc: str, labels: list[str], series: Mapping[L, FrozenHistogram]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(PREFIX + name, doc, labels=labels)
    for values, h in sorted(series.items()):
        family.add_metric(list(values), list(h.buckets), h.sum)
    return family


def _counter(
    name: str, doc: str, labels: list[str], series: Mapping[L, int]
) -> CounterMetricFamily:
    family = CounterMetricFamily(PREFIX + name, doc, labels=labels)
    for values, value in sorted(series.items()):
        family.add_metric(list(values), value)
    return family


def _gauge(name: str, doc: str, labels: list[str], series: Mapping[L, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
    for values, value in sorted(series.items()):
        family.add_metric(list(values), value)
    return family


def _by_queue(series: Mapping[str, float]) -> dict[tuple[str, ...], float]:
    return {(queue,): value for queue, value in series.items()}


def snapshot_families(s: Snapshot) -> Iterable[Metric]:
    """Every metric of a snapshot. The definitions here are the documentation."""
    yield _gauge(
        "jobs",
        "Jobs not yet finished, per queue and state (QUEUED, RETRY_WAIT, RUNNING,"
        " CANCEL_REQUESTED), as of the last collection.",
        ["queue", "state"],
        s.jobs,
    )
    yield _gauge(
        "jobs_awaiting_approval",
        "Jobs enqueued with needs_approval that wait for approval (QUEUED, counted in"
        " jobs too), per queue, as of the last collection.",
        ["queue"],
        _by_queue(s.awaiting_approval),
    )
    yield _gauge(
        "resources_uncertain",
        "Exclusive resources an expired lease left uncertain (its worker vanished while"
        " it held one): no job of them starts until someone resolves them (jobctl"
        " resources resolve, outbox.resolve_resource). Alert on any.",
        [],
        {(): s.resources_uncertain},
    )
    yield _gauge(
        "webhook_calls",
        "Calls owed to completion webhooks, per state: PENDING (due, being made, or"
        " waiting out a back-off), DELIVERED, GAVE_UP (the relay's --webhook-max-attempts"
        " calls failed: alert on a rise). Settled ones are kept for the relay's"
        " --keep-finished.",
        ["state"],
        {(state,): n for state, n in s.webhook_calls.items()},
    )
    yield _gauge(
        "webhook_failed_attempts",
        "Failed attempts (a status outside 2xx, a timeout, a refused connection) of the"
        " webhook calls kept, per the call's state now.",
        ["state"],
        {(state,): n for state, n in s.webhook_failed_attempts.items()},
    )
    yield _gauge(
        "jobs_waiting_for_key",
        "Waiting jobs a consumer last turned down for their key, per queue and reason:"
        " KEY_BUSY (key_limit jobs of the key hold a lease) or KEY_ORDER (an earlier"
        " ordered job of the key has not finished). Each starts when the lease ahead of"
        " it ends; the count is of the last refusals, not a live test of the keys.",
        ["queue", "reason"],
        s.key_waits,
    )
    yield _gauge(
        "jobs_waiting_for_parents",
        "Jobs enqueued with after= that wait for their parents (explain DEPENDENCY:"
        " QUEUED, held, counted in jobs too), per queue: each is woken by the end of"
        " its last parent.",
        ["queue"],
        _by_queue(s.waiting_for_parents),
    )
    yield _gauge(
        "jobs_waiting_for_resource",
        "Waiting jobs a consumer last turned down for their exclusive resource, per"
        " queue and reason: RESOURCE_BUSY (another job's lease holds it) or"
        " RESOURCE_UNCERTAIN (its holder vanished; nothing of it starts until resolved)."
        " The count is of the last refusals, not a live test of the resources.",
        ["queue", "reason"],
        s.resource_waits,
    )
    yield _gauge(
        "jobs_waiting_for_tenant_slot",
        "Waiting jobs a consumer last turned down for their tenant's cap (TENANT_CAP:"
        " max_running of the tenant's jobs hold leases), per queue. Each starts when a"
        " slot of its tenant frees; the count is of the last refusals, not a live test"
        " of the tenants.",
        ["queue"],
        _by_queue(s.tenant_cap),
    )
    yield _gauge(
        "jobs_waiting_for_concurrency_limit",
        "Waiting jobs a consumer last turned down for their type's concurrency limit"
        " (CONCURRENCY_LIMIT: global_limit jobs of the type hold leases, across all"
        " consumers), per queue. Each starts when a lease of its type ends; the count is"
        " of the last refusals, not a live test of the limits.",
        ["queue"],
        _by_queue(s.concurrency_limit),
    )
    yield _gauge(
        "jobs_waiting_for_queue_concurrency_limit",
        "Waiting jobs a consumer last turned down for their queue's concurrency limit"
        " (QUEUE_CONCURRENCY_LIMIT: the queue's limit of its jobs hold leases, across all"
        " consumers), per queue. Each starts when a lease of its queue ends; the count is"
        " of the last refusals, not a live test of the limits.",
        ["queue"],
        _by_queue(s.queue_limit),
    )
    yield _gauge(
        "jobs_waiting_for_larger_consumer",
        "Waiting jobs a consumer last turned down because their weight is above its"
        " whole --concurrency (WEIGHT_OVER_CONCURRENCY), per queue. Each starts only on a"
        " consumer with at least as many slots as it weighs.",
        ["queue"],
        _by_queue(s.too_heavy),
    )
    yield _gauge(
        "queue_oldest_runnable_age_seconds",
        "Age of the queue's oldest job that could run now (QUEUED or RETRY_WAIT with"
        " run_after in the past): now - run_after; 0 when none is due.",
        ["queue"],
        _by_queue(s.oldest_runnable_age),
    )
    yield _gauge(
        "outbox_unsent_rows",
        "Wake-ups due and not yet sent (sent_at IS NULL and available_at <= now): the"
        " backlog beyond each queue's window, which the relay holds back by design, and"
        " any lag. Wake-ups not yet due and those of paused queues are not counted.",
        [],
        {(): s.outbox_unsent_rows},
    )
    yield _gauge(
        "outbox_oldest_unsent_age_seconds",
        "How long the oldest due, unsent wake-up has been due (now - available_at);"
        " 0 when there is none. Grows with any backlog: alert on relays_publishing.",
        [],
        {(): s.outbox_oldest_unsent_age},
    )
    yield _gauge(
        "relays_live",
        "Relay processes whose heartbeat was seen in the last 30 seconds.",
        [],
        {(): s.relays_live},
    )
    yield _gauge(
        "relays_publishing",
        "Live relays connected to RabbitMQ: 0 means no wake-up goes out.",
        [],
        {(): s.relays_publishing},
    )
    yield _gauge(
        "queue_publish_failing",
        "Live relays that cannot publish the queue's wake-ups right now, by reason:"
        " refused (RabbitMQ nacked them), unroutable, declare_refused, unconfirmed (no"
        " confirm in time), decision_timeout. Each relay backs such a queue off alone;"
        " its jobs wait, the other queues' go out. A series exists only while it fails.",
        ["queue", "reason"],
        s.publish_failing,
    )
    yield _gauge(
        "jobs_rate_limited",
        "Jobs waiting for a token of their rate limit (delay_reason RATE_LIMITED): each"
        " is woken when its token is due.",
        ["queue"],
        _by_queue(s.rate_limited),
    )
    yield _gauge(
        "jobs_no_authorized_runner",
        "Jobs of a dedicated tenant that a consumer not naming it turned down"
        " (delay_reason NO_AUTHORIZED_RUNNER): they start on a consumer run with"
        " --tenant naming it.",
        ["queue"],
        _by_queue(s.no_authorized_runner),
    )
    yield _gauge(
        "jobs_expired",
        "Jobs that ended CANCELLED with code EXPIRED, never started before their"
        " deadline (enqueue's expires), as long as retention keeps them.",
        ["queue"],
        _by_queue(s.expired),
    )
    yield _gauge(
        "running_lease_expired_jobs",
        "Leased jobs (RUNNING or CANCEL_REQUESTED) whose lease has expired and that the"
        " sweeper has not moved on yet: stuck RUNNING if it lasts.",
        ["queue"],
        _by_queue(s.running_lease_expired),
    )
    yield _counter(
        "attempts_finished",
        "Attempts that ended, by what they left the job in: succeeded, retry_scheduled,"
        " failed, cancelled, given_back (a graceful stop refunded the attempt), snoozed"
        " (the handler raised Snooze: the attempt refunded, the job due later).",
        ["queue", "job_type", "outcome"],
        s.attempts_finished,
    )
    yield _histogram(
        "execution_seconds",
        "Duration of an attempt, from its claim to its end (finished_at - started_at).",
        ["queue", "job_type", "outcome"],
        s.execution,
    )
    yield _histogram(
        "queue_wait_seconds",
        "Time a job waited to be claimed once it was runnable (started_at - ready_at),"
        " for every claim.",
        ["queue"],
        {(queue,): h for queue, h in s.queue_wait.items()},
    )
    yield _histogram(
        "attempts_per_success",
        "The attempt number of each attempt that succeeded.",
        ["queue"],
        {(queue,): h for queue, h in s.attempts_per_success.items()},
    )
    yield _counter(
        "leases_expired",
        "Attempts whose lease expired without a report, ended by the sweeper.",
        ["queue"],
        {(queue,): n for queue, n in s.leases_expired.items()},
    )
    yield _counter(
        "fence_rejections",
        "Late writes the fence turned away, as counted by live consumers: operation"
        " 'outcome' (a stale outcome) or 'heartbeat' (a lease lost). queue is the"
        " consumer's queue, or empty for a consumer of several queues.",
        ["queue", "operation"],
        s.fence_rejections,
    )
    yield _histogram(
        "scheduler_delay_seconds",
        "How late the relay fired each occurrence of a recurring schedule that enqueued"
        " a job (fired - nominal instant).",
        [],
        {(): s.scheduler_delay},
    )
    yield _histogram(
        "cancellation_latency_seconds",
        "Time from a cancel request to the job ending CANCELLED (finished_at -"
        " cancel_requested_at).",
        [],
        {(): s.cancellation_latency},
    )


def status_families(status: Status) -> Iterable[Metric]:
    yield _gauge(
        "collector_last_success_timestamp_seconds",
        "Unix time of the metrics collector's last successful collection; 0 before the first.",
        [],
        {(): status.last_success},
    )
    yield _gauge(
        "collector_duration_seconds",
        "How long the last successful collection took.",
        [],
        {(): status.duration},
    )
    yield _counter(
        "collector_rounds",
        "Collection rounds of this process: collected, skipped (another process was"
        " collecting) or failed.",
        ["result"],
        {(result,): n for result, n in status.rounds.items()},
    )


class SnapshotExporter:
    """The prometheus-client collector (``prometheus_client.registry.Collector``)
    over the cache: ``source`` returns the latest snapshot (None before the first
    successful round) and status."""

    def __init__(self, source: Callable[[], tuple[Snapshot | None, Status]]) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        snapshot, status = self._source()
        if snapshot is not None:
            yield from snapshot_families(snapshot)
        yield from status_families(status)
