"""``jobctl serve``: the HTTP API (/v1), the dashboard (/), /metrics, /healthz and
/readyz."""

from __future__ import annotations

import contextlib
import errno
import logging
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import click
import uvicorn

from hybrid_jobs import defaults
from hybrid_jobs.jobctl.api.settings import ApiSettings, PublicUrl, is_loopback
from hybrid_jobs.jobctl.api.tokens import token_from_environment
from hybrid_jobs.jobctl.metrics import CollectorSettings
from hybrid_jobs.plumbing.cli import (
    connection_options,
    default_of,
    event_loop_runner,
    warn_about_passwords_in_flags,
)
from hybrid_jobs.plumbing.config import ConfigError, amqp_url, database_url
from hybrid_jobs.plumbing.logfmt import setup_logging

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


def _fail(message: str) -> None:
    click.echo(f"jobctl serve: {message}", err=True)
    sys.exit(2)


def _hosts(values: tuple[str, ...]) -> tuple[str, ...]:
    # Repeated flags, or one comma- or space-separated environment variable.
    return tuple(h for value in values for h in value.replace(",", " ").split() if h)


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound here (as uvicorn would: SO_REUSEADDR, IPv6 for an
    address with a colon) so that a port in use, or an address this machine does not
    have, is one line naming the flag, not uvicorn's log and exit."""
    sock = socket.socket(family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        sock.bind((host, port))
    except socket.gaierror:
        sock.close()
        _fail(f"--host {host}: no such host name")
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            _fail(f"--port {port}: {where} is in use by another process; choose another --port")
        if exc.errno == errno.EADDRNOTAVAIL:
            _fail(f"--host {host}: this machine has no such address")
        if exc.errno == errno.EACCES:
            _fail(f"--port {port}: not allowed to listen on {where} (ports below 1024 need root)")
        _fail(f"cannot listen on {where}: {exc.strerror or exc}")
    sock.set_inheritable(True)
    return sock


@click.command()
@connection_options
@click.option(
    "--host",
    default=default_of(ApiSettings, "bind_host"),
    show_default=True,
    envvar="JOBCTL_HOST",
    show_envvar=True,
    help="Address to listen on (0.0.0.0: every interface; needs a token, or --allow-open-reads).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=defaults.SERVE_PORT,
    show_default=True,
    envvar="JOBCTL_PORT",
    show_envvar=True,
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="HOST",
    envvar="JOBCTL_ALLOWED_HOSTS",
    show_envvar=True,
    help="A host name (or address) requests may name in their Host header, besides "
    "localhost, 127.0.0.1, ::1, the --host address and --public-url's host. Repeat it, "
    "or give several separated by commas. '.example.com' allows a domain and its "
    "subdomains; '*' allows any (no DNS-rebinding protection).",
)
@click.option(
    "--public-url",
    metavar="URL",
    envvar="JOBCTL_PUBLIC_URL",
    show_envvar=True,
    help="Where people reach the server, e.g. https://jobs.example.com/ops behind a "
    "proxy: its origin is the one the dashboard's buttons must come from, https makes "
    "cookies Secure and adds HSTS, and its path is the mount point the proxy strips. "
    "Behind a proxy, set --forwarded-allow-ips too.",
)
@click.option(
    "--forwarded-allow-ips",
    metavar="IPS",
    envvar="JOBCTL_FORWARDED_ALLOW_IPS",
    show_envvar=True,
    default=default_of(ApiSettings, "forwarded_allow_ips"),
    show_default="none",
    help="The reverse proxies in front of the server (comma-separated addresses or "
    "networks, e.g. 127.0.0.1 or 10.0.0.0/8; '*': any peer): only from them is "
    "X-Forwarded-For believed (a well-formed address, the client's: what the "
    "wrong-token limit counts and the records of who acted keep), and "
    "X-Forwarded-Proto. Without it every client is its connection's address, so "
    "behind a proxy all clients share the proxy's: a deployment behind one sets this "
    "and --public-url.",
)
@click.option(
    "--allow-open-reads",
    is_flag=True,
    envvar="JOBCTL_ALLOW_OPEN_READS",
    show_envvar=True,
    help="Listen on a non-loopback --host without a token: every job's payload, "
    "result and error is then readable by anyone who reaches the port.",
)
@click.option(
    "--open-metrics",
    is_flag=True,
    envvar="JOBCTL_OPEN_METRICS",
    show_envvar=True,
    help="Serve /metrics without the token even when one is set (for a network that "
    "only Prometheus reaches).",
)
@click.option(
    "--metrics-max-queues",
    type=click.IntRange(1, 100_000),
    default=default_of(CollectorSettings, "max_queues"),
    show_default=True,
    envvar="JOBCTL_METRICS_MAX_QUEUES",
    show_envvar=True,
    help='Queues with series of their own in /metrics; more share queue="_other".',
)
@click.option(
    "--metrics-max-job-types",
    type=click.IntRange(1, 100_000),
    default=default_of(CollectorSettings, "max_job_types"),
    show_default=True,
    envvar="JOBCTL_METRICS_MAX_JOB_TYPES",
    show_envvar=True,
    help='Job types with series of their own in /metrics; more share job_type="_other".',
)
@click.option(
    "--max-waiters",
    type=click.IntRange(1, 100_000),
    default=default_of(ApiSettings, "max_waiters"),
    show_default=True,
    envvar="JOBCTL_MAX_WAITERS",
    show_envvar=True,
    help="GET /v1/jobs/{id}?wait= requests held at once; one more is answered 503 with "
    "Retry-After.",
)
@click.option(
    "--max-waiters-per-client",
    type=click.IntRange(1, 100_000),
    default=default_of(ApiSettings, "max_waiters_per_client"),
    show_default=True,
    envvar="JOBCTL_MAX_WAITERS_PER_CLIENT",
    show_envvar=True,
    help="Of those, the most one client (address) may hold; one more is answered 429.",
)
def serve(
    host: str,
    port: int,
    allowed_hosts: tuple[str, ...],
    public_url: str | None,
    forwarded_allow_ips: str,
    allow_open_reads: bool,
    open_metrics: bool,
    metrics_max_queues: int,
    metrics_max_job_types: int,
    max_waiters: int,
    max_waiters_per_client: int,
    **kwargs: Any,
) -> None:
    """Serve the HTTP API (/v1, its OpenAPI document at /openapi.json), the
    dashboard (/), Prometheus metrics (/metrics), /healthz and /readyz, until
    SIGTERM or SIGINT.

    With a token ($JOBCTL_API_TOKEN, or the file named by $JOBCTL_API_TOKEN_FILE,
    read again when it changes) every request but the probes needs it. Without one
    the server is read-only and its reads are open, which it says when it starts;
    it then listens on a loopback address only, unless --allow-open-reads. Logs are
    JSON lines on stderr, one per request.
    """
    setup_logging(kwargs["log_level"])
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).addFilter(_plain)
    try:
        tokens = token_from_environment()
        settings = ApiSettings(
            database=database_url(kwargs["database_url"]),
            amqp=amqp_url(kwargs["amqp_url"]),
            token=tokens,
            bind_host=host,
            allowed_hosts=_hosts(allowed_hosts),
            public_url=None if not public_url else PublicUrl.parse(public_url),
            open_metrics=open_metrics,
            forwarded_allow_ips=forwarded_allow_ips,
            max_waiters=max_waiters,
            max_waiters_per_client=max_waiters_per_client,
            collector=CollectorSettings(
                max_queues=metrics_max_queues, max_job_types=metrics_max_job_types
            ),
        )
    except ConfigError as exc:
        _fail(str(exc))
        return
    if tokens is None and not is_loopback(host) and not allow_open_reads:
        _fail(
            f"--host {host} is reachable from other machines and there is no API token, so"
            " anyone who reaches the port could read every job's payload, result and error:"
            " set JOBCTL_API_TOKEN (or JOBCTL_API_TOKEN_FILE), or pass --allow-open-reads"
        )
    warn_about_passwords_in_flags(log, settings.database, settings.amqp)
    # Loaded only now that the settings hold: a refusal above costs no web framework.
    from hybrid_jobs.jobctl.api.app import create_app

    config = uvicorn.Config(
        create_app(settings),
        host=host,
        port=port,
        root_path=settings.root_path,
        # Ours instead (jobctl.api.proxies): trusted proxies only, none by default,
        # and a well-formed address only.
        proxy_headers=False,
        # Our logging (JSON lines) and our access log, which never shows a header.
        log_config=None,
        access_log=False,
        server_header=False,
        lifespan="on",
    )
    listening = _bind(host, port)
    server = _Server(config)
    if tokens is None:
        reads = "open: anyone who reaches the port can read every job (no token)"
    else:
        reads = "need the token"
    log.info(
        "api.serving",
        extra={
            "address": f"http://{host}:{port}",
            "public_url": public_url or None,
            "database": settings.database.redacted(),
            "amqp": settings.amqp.redacted(),
            "token": "none (read-only)"
            if tokens is None
            else ("from a file, read again when it changes" if tokens.path else "configured"),
            "reads": reads,
            "metrics": "open" if open_metrics or tokens is None else "need the token",
            "allowed_hosts": "any"
            if settings.served_hosts() is None
            else sorted(settings.served_hosts() or ()),
            "forwarded_allow_ips": settings.trusted_proxies.describe(),
        },
    )
    if public_url and not settings.trusted_proxies:
        log.warning(
            "api.no_trusted_proxy",
            extra={
                "detail": "--public-url is set but no proxy is trusted (--forwarded-allow-ips):"
                " X-Forwarded-For is ignored, so every client behind a proxy is the proxy's"
                " address, and one client's wrong tokens refuse them all"
            },
        )
    event_loop_runner()(server.serve(sockets=[listening]))
    if not server.started:
        # Start-up failed (the lifespan): uvicorn logged why.
        sys.exit(1)
