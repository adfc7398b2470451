"""The relay's settings: one frozen object, built by the CLI and passed down."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybrid_jobs.plumbing.config import AmqpUrl, ConfigError, DatabaseUrl
from hybrid_jobs.schema.queries import RELAY_LIVE_SECONDS, WORKER_TTL_SECONDS
from hybrid_jobs.schema.topology import Topology

HEARTBEAT_INTERVAL_MAX = RELAY_LIVE_SECONDS / 3


@dataclass(frozen=True)
class RelaySettings:
    database: DatabaseUrl
    amqp: AmqpUrl
    topology: Topology = field(default_factory=Topology)
    # Wake on NOTIFY, and at least this often in case a notification was missed.
    poll_interval: float = 1.0
    # Wake-ups decided and published per transaction, at most.
    batch_size: int = 500
    # Wake-ups in flight (sent, not yet taken up by a consumer) per queue. None: twice
    # the concurrency of the queue's live consumers, and at least min_window. The
    # backlog beyond it waits in the tables, where priority and fair share order it.
    window: int | None = None
    min_window: int = 100
    # Job ids packed into one message when a batch holds several for a queue. At low
    # load a message carries one id, so latency does not pay for it. Measured
    # (README, Performance): 50 drains about 30% faster than 20, 100 no faster.
    pack: int = 50
    # While a backlog waits on a full window, how soon to look again for room (the
    # interval doubles, up to the cap, while no room appears).
    refill_interval: float = 0.005
    refill_interval_cap: float = 0.1
    # Transactions in flight at once: while one waits for the broker's confirms, the
    # next queue's is already being decided.
    publishers: int = 2
    # The publish inside the claim transaction is the one network call allowed
    # there; it must not hold row locks for long.
    publish_timeout: float = 5.0
    # A queue whose own publishes fail (RabbitMQ refuses them or their declaration,
    # confirms none in time, its decision times out) is tried again after this
    # long, doubling up to the cap, while every other queue carries on.
    queue_backoff: float = 0.5
    queue_backoff_cap: float = 5.0
    # Leases that expired without a report are swept this often.
    sweep_interval: float = 5.0
    sweep_batch: int = 1000
    # Backoff for an expired lease whose claim recorded none (claimed before 0003).
    default_backoff: float = 5.0
    # A wake-up sent this long ago and never taken up is sent again.
    rewake_interval: float = 30.0
    # The backstop for jobs with no wake-up at all reads this many jobs (by primary
    # key, whatever their state) this often: its cost per round is fixed, however
    # long the backlog; a lap of a million jobs takes about 200 rounds.
    orphan_interval: float = 1.0
    orphan_slice: int = 5000
    # A wake-up turned down for want of a handler waits (a backstop of 10 s) until a
    # live consumer with the handler has a free slot: looked for this often while
    # some wait (and every poll interval otherwise).
    refusal_interval: float = 0.05
    # Tenants' held slots are checked against the leases that hold them this often.
    reconcile_interval: float = 30.0
    # Waiting jobs of tenants with a max_queued are counted this often.
    usage_interval: float = 1.0
    # A consumer or relay not seen for this long is gone (WORKER_TTL_SECONDS says
    # why one figure).
    worker_ttl: float = WORKER_TTL_SECONDS
    # The relay's own row in `relays` (live, connected, published) is refreshed
    # this often; it counts as live for RELAY_LIVE_SECONDS after its last refresh, so
    # at most a third of that, to survive two lost refreshes.
    heartbeat_interval: float = 5.0
    # Due occurrences of recurring schedules are fired this often.
    schedule_interval: float = 1.0
    # Relay-wide figures (published, backlog per queue) are logged this often.
    stats_interval: float = 30.0
    # Finished jobs older than this many seconds are deleted (retention), checked
    # this often, this many per transaction.
    keep_finished: float = 7 * 24 * 3600.0
    retention_interval: float = 30.0
    retention_batch: int = 1000
    # Effect keys (tx.once) marked longer ago than this many seconds are deleted;
    # None: kept for ever. A key forgotten lets a later job with it do the effect
    # again, so it must outlive the jobs (keep_finished).
    keep_effects: float | None = None

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
        }
        for name, value in positive.items():
            if value <= 0:
                raise ConfigError(f"{name} must be positive")
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
