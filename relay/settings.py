"""The relay's settings: one frozen object, built by the CLI and passed down."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybrid_jobs import defaults
from hybrid_jobs.plumbing.config import AmqpUrl, ConfigError, DatabaseUrl
from hybrid_jobs.relay.webhook_hosts import AllowedHosts
from hybrid_jobs.schema.queries import RELAY_LIVE_SECONDS
from hybrid_jobs.schema.topology import Topology

HEARTBEAT_INTERVAL_MAX = RELAY_LIVE_SECONDS / 3
# The relay's pool holds a connection per publisher and these besides, for the
# chores and the heartbeat, so a slow publish never holds them up.
POOL_BESIDE_PUBLISHERS = 3


@dataclass(frozen=True)
class RelaySettings:
    """Each field\'s default, and what it means, is ``RELAY_<FIELD>`` of
    :mod:`hybrid_jobs.defaults`."""

    database: DatabaseUrl
    amqp: AmqpUrl
    topology: Topology = field(default_factory=Topology)
    poll_interval: float = defaults.RELAY_POLL_INTERVAL
    batch_size: int = defaults.RELAY_BATCH_SIZE
    window: int | None = defaults.RELAY_WINDOW
    min_window: int = defaults.RELAY_MIN_WINDOW
    pack: int = defaults.RELAY_PACK
    refill_interval: float = defaults.RELAY_REFILL_INTERVAL
    refill_interval_cap: float = defaults.RELAY_REFILL_INTERVAL_CAP
    publishers: int = defaults.RELAY_PUBLISHERS
    publish_timeout: float = defaults.RELAY_PUBLISH_TIMEOUT
    queue_backoff: float = defaults.RELAY_QUEUE_BACKOFF
    queue_backoff_cap: float = defaults.RELAY_QUEUE_BACKOFF_CAP
    sweep_interval: float = defaults.RELAY_SWEEP_INTERVAL
    sweep_batch: int = defaults.RELAY_SWEEP_BATCH
    default_backoff: float = defaults.RELAY_DEFAULT_BACKOFF
    rewake_interval: float = defaults.RELAY_REWAKE_INTERVAL
    orphan_interval: float = defaults.RELAY_ORPHAN_INTERVAL
    orphan_slice: int = defaults.RELAY_ORPHAN_SLICE
    refusal_interval: float = defaults.RELAY_REFUSAL_INTERVAL
    reconcile_interval: float = defaults.RELAY_RECONCILE_INTERVAL
    usage_interval: float = defaults.RELAY_USAGE_INTERVAL
    worker_ttl: float = defaults.RELAY_WORKER_TTL
    heartbeat_interval: float = defaults.RELAY_HEARTBEAT_INTERVAL
    schedule_interval: float = defaults.RELAY_SCHEDULE_INTERVAL
    stats_interval: float = defaults.RELAY_STATS_INTERVAL
    keep_finished: float = defaults.RELAY_KEEP_FINISHED
    retention_interval: float = defaults.RELAY_RETENTION_INTERVAL
    retention_batch: int = defaults.RELAY_RETENTION_BATCH
    keep_effects: float | None = defaults.RELAY_KEEP_EFFECTS
    webhook_concurrency: int = defaults.RELAY_WEBHOOK_CONCURRENCY
    webhook_per_endpoint: int = defaults.RELAY_WEBHOOK_PER_ENDPOINT
    webhook_timeout: float = defaults.RELAY_WEBHOOK_TIMEOUT
    webhook_max_attempts: int = defaults.RELAY_WEBHOOK_MAX_ATTEMPTS
    webhook_backoff: float = defaults.RELAY_WEBHOOK_BACKOFF
    webhook_backoff_cap: float = defaults.RELAY_WEBHOOK_BACKOFF_CAP
    webhook_endpoint_backoff: float = defaults.RELAY_WEBHOOK_ENDPOINT_BACKOFF
    webhook_interval: float = defaults.RELAY_WEBHOOK_INTERVAL
    webhook_allow_hosts: str = defaults.RELAY_WEBHOOK_ALLOW_HOSTS
    # The key webhook calls are signed with ($WEBHOOK_SECRET or the file named by
    # $WEBHOOK_SECRET_FILE); None: the relay makes no call, and says so.
    webhook_secret: bytes | None = field(default=None, repr=False)

    @property
    def pool_size(self) -> int:
        """The most connections the relay's pool opens."""
        return self.publishers + POOL_BESIDE_PUBLISHERS

    def __post_init__(self) -> None:
        positive = {
            "poll_interval": self.poll_interval,
            "batch_size": self.batch_size,
            "min_window": self.min_window,
            "pack": self.pack,
            "refill_interval": self.refill_interval,
            "refill_interval_cap": self.refill_interval_cap,
            "publishers": self.publishers,
            "publish_timeout": self.publish_timeout,
            "queue_backoff": self.queue_backoff,
            "queue_backoff_cap": self.queue_backoff_cap,
            "stats_interval": self.stats_interval,
            "sweep_interval": self.sweep_interval,
            "sweep_batch": self.sweep_batch,
            "rewake_interval": self.rewake_interval,
            "orphan_interval": self.orphan_interval,
            "orphan_slice": self.orphan_slice,
            "refusal_interval": self.refusal_interval,
            "reconcile_interval": self.reconcile_interval,
            "usage_interval": self.usage_interval,
            "worker_ttl": self.worker_ttl,
            "heartbeat_interval": self.heartbeat_interval,
            "schedule_interval": self.schedule_interval,
            "keep_finished": self.keep_finished,
            "retention_interval": self.retention_interval,
            "retention_batch": self.retention_batch,
            "webhook_concurrency": self.webhook_concurrency,
            "webhook_per_endpoint": self.webhook_per_endpoint,
            "webhook_timeout": self.webhook_timeout,
            "webhook_max_attempts": self.webhook_max_attempts,
            "webhook_backoff": self.webhook_backoff,
            "webhook_backoff_cap": self.webhook_backoff_cap,
            "webhook_endpoint_backoff": self.webhook_endpoint_backoff,
            "webhook_interval": self.webhook_interval,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ConfigError(f"{name} must be positive")
        AllowedHosts.parse(self.webhook_allow_hosts)  # ConfigError for a bad list
        if self.keep_effects is not None and self.keep_effects <= 0:
            raise ConfigError("keep_effects must be positive (or unset, for ever)")
        if self.keep_effects is not None and self.keep_effects < self.keep_finished:
            raise ConfigError(
                "keep_effects must be at least keep_finished: an effect key must outlive "
                "the job that marked it"
            )
        if self.window is not None and self.window < 1:
            raise ConfigError("window must be at least 1 (or unset, for automatic)")
        if self.heartbeat_interval > HEARTBEAT_INTERVAL_MAX:
            raise ConfigError(
                f"heartbeat_interval must be at most {HEARTBEAT_INTERVAL_MAX:g} s "
                f"(a relay is live for {RELAY_LIVE_SECONDS} s)"
            )
        if self.pack > 1000:
            raise ConfigError("pack must be at most 1000 ids a message")
        if self.default_backoff < 0:
            raise ConfigError("default_backoff must not be negative")


def connections_of(publishers: int) -> int:
    """The most connections to PostgreSQL a relay with this many publishers holds:
    its pool and its LISTEN connection (``jobctl doctor`` adds them up against
    max_connections)."""
    return publishers + POOL_BESIDE_PUBLISHERS + 1
