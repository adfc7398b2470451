"""The consumer's settings: one frozen object, built by the CLI and passed down."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybrid_jobs.plumbing.config import AmqpUrl, ConfigError, DatabaseUrl
from hybrid_jobs.schema.queries import WORKER_TTL_SECONDS
from hybrid_jobs.schema.topology import Topology

MESSAGES_AHEAD = 2


@dataclass(frozen=True)
class ConsumerSettings:
    database: DatabaseUrl
    amqp: AmqpUrl
    queues: tuple[str, ...]
    topology: Topology = field(default_factory=Topology)
    # Jobs running at once in this process.
    concurrency: int = 10
    # Job ids held beyond the free slots (delivered, waiting for a slot); 0 means as
    # many as the concurrency. Ids past that are handed back for other consumers.
    prefetch: int = 0
    lease_seconds: float = 60.0
    # 0 means a third of the lease, which tolerates one lost heartbeat.
    heartbeat_seconds: float = 0.0
    # On SIGTERM, how long running jobs may take to finish before the claims of async
    # handlers are given back (plain functions are waited for: consumers/worker.py).
    drain_seconds: float = 30.0
    # The time limit of an attempt whose handler sets none (see DEFAULT_TIMEOUT);
    # None for no limit.
    default_timeout: float | None = 900.0
    claim_batch: int = 100
    report_batch: int = 500
    stats_interval: float = 30.0
    # A worker row not refreshed for this long belongs to a consumer that is gone
    # (WORKER_TTL_SECONDS says why one figure).
    worker_ttl: float = WORKER_TTL_SECONDS
    # The dedicated tenants (tenant_limits.runners) this consumer may serve, besides
    # every shared one (consumer --tenant).
    tenants: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.queues:
            raise ConfigError("no queues to consume: register handlers or pass --queue")
        if self.concurrency < 1:
            raise ConfigError("concurrency must be at least 1")
        if self.prefetch < 0:
            raise ConfigError("prefetch must not be negative")
        if self.lease_seconds <= 0:
            raise ConfigError("lease seconds must be positive")
        if self.heartbeat_seconds < 0 or self.heartbeat_seconds >= self.lease_seconds:
            raise ConfigError("heartbeat seconds must be shorter than the lease")
        if self.drain_seconds < 0:
            raise ConfigError("drain seconds must not be negative")
        if self.default_timeout is not None and not self.default_timeout > 0:
            raise ConfigError("default timeout must be positive (0 on the command line: none)")
        if self.worker_ttl <= 0:
            raise ConfigError("the worker TTL must be positive")
        if self.claim_batch < 1 or self.report_batch < 1 or self.stats_interval <= 0:
            raise ConfigError("batch sizes and the stats interval must be positive")

    @property
    def effective_prefetch(self) -> int:
        return self.prefetch or self.concurrency

    @property
    def capacity(self) -> int:
        """The most job ids this worker holds at once: running, or waiting for a slot."""
        return self.concurrency + self.effective_prefetch

    @property
    def messages_ahead(self) -> int:
        """RabbitMQ's QoS: unacknowledged messages it may push to this worker. Two,
        so the next message is here as the last ids of one are claimed; the relay
        packs at most half a prefetch of ids into a message (WORKER_PACK_LIMIT), so
        two fit in the prefetch."""
        return min(MESSAGES_AHEAD, self.effective_prefetch)

    @property
    def effective_heartbeat(self) -> float:
        return self.heartbeat_seconds or self.lease_seconds / 3
