"""``relay``: publish the outbox to RabbitMQ."""

from __future__ import annotations

from typing import Any

import click

from plumbing.cli import Daemon, connection_options, default_of, run_daemon, topology
from plumbing.config import amqp_url, database_url
from relay.service import Relay
from relay.settings import HEARTBEAT_INTERVAL_MAX, RelaySettings


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@connection_options
@click.option(
    "--poll-interval",
    type=float,
    default=default_of(RelaySettings, "poll_interval"),
    show_default=True,
    help="Seconds between outbox polls when no NOTIFY arrives.",
)
@click.option(
    "--batch-size",
    type=int,
    default=default_of(RelaySettings, "batch_size"),
    show_default=True,
    help="Wake-ups claimed and published per transaction.",
)
@click.option(
    "--publishers",
    type=int,
    default=default_of(RelaySettings, "publishers"),
    show_default=True,
    help="Batches in flight at once.",
)
@click.option(
    "--publish-timeout",
    type=float,
    default=default_of(RelaySettings, "publish_timeout"),
    show_default=True,
    help="Seconds to wait for a batch's confirms before rolling it back.",
)
@click.option(
    "--queue-backoff-cap",
    type=float,
    default=default_of(RelaySettings, "queue_backoff_cap"),
    show_default=True,
    help="A queue whose own publishes fail (RabbitMQ refuses them, its decision times out) "
    f"is retried after {default_of(RelaySettings, 'queue_backoff')} s, doubling up to this "
    "many seconds; the other queues carry on.",
)
@click.option(
    "--window",
    type=int,
    default=default_of(RelaySettings, "window", none=0),
    show_default=True,
    help="Wake-ups in flight per queue; the backlog beyond waits in the tables, ordered by "
    "priority and fair share. 0: twice the concurrency of the queue's live consumers, at "
    "least --min-window.",
)
@click.option(
    "--min-window",
    type=int,
    default=default_of(RelaySettings, "min_window"),
    show_default=True,
    help="The smallest automatic window.",
)
@click.option(
    "--pack",
    type=int,
    default=default_of(RelaySettings, "pack"),
    show_default=True,
    help="Job ids per message when a batch holds several for one queue.",
)
@click.option(
    "--sweep-interval",
    type=float,
    default=default_of(RelaySettings, "sweep_interval"),
    show_default=True,
    help="Seconds between sweeps for expired leases.",
)
@click.option(
    "--worker-ttl",
    type=float,
    default=default_of(RelaySettings, "worker_ttl"),
    show_default=True,
    help="A consumer not heard from for this many seconds is forgotten.",
)
@click.option(
    "--rewake-interval",
    type=float,
    default=default_of(RelaySettings, "rewake_interval"),
    show_default=True,
    help="A due job whose wake-up was lost is woken again within about this long.",
)
@click.option(
    "--heartbeat-interval",
    type=float,
    default=default_of(RelaySettings, "heartbeat_interval"),
    show_default=True,
    help="Seconds between refreshes of this relay's row in `relays` (live, connected, "
    f"failing queues); at most {HEARTBEAT_INTERVAL_MAX:g}.",
)
@click.option(
    "--schedule-interval",
    type=float,
    default=default_of(RelaySettings, "schedule_interval"),
    show_default=True,
    help="Seconds between looks for due occurrences of recurring schedules.",
)
@click.option(
    "--keep-finished",
    type=float,
    default=default_of(RelaySettings, "keep_finished"),
    show_default=True,
    help="Seconds a finished job is kept (with its attempts, and its dedup key taken) "
    "before retention deletes it.",
)
@click.option(
    "--keep-effects",
    type=float,
    default=default_of(RelaySettings, "keep_effects", none=0.0),
    show_default=True,
    help="Seconds an effect key (tx.once) is remembered, at least --keep-finished. "
    "0: for ever (a key forgotten lets a later job with it do the effect again).",
)
def main(**kwargs: Any) -> None:
    """Publish due wake-ups from the outbox table to RabbitMQ, a window per queue in
    priority and fair-share order; sweep expired leases, send lost wake-ups again,
    keep tenants' slot counts honest. Stops cleanly on SIGTERM or SIGINT."""

    def build() -> Daemon:
        settings = RelaySettings(
            database=database_url(kwargs["database_url"]),
            amqp=amqp_url(kwargs["amqp_url"]),
            topology=topology(kwargs["amqp_prefix"], kwargs["queue_type"]),
            poll_interval=kwargs["poll_interval"],
            batch_size=kwargs["batch_size"],
            publishers=kwargs["publishers"],
            publish_timeout=kwargs["publish_timeout"],
            queue_backoff_cap=kwargs["queue_backoff_cap"],
            window=kwargs["window"] or None,
            min_window=kwargs["min_window"],
            pack=kwargs["pack"],
            sweep_interval=kwargs["sweep_interval"],
            worker_ttl=kwargs["worker_ttl"],
            rewake_interval=kwargs["rewake_interval"],
            heartbeat_interval=kwargs["heartbeat_interval"],
            schedule_interval=kwargs["schedule_interval"],
            keep_finished=kwargs["keep_finished"],
            keep_effects=kwargs["keep_effects"] or None,
        )
        return Daemon(Relay(settings).run, settings.database, settings.amqp)

    run_daemon("relay", kwargs["log_level"], build)
