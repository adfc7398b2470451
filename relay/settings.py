"""The relay's settings: one frozen object, built by the CLI and passed down."""

from __future__ import annotations

from dataclasses import dataclass, field

from plumbing.config import AmqpUrl, ConfigError, DatabaseUrl
from schema.topology import Topology


@dataclass(frozen=True)
class RelaySettings:
    database: DatabaseUrl
    amqp: AmqpUrl
    topology: Topology = field(default_factory=Topology)
    # Wake on NOTIFY, and at least this often in case a notification was missed.
    poll_interval: float = 1.0
    batch_size: int = 500
    # Outbox batches in flight at once, each in its own transaction: while one waits
    # for the broker's confirms, the next is already being claimed.
    publishers: int = 2
    # The publish inside the claim transaction is the one network call allowed
    # there; it must not hold row locks for long.
    publish_timeout: float = 5.0
    retention: float = 300.0
    prune_interval: float = 10.0
    prune_batch: int = 5000
    # Leases that expired without a report are swept this often.
    sweep_interval: float = 5.0
    sweep_batch: int = 1000
    # Due jobs whose wake-up was lost are woken again after at most this long.
    rewake_interval: float = 30.0
    rewake_batch: int = 5000
    # Due occurrences of recurring schedules are fired this often.
    schedule_interval: float = 1.0
    # Relay-wide gauges (published, rate) are logged this often.
    stats_interval: float = 30.0

    def __post_init__(self) -> None:
        positive = {
            "poll_interval": self.poll_interval,
            "batch_size": self.batch_size,
            "publishers": self.publishers,
            "publish_timeout": self.publish_timeout,
            "prune_interval": self.prune_interval,
            "prune_batch": self.prune_batch,
            "stats_interval": self.stats_interval,
            "sweep_interval": self.sweep_interval,
            "sweep_batch": self.sweep_batch,
            "rewake_interval": self.rewake_interval,
            "rewake_batch": self.rewake_batch,
            "schedule_interval": self.schedule_interval,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.retention < self.rewake_interval:
            # The re-waker reads sent wake-ups to tell "sent lately" from "lost".
            raise ConfigError("retention must be at least the re-wake interval")
