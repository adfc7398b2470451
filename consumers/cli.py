"""``consumer --app MODULE``: run the handlers MODULE registers."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

import click

from hybrid_jobs.consumers.recycle import RecycleLimits, parse_size, recycle_when_due
from hybrid_jobs.consumers.registry import default_registry
from hybrid_jobs.consumers.settings import ConsumerSettings
from hybrid_jobs.consumers.supervisor import Supervisor, SupervisorLink
from hybrid_jobs.consumers.worker import Consumer
from hybrid_jobs.plumbing.cli import (
    Daemon,
    connection_options,
    run_daemon,
    setting_option,
    settings_from,
    topology,
)
from hybrid_jobs.plumbing.config import ConfigError, amqp_url, database_url
from hybrid_jobs.plumbing.logfmt import describe_error
from hybrid_jobs.schema import names


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
@click.option(
    "--tenant",
    "tenants",
    multiple=True,
    default=(),
    metavar="NAME",
    help="A dedicated tenant (set_tenant_limit(..., runners='dedicated')) this consumer may "
    "serve (repeatable). Only consumers naming such a tenant take its jobs; every consumer, "
    "these too, takes the jobs of shared tenants.",
)
@click.option(
    "--queue-limit",
    "queue_limits",
    multiple=True,
    default=(),
    metavar="QUEUE=N",
    help="At most N jobs of QUEUE hold a lease at once, across every consumer (repeatable). "
    "Recorded when this consumer starts; the last to start wins, and a consumer naming none "
    "leaves the recorded limit as it is (jobctl limits shows and removes it).",
)
@setting_option(ConsumerSettings, "concurrency", "Jobs run at once.")
@setting_option(
    ConsumerSettings,
    "prefetch",
    "Job ids held beyond the free slots, waiting for one (0: as many as --concurrency, twice "
    "that while the jobs prove short, back as soon as a run reaches 50 ms). A consumer holds "
    "at most concurrency + prefetch ids; ids beyond that are handed back at once, for other "
    "consumers. RabbitMQ pushes at most two messages ahead.",
)
@setting_option(
    ConsumerSettings, "lease_seconds", "Lease length; a crashed worker's jobs run again after it."
)
@setting_option(
    ConsumerSettings, "heartbeat_seconds", "Heartbeat interval. 0 means a third of the lease."
)
@setting_option(
    ConsumerSettings,
    "default_timeout",
    "Time limit of an attempt whose handler sets no timeout; 0 for none. A quarter "
    "of an hour: longer than work that belongs in a job usually takes, short enough that "
    "a hung handler is retried within the hour instead of holding its lease for ever.",
    none=0.0,
)
@setting_option(
    ConsumerSettings,
    "drain_seconds",
    "On SIGTERM, time for running jobs to finish before the claims of async handlers go "
    "back (QUEUED, attempt refunded). A plain-function handler cannot be stopped: the stop waits "
    "for it, up to its time limit, keeping its lease. A second signal stops at once.",
)
@setting_option(
    ConsumerSettings,
    "force_cancel_grace",
    "With --processes: seconds a plain-function handler whose job was cancelled with force "
    "may take to return before its worker process is replaced. Its lease ends CANCELLED; "
    "async handlers are interrupted at once, whatever this says.",
)
@click.option(
    "--processes",
    type=int,
    default=1,
    show_default=True,
    help="Worker processes, each with --concurrency slots, under one supervisor that "
    "restarts any that crashes (plain-function handlers then use every core).",
)
@click.option(
    "--max-jobs-per-process",
    type=int,
    metavar="N",
    help="Replace a worker process after it has started about N jobs: it finishes what "
    "it holds, exits, and a fresh one takes its place.",
)
@click.option(
    "--max-memory-per-process",
    metavar="SIZE",
    help="Replace a worker process once its resident memory passes SIZE after a job "
    "(512MiB, 2GiB; a bare number is MiB), the same way.",
)
@connection_options
def main(**kwargs: Any) -> None:
    """Consume wake-ups from RabbitMQ, claim the jobs they name in PostgreSQL, run
    their handlers, record the outcomes. Stops cleanly on SIGTERM or SIGINT."""
    link = SupervisorLink.from_environment()
    if link is not None:
        link.tag_log_lines()

    def build() -> Daemon:
        limits = recycle_limits(kwargs)
        settings = build_settings()
        if link is None and (kwargs["processes"] > 1 or limits):
            # The supervisor checks every setting (and the services) once, then
            # starts workers that run this same command line.
            supervisor = Supervisor(kwargs["processes"], sys.argv[1:])
            return Daemon(supervisor.run, settings.database, settings.amqp)
        consumer = Consumer(settings, default_registry)
        if link is None:
            return Daemon(consumer.run, settings.database, settings.amqp)
        return Daemon(supervised(consumer, link, limits), settings.database, settings.amqp)

    def build_settings() -> ConsumerSettings:
        load_app(kwargs["app"])
        try:
            queues = tuple(names.queue(q) for q in kwargs["queues"]) or tuple(
                default_registry.queues()
            )
        except ValueError as exc:
            raise ConfigError(f"--queue: {exc}") from None
        try:
            tenants = tuple(dict.fromkeys(names.tenant(t) for t in kwargs["tenants"]))
        except ValueError as exc:
            raise ConfigError(f"--tenant: {exc}") from None
        queue_limits = parse_queue_limits(kwargs["queue_limits"])
        if not len(default_registry):
            raise ConfigError(f"--app {kwargs['app']} registered no handlers")
        return settings_from(
            ConsumerSettings,
            kwargs,
            database=database_url(kwargs["database_url"]),
            amqp=amqp_url(kwargs["amqp_url"]),
            topology=topology(kwargs["amqp_prefix"], kwargs["queue_type"]),
            queues=queues,
            tenants=tenants,
            queue_limits=queue_limits,
        )

    run_daemon("consumer", kwargs["log_level"], build)


def parse_queue_limits(given: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """``--queue-limit QUEUE=N`` options as (queue, N) pairs."""
    found: list[tuple[str, int]] = []
    for item in given:
        queue, sep, number = item.rpartition("=")
        try:
            if not sep:
                raise ValueError("expected QUEUE=N")
            found.append((names.queue(queue), int(number)))
        except ValueError as exc:
            raise ConfigError(f"--queue-limit {item}: {exc}") from None
    return tuple(found)


def recycle_limits(kwargs: dict[str, Any]) -> RecycleLimits:
    if kwargs["processes"] < 1:
        raise ConfigError("--processes must be at least 1")
    max_jobs = kwargs["max_jobs_per_process"]
    if max_jobs is not None and max_jobs < 1:
        raise ConfigError("--max-jobs-per-process must be at least 1")
    memory = kwargs["max_memory_per_process"]
    try:
        max_memory = parse_size(memory) if memory is not None else None
    except ValueError as exc:
        raise ConfigError(f"--max-memory-per-process: {exc}") from None
    return RecycleLimits(max_jobs, max_memory)


def supervised(
    consumer: Consumer, link: SupervisorLink, limits: RecycleLimits
) -> Callable[[asyncio.Event], Coroutine[Any, Any, None]]:
    """A worker under ``consumer --processes``: stops when its supervisor goes,
    recycles itself at its limits, and has itself replaced at once when a plain
    function ignores a forced cancel (consumers/forced_cancel.py)."""

    async def run(stop: asyncio.Event) -> None:
        link.stop_when_asked(stop)
        work = asyncio.create_task(consumer.run(stop), name="consumer")
        replaced = False

        def replace_process() -> None:
            nonlocal replaced
            replaced = True
            consumer.stop_now_why = (
                "a plain function ignored a forced cancel: replacing the process"
            )
            link.announce_recycling()
            work.cancel()  # the consumer's "stop now", as a second signal

        consumer.forced.replace_process = replace_process
        watcher = None
        if limits:
            watcher = asyncio.create_task(
                recycle_when_due(
                    limits,
                    lambda: consumer.claimer.counts["claimed"],
                    stop,
                    link.announce_recycling,
                    consumer.worker,
                ),
                name="recycler",
            )
        try:
            await work
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not replaced or (task is not None and task.cancelling()):
                raise
            # stopped for its replacement, which the supervisor has started: a clean exit
        finally:
            if watcher is not None:
                watcher.cancel()

    return run
