"""``jobctl serve``: the HTTP API (/v1), /metrics, /healthz and /readyz."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import click
import uvicorn

from jobctl.api import ApiSettings, api_token, create_app
from plumbing.cli import (
    connection_options,
    event_loop_runner,
    warn_about_passwords_in_flags,
)
from plumbing.config import ConfigError, amqp_url, database_url
from plumbing.logfmt import setup_logging

log = logging.getLogger("jobctl")


class _Server(uvicorn.Server):
    """uvicorn's server, stopping as relay and consumer do: the first SIGTERM or
    SIGINT stops it gracefully, a second one at once, and the exit status is 0
    (uvicorn would raise the signal again once stopped, and die of it)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {signum: signal.signal(signum, self._on_signal) for signum in handled}
        try:
            yield
        finally:
            for signum, handler in original.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.info("api.signal", extra={"signal": signal.Signals(signum).name})
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True


def _plain(record: logging.LogRecord) -> bool:
    # uvicorn adds a copy of each message with terminal colours; a JSON line wants one.
    record.__dict__.pop("color_message", None)
    return True


@click.command()
@connection_options
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    envvar="JOBCTL_HOST",
    show_envvar=True,
    help="Address to listen on (0.0.0.0: every interface; set a token first).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    envvar="JOBCTL_PORT",
    show_envvar=True,
)
def serve(host: str, port: int, **kwargs: Any) -> None:
    """Serve the HTTP API (/v1, its OpenAPI document at /openapi.json), Prometheus
    metrics (/metrics), /healthz and /readyz, until SIGTERM or SIGINT.

    Changes need `Authorization: Bearer <token>` with the token from
    $JOBCTL_API_TOKEN (or the file named by $JOBCTL_API_TOKEN_FILE); without one
    the server is read-only, and says so when it starts. Logs are JSON lines on
    stderr, one per request.
    """
    setup_logging(kwargs["log_level"])
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).addFilter(_plain)
    try:
        settings = ApiSettings(
            database=database_url(kwargs["database_url"]),
            amqp=amqp_url(kwargs["amqp_url"]),
            token=api_token(),
        )
    except ConfigError as exc:
        click.echo(f"jobctl serve: {exc}", err=True)
        sys.exit(2)
    warn_about_passwords_in_flags(log, settings.database, settings.amqp)
    config = uvicorn.Config(
        create_app(settings),
        host=host,
        port=port,
        # Our logging (JSON lines) and our access log, which never shows a header.
        log_config=None,
        access_log=False,
        server_header=False,
        lifespan="on",
    )
    server = _Server(config)
    log.info(
        "api.serving",
        extra={
            "address": f"http://{host}:{port}",
            "database": settings.database.redacted(),
            "amqp": settings.amqp.redacted(),
            "token": "configured" if settings.token else "none (read-only)",
        },
    )
    event_loop_runner()(server.serve())
    if not server.started:
        # The port was taken, or start-up failed: uvicorn logged why.
        sys.exit(1)
