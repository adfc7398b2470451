"""``consumer --app MODULE``: run the handlers MODULE registers."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any

import click

from consumers.registry import default_registry
from consumers.settings import ConsumerSettings
from consumers.worker import Consumer
from plumbing.cli import Daemon, connection_options, run_daemon, topology
from plumbing.config import ConfigError, amqp_url, database_url
from plumbing.logfmt import describe_error
from schema import names


def load_app(module: str) -> None:
    # Like `celery -A`: the module is found relative to the working directory.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        importlib.import_module(module)
    except ImportError as exc:
        if exc.name is None or module == exc.name or module.startswith(f"{exc.name}."):
            raise ConfigError(f"--app {module}: cannot import it ({exc})") from None
        # The module is there; something it imports is not.
        raise ConfigError(f"--app {module}: importing it failed: {_where(exc)}") from None
    except Exception as exc:  # a code error in the module: say where, in one line
        raise ConfigError(f"--app {module}: importing it failed: {_where(exc)}") from None


def _where(exc: Exception) -> str:
    """The error and the place in the user's code it came from."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{type(exc).__name__}: {exc.msg} ({exc.filename}, line {exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    place = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    return f"{describe_error(exc)}{place}"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--app",
    "app",
    required=True,
    metavar="MODULE",
    help="Module to import; it registers handlers with @consumers.handler.",
)
@click.option(
    "--queue",
    "queues",
    multiple=True,
    metavar="NAME",
    help="Queue to consume (repeatable). Default: the queues of the registered handlers.",
)
@click.option("--concurrency", type=int, default=10, show_default=True, help="Jobs run at once.")
@click.option(
    "--prefetch",
    type=int,
    default=0,
    show_default=True,
    help="Job ids held beyond the free slots, waiting for one (0: as many as --concurrency). "
    "A consumer holds at most concurrency + prefetch ids; ids beyond that are handed back at "
    "once, for other consumers. RabbitMQ pushes at most two messages ahead.",
)
@click.option(
    "--lease-seconds",
    type=float,
    default=60.0,
    show_default=True,
    help="Lease length; a crashed worker's jobs run again after it.",
)
@click.option(
    "--heartbeat-seconds",
    type=float,
    default=0.0,
    show_default=True,
    help="Heartbeat interval. 0 means a third of the lease.",
)
@click.option(
    "--default-timeout",
    type=float,
    default=900.0,
    show_default=True,
    help="Time limit of an attempt whose handler sets no timeout; 0 for none. A quarter "
    "of an hour: longer than work that belongs in a job usually takes, short enough that "
    "a hung handler is retried within the hour instead of holding its lease for ever.",
)
@click.option(
    "--drain-seconds",
    type=float,
    default=30.0,
    show_default=True,
    help="On SIGTERM, time for running jobs to finish before the claims of async handlers go "
    "back (QUEUED, attempt refunded). A plain-function handler cannot be stopped: the stop waits "
    "for it, up to its time limit, keeping its lease. A second signal stops at once.",
)
@connection_options
def main(**kwargs: Any) -> None:
    """Consume wake-ups from RabbitMQ, claim the jobs they name in PostgreSQL, run
    their handlers, record the outcomes. Stops cleanly on SIGTERM or SIGINT."""

    def build() -> Daemon:
        load_app(kwargs["app"])
        try:
            queues = tuple(names.queue(q) for q in kwargs["queues"]) or tuple(
                default_registry.queues()
            )
        except ValueError as exc:
            raise ConfigError(f"--queue: {exc}") from None
        if not len(default_registry):
            raise ConfigError(f"--app {kwargs['app']} registered no handlers")
        settings = ConsumerSettings(
            database=database_url(kwargs["database_url"]),
            amqp=amqp_url(kwargs["amqp_url"]),
            topology=topology(kwargs["amqp_prefix"], kwargs["queue_type"]),
            queues=queues,
            concurrency=kwargs["concurrency"],
            prefetch=kwargs["prefetch"],
            lease_seconds=kwargs["lease_seconds"],
            heartbeat_seconds=kwargs["heartbeat_seconds"],
            drain_seconds=kwargs["drain_seconds"],
            default_timeout=kwargs["default_timeout"] or None,
        )
        return Daemon(Consumer(settings, default_registry).run, settings.database, settings.amqp)

    run_daemon("consumer", kwargs["log_level"], build)
