"""The consumer's settings: one frozen object, built by the CLI and passed down."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybrid_jobs import defaults
from hybrid_jobs.plumbing.config import AmqpUrl, ConfigError, DatabaseUrl
from hybrid_jobs.schema.topology import Topology

MESSAGES_AHEAD = 2
# The consumer's own statements (claims, heartbeats, outcomes) have a small pool of
# their own, so handlers holding connections can never starve a heartbeat.
OWN_POOL_SIZE = 4


@dataclass(frozen=True)
class ConsumerSettings:
    """Each field\'s default, and what it means, is ``CONSUMER_<FIELD>`` of
    :mod:`hybrid_jobs.defaults`."""

    database: DatabaseUrl
    amqp: AmqpUrl
    queues: tuple[str, ...]
    topology: Topology = field(default_factory=Topology)
    concurrency: int = defaults.CONSUMER_CONCURRENCY
    prefetch: int = defaults.CONSUMER_PREFETCH
    lease_seconds: float = defaults.CONSUMER_LEASE_SECONDS
    heartbeat_seconds: float = defaults.CONSUMER_HEARTBEAT_SECONDS
    drain_seconds: float = defaults.CONSUMER_DRAIN_SECONDS
    default_timeout: float | None = defaults.CONSUMER_DEFAULT_TIMEOUT
    force_cancel_grace: float = defaults.CONSUMER_FORCE_CANCEL_GRACE
    claim_batch: int = defaults.CONSUMER_CLAIM_BATCH
    report_batch: int = defaults.CONSUMER_REPORT_BATCH
    stats_interval: float = defaults.CONSUMER_STATS_INTERVAL
    worker_ttl: float = defaults.CONSUMER_WORKER_TTL
    tenants: tuple[str, ...] = defaults.CONSUMER_TENANTS
    queue_limits: tuple[tuple[str, int], ...] = defaults.CONSUMER_QUEUE_LIMITS

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
        if self.force_cancel_grace < 0:
            raise ConfigError("the force cancel grace must not be negative")
        if self.worker_ttl <= 0:
            raise ConfigError("the worker TTL must be positive")
        if self.claim_batch < 1 or self.report_batch < 1 or self.stats_interval <= 0:
            raise ConfigError("batch sizes and the stats interval must be positive")
        named = [queue for queue, _ in self.queue_limits]
        if len(set(named)) != len(named):
            raise ConfigError("a queue limit names the same queue twice")
        for queue, limit in self.queue_limits:
            # A limit of a queue this consumer does not serve would be recorded by
            # a process that never claims from it: a typo, most likely.
            if queue not in self.queues:
                raise ConfigError(f"queue limit of {queue!r}: this consumer does not serve it")
            if isinstance(limit, bool) or not 1 <= limit <= defaults.MAX_QUEUE_LIMIT:
                raise ConfigError(
                    f"queue limit of {queue!r} must be from 1 to {defaults.MAX_QUEUE_LIMIT}"
                )

    @property
    def effective_prefetch(self) -> int:
        """The prefetch to start with (and RabbitMQ's window's): the one given, or
        the concurrency, which it doubles while the jobs are short
        (consumers/prefetch.py)."""
        return self.prefetch or self.concurrency

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


def connections_of(concurrency: int, *, plain_handlers: bool = False) -> int:
    """The most connections to PostgreSQL a consumer process of this concurrency
    holds: its own pool and its async handlers' (``concurrency``); with
    ``plain_handlers``, the pool of its plain handlers' threads too, opened when the
    first one asks for a connection (``jobctl doctor`` adds them up against
    max_connections)."""
    handlers = concurrency * (2 if plain_handlers else 1)
    return OWN_POOL_SIZE + handlers
