"""``relay``: publish the outbox to RabbitMQ."""

from __future__ import annotations

from typing import Any

import click

from hybrid_jobs.plumbing.cli import (
    Daemon,
    connection_options,
    default_of,
    run_daemon,
    setting_option,
    settings_from,
    topology,
)
from hybrid_jobs.plumbing.config import amqp_url, database_url, webhook_secret
from hybrid_jobs.relay.service import Relay
from hybrid_jobs.relay.settings import HEARTBEAT_INTERVAL_MAX, RelaySettings


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@connection_options
@setting_option(
    RelaySettings, "poll_interval", "Seconds between outbox polls when no NOTIFY arrives."
)
@setting_option(RelaySettings, "batch_size", "Wake-ups claimed and published per transaction.")
@setting_option(RelaySettings, "publishers", "Batches in flight at once.")
@setting_option(
    RelaySettings,
    "publish_timeout",
    "Seconds to wait for a batch's confirms before rolling it back.",
)
@setting_option(
    RelaySettings,
    "queue_backoff_cap",
    "A queue whose own publishes fail (RabbitMQ refuses them, its decision times out) "
    f"is retried after {default_of(RelaySettings, 'queue_backoff')} s, doubling up to this "
    "many seconds; the other queues carry on.",
)
@setting_option(
    RelaySettings,
    "window",
    "Wake-ups in flight per queue; the backlog beyond waits in the tables, ordered by "
    "priority and fair share. 0: twice the concurrency of the queue's live consumers, at "
    "least --min-window, plus twice what they take during one decision.",
    none=0,
)
@setting_option(RelaySettings, "min_window", "The smallest automatic window.")
@setting_option(
    RelaySettings, "pack", "Job ids per message when a batch holds several for one queue."
)
@setting_option(RelaySettings, "sweep_interval", "Seconds between sweeps for expired leases.")
@setting_option(
    RelaySettings, "worker_ttl", "A consumer not heard from for this many seconds is forgotten."
)
@setting_option(
    RelaySettings,
    "rewake_interval",
    "A due job whose wake-up was lost is woken again within about this long.",
)
@setting_option(
    RelaySettings,
    "heartbeat_interval",
    "Seconds between refreshes of this relay's row in `relays` (live, connected, "
    f"failing queues); at most {HEARTBEAT_INTERVAL_MAX:g}.",
)
@setting_option(
    RelaySettings,
    "schedule_interval",
    "Seconds between looks for due occurrences of recurring schedules.",
)
@setting_option(
    RelaySettings,
    "keep_finished",
    "Seconds a finished job is kept (with its attempts, and its dedup key taken) "
    "before retention deletes it.",
)
@setting_option(
    RelaySettings,
    "keep_effects",
    "Seconds an effect key (tx.once) is remembered, at least --keep-finished. "
    "0: for ever (a key forgotten lets a later job with it do the effect again).",
    none=0.0,
)
@setting_option(
    RelaySettings,
    "webhook_timeout",
    "Seconds one webhook call may take before it counts as failed.",
)
@setting_option(
    RelaySettings,
    "webhook_concurrency",
    "Webhook calls in flight at once (at most --webhook-per-endpoint to one endpoint).",
)
@setting_option(
    RelaySettings,
    "webhook_per_endpoint",
    "Webhook calls in flight at once to one endpoint (scheme, host and port).",
)
@setting_option(
    RelaySettings,
    "webhook_max_attempts",
    "Calls made for one job's end before giving up on it (GAVE_UP). The calls are "
    "signed with $WEBHOOK_SECRET (or the file named by $WEBHOOK_SECRET_FILE); "
    "without it the relay makes none.",
)
@setting_option(
    RelaySettings,
    "webhook_allow_hosts",
    "Hosts and networks (CIDR) webhook calls may go to though they are not public "
    "addresses, comma-separated; by default, calls go to public addresses only.",
)
def main(**kwargs: Any) -> None:
    """Publish due wake-ups from the outbox table to RabbitMQ, a window per queue in
    priority and fair-share order; sweep expired leases, send lost wake-ups again,
    keep tenants' slot counts honest. Stops cleanly on SIGTERM or SIGINT."""

    def build() -> Daemon:
        settings = settings_from(
            RelaySettings,
            kwargs,
            database=database_url(kwargs["database_url"]),
            amqp=amqp_url(kwargs["amqp_url"]),
            topology=topology(kwargs["amqp_prefix"], kwargs["queue_type"]),
            webhook_secret=webhook_secret(),
        )
        return Daemon(Relay(settings).run, settings.database, settings.amqp)

    run_daemon("relay", kwargs["log_level"], build)
