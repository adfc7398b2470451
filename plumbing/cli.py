"""What the relay and consumer command lines share: connection and broker flags,
logging, the start-up check of their services, signals, and the event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import typing
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple

import click

from hybrid_jobs import defaults
from hybrid_jobs.plumbing.config import (
    DEFAULT_AMQP_URL,
    DEFAULT_DATABASE_URL,
    DEFAULT_SCHEMA,
    AmqpUrl,
    ConfigError,
    DatabaseUrl,
    instance_schema,
    password_in_flag,
)
from hybrid_jobs.plumbing.logfmt import setup_logging
from hybrid_jobs.plumbing.stopping import CLOSE_SECONDS, Stopper

if TYPE_CHECKING:
    from hybrid_jobs.schema.topology import Topology

# jobctl's commands use this module too (its event loop), and need neither the broker's
# topology nor the start-up check, which bring RabbitMQ's client (aio-pika) and
# tenacity: the functions of the daemons import those themselves.

F = Callable[..., Any]
T = typing.TypeVar("T")


class Daemon(NamedTuple):
    """What a daemon's ``build`` returns: its main coroutine, and the services it
    needs, which ``run_daemon`` checks before starting it (``plumbing.preflight``).

    The URLs come back from ``build`` rather than being parsed again by
    ``run_daemon``: ``build`` validates every setting once, and reports the first
    that is wrong.
    """

    run: Callable[[asyncio.Event], Coroutine[Any, Any, None]]
    database: DatabaseUrl
    amqp: AmqpUrl | None  # None: the daemon does not use RabbitMQ


def default_of(settings: type[Any], name: str, *, none: Any = None) -> Any:
    """The default of field ``name`` of a settings dataclass, for the flag that sets
    it: each default is written once, on the settings, and the flag (its help's
    ``[default: ...]`` included) reads it from there. ``none``: what the flag says
    for a field whose default is None (0 for "none" or "automatic")."""
    for f in dataclasses.fields(settings):
        if f.name == name:
            if f.default is dataclasses.MISSING:
                raise TypeError(f"{settings.__name__}.{name} has no plain default")
            return none if f.default is None else f.default
    raise TypeError(f"{settings.__name__} has no field {name!r}")


# (settings class, field) -> the flag's value that stands for None, of every field
# a setting_option declared: settings_from turns the flags back into the field.
_FLAGS: dict[tuple[type[Any], str], Any] = {}


def setting_option(
    settings: type[Any], name: str, help: str, *, none: Any = None, **extra: Any
) -> Callable[[F], F]:
    """The flag ``--<name>`` that sets field ``name`` of a settings dataclass: its
    type and its shown default read from the field (see :func:`default_of`), so a
    daemon's flag and its setting cannot disagree. ``none``: the flag's value that
    means None (0 for "none" or "automatic")."""
    default = default_of(settings, name, none=none)
    # the field's own type (int or float), not its default's: 5 may default a float
    hint = typing.get_type_hints(settings)[name]
    kind = next(t for t in (*typing.get_args(hint), hint) if t in (int, float, str))
    _FLAGS[(settings, name)] = none
    return click.option(
        "--" + name.replace("_", "-"),
        type=kind,
        default=default,
        show_default=True,
        help=help,
        **extra,
    )


def settings_from(settings: type[T], flags: dict[str, Any], **given: Any) -> T:
    """``settings`` built from a daemon's flags: each field a :func:`setting_option`
    declared takes its flag's value (None for the flag's ``none``), the rest come
    from ``given``."""
    values = dict(given)
    for field in dataclasses.fields(settings):  # type: ignore[arg-type]
        if (settings, field.name) in _FLAGS and field.name not in given:
            none = _FLAGS[(settings, field.name)]
            value = flags[field.name]
            values[field.name] = None if none is not None and value == none else value
    return settings(**values)


def connection_options(fn: F) -> F:
    """--database-url, --amqp-url, --amqp-prefix, --queue-type, --log-level."""
    from hybrid_jobs.schema.topology import QueueType, Topology

    options = [
        click.option(
            "--database-url",
            metavar="URL",
            help="PostgreSQL URL. Default: $DATABASE_URL, or the file named by "
            f"$DATABASE_URL_FILE, or {DEFAULT_DATABASE_URL}.",
        ),
        click.option(
            "--amqp-url",
            metavar="URL",
            help="RabbitMQ URL. Default: $AMQP_URL, or the file named by $AMQP_URL_FILE, "
            f"or {DEFAULT_AMQP_URL}.",
        ),
        click.option(
            "--amqp-prefix",
            envvar="AMQP_PREFIX",
            default=default_of(Topology, "prefix"),
            show_default=True,
            show_envvar=True,
            help="Name of the exchange, and prefix of every queue (<prefix>.<queue>).",
        ),
        click.option(
            "--queue-type",
            envvar="AMQP_QUEUE_TYPE",
            type=click.Choice([t.value for t in QueueType]),
            default=default_of(Topology, "queue_type").value,
            show_default=True,
            show_envvar=True,
            help="RabbitMQ queue type for new queues.",
        ),
        click.option(
            "--log-level",
            envvar="LOG_LEVEL",
            default=defaults.LOG_LEVEL,
            show_default=True,
            show_envvar=True,
            type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def topology(prefix: str, queue_type: str) -> Topology:
    """The broker's names. Left to its default, the prefix of an instance in a
    schema of its own (HYBRID_JOBS_SCHEMA, other than hybrid_jobs and public) is the
    schema's name, so that two instances on one broker share no queue."""
    from hybrid_jobs.schema.topology import QueueType, Topology

    context = click.get_current_context(silent=True)
    if (
        context is not None
        and context.get_parameter_source("amqp_prefix") is click.core.ParameterSource.DEFAULT
    ):
        schema, _ = instance_schema()
        if schema not in (DEFAULT_SCHEMA, "public"):
            prefix = schema
    if not prefix or len(prefix) > 100:
        raise ConfigError("AMQP_PREFIX must be 1-100 characters")
    return Topology(prefix=prefix, queue_type=QueueType(queue_type))


def run_daemon(name: str, log_level: str, build: Callable[[], Daemon]) -> None:
    """Build settings, check the services, then run until SIGTERM/SIGINT.

    A ConfigError, from ``build`` or from the start-up check (a refused login, a
    missing database, an unmigrated schema), ends the process with one line naming
    the setting, and exit status 2. While a service is merely down, the check waits
    for it. The first signal sets ``stop`` for a graceful stop (also while waiting);
    a second one cancels everything at once, and the process exits within seconds
    whatever still runs (``plumbing.stopping``).
    """
    from hybrid_jobs.plumbing.preflight import preflight

    log = logging.getLogger(name)
    stopper = Stopper(name, log)
    stopper.catch_early()
    setup_logging(log_level)
    try:
        daemon = build()
    except ConfigError as exc:
        click.echo(f"{name}: {exc}", err=True)
        sys.exit(2)
    warn_about_passwords_in_flags(log, daemon.database, daemon.amqp)

    async def main() -> None:
        stop = asyncio.Event()
        stopper.install(stop)
        try:
            if not await preflight(daemon.database, daemon.amqp, name=name, stop=stop):
                log.info(f"{name}.stopped", extra={"before_start": True})
                return
            await daemon.run(stop)
        finally:
            # Closing the loop cancels what is left; a task that ignores it must
            # not keep the process alive.
            stopper.uninstall()
            stopper.arm(CLOSE_SECONDS, "the event loop did not close")

    code = 0
    try:
        event_loop_runner()(main())
    except ConfigError as exc:
        click.echo(f"{name}: {exc}", err=True)
        code = 2
    except asyncio.CancelledError:
        code = 1
    finally:
        stopper.disarm()
    stopper.leave(code)


def warn_about_passwords_in_flags(
    log: logging.Logger, database: DatabaseUrl, amqp: AmqpUrl | None
) -> None:
    urls: list[DatabaseUrl | AmqpUrl] = [database, *([amqp] if amqp else [])]
    for url in urls:
        warning = password_in_flag(url)
        if warning:
            log.warning(
                f"{log.name}.password_on_command_line",
                extra={"flag": url.setting, "detail": warning},
            )


def event_loop_runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is not built for every platform
        return asyncio.run
    return uvloop.run
