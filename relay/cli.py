"""``relay``: publish the outbox to RabbitMQ."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import click

from plumbing.cli import connection_options, run_daemon, topology
from plumbing.config import amqp_url, database_url
from relay.service import Relay
from relay.settings import RelaySettings


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@connection_options
@click.option(
    "--poll-interval",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds between outbox polls when no NOTIFY arrives.",
)
@click.option(
    "--batch-size",
    type=int,
    default=500,
    show_default=True,
    help="Wake-ups claimed and published per transaction.",
)
@click.option(
    "--publishers", type=int, default=2, show_default=True, help="Batches in flight at once."
)
@click.option(
    "--publish-timeout",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds to wait for a batch's confirms before rolling it back.",
)
@click.option(
    "--retention",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds a sent wake-up is kept before it is pruned.",
)
@click.option(
    "--sweep-interval",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds between sweeps for expired leases.",
)
@click.option(
    "--rewake-interval",
    type=float,
    default=30.0,
    show_default=True,
    help="A due job whose wake-up was lost is woken again within about this long.",
)
@click.option(
    "--schedule-interval",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds between looks for due occurrences of recurring schedules.",
)
def main(**kwargs: Any) -> None:
    """Publish due wake-ups from the outbox table to RabbitMQ and mark them sent;
    sweep expired leases, wake jobs whose wake-up was lost, prune old wake-ups.
    Stops cleanly on SIGTERM or SIGINT."""

    def build() -> Callable[[asyncio.Event], Coroutine[Any, Any, None]]:
        settings = RelaySettings(
            database=database_url(kwargs["database_url"]),
            amqp=amqp_url(kwargs["amqp_url"]),
            topology=topology(kwargs["amqp_prefix"], kwargs["queue_type"]),
            poll_interval=kwargs["poll_interval"],
            batch_size=kwargs["batch_size"],
            publishers=kwargs["publishers"],
            publish_timeout=kwargs["publish_timeout"],
            retention=kwargs["retention"],
            sweep_interval=kwargs["sweep_interval"],
            rewake_interval=kwargs["rewake_interval"],
            schedule_interval=kwargs["schedule_interval"],
        )
        return Relay(settings).run

    run_daemon("relay", kwargs["log_level"], build)
