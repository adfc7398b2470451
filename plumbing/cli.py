"""What the relay and consumer command lines share: connection and broker flags,
logging, signals, and the event loop."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import click

from plumbing.config import ConfigError
from plumbing.logfmt import setup_logging
from schema.topology import QueueType, Topology

F = Callable[..., Any]


def connection_options(fn: F) -> F:
    """--database-url, --amqp-url, --amqp-prefix, --queue-type, --log-level."""
    options = [
        click.option(
            "--database-url",
            metavar="URL",
            help="PostgreSQL URL. Default: $DATABASE_URL, or the file named by "
            "$DATABASE_URL_FILE, or postgresql://127.0.0.1:5432/jobs.",
        ),
        click.option(
            "--amqp-url",
            metavar="URL",
            help="RabbitMQ URL. Default: $AMQP_URL, or the file named by $AMQP_URL_FILE, "
            "or amqp://127.0.0.1:5672/.",
        ),
        click.option(
            "--amqp-prefix",
            envvar="AMQP_PREFIX",
            default="jobs",
            show_default=True,
            show_envvar=True,
            help="Name of the exchange, and prefix of every queue (<prefix>.<queue>).",
        ),
        click.option(
            "--queue-type",
            envvar="AMQP_QUEUE_TYPE",
            type=click.Choice([t.value for t in QueueType]),
            default=QueueType.CLASSIC.value,
            show_default=True,
            show_envvar=True,
            help="RabbitMQ queue type for new queues.",
        ),
        click.option(
            "--log-level",
            envvar="LOG_LEVEL",
            default="INFO",
            show_default=True,
            show_envvar=True,
            type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def topology(prefix: str, queue_type: str) -> Topology:
    if not prefix or len(prefix) > 100:
        raise ConfigError("AMQP_PREFIX must be 1-100 characters")
    return Topology(prefix=prefix, queue_type=QueueType(queue_type))


def run_daemon(
    name: str,
    log_level: str,
    build: Callable[[], Callable[[asyncio.Event], Coroutine[Any, Any, None]]],
) -> None:
    """Build settings (exiting with one line on a ConfigError), then run until SIGTERM/SIGINT.

    ``build`` returns the daemon's ``run(stop)``; the first signal sets ``stop`` for a
    graceful stop, a second one cancels everything at once.
    """
    setup_logging(log_level)
    try:
        run = build()
    except ConfigError as exc:
        click.echo(f"{name}: {exc}", err=True)
        sys.exit(2)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()

        def on_signal(signum: int) -> None:
            if stop.is_set() and task is not None:
                task.cancel()
            logging.getLogger(name).info(
                f"{name}.signal", extra={"signal": signal.Signals(signum).name}
            )
            stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        await run(stop)

    try:
        event_loop_runner()(main())
    except ConfigError as exc:
        click.echo(f"{name}: {exc}", err=True)
        sys.exit(2)
    except asyncio.CancelledError:
        sys.exit(1)


def event_loop_runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is not built for every platform
        return asyncio.run
    return uvloop.run
