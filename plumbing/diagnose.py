"""What a failed connection attempt means: a setting to fix, or a service to wait for.

A daemon starting up must tell the two apart. A refused login, a database or virtual
host that does not exist, a host name that does not resolve: retrying cannot fix
these, and a daemon that retries them forever looks like a daemon waiting for an
outage to end. A refused connection, a timeout, a server still starting up: these end
by themselves, and the daemon should wait for them.

Neither PostgreSQL nor RabbitMQ gives a machine-readable code for most of these at
connect time (libpq reports no SQLSTATE for a failed connection; aiormq 7 loses the
broker's reply to Connection.Open), so the classification reads the error text. What
it does not recognise counts as an outage: a daemon that waits, saying why, is a
smaller harm than one that refuses to start during a real outage, and the waiting
message carries the library's own words.
"""

from __future__ import annotations

import errno
import re
import socket
import ssl
from dataclasses import dataclass

import aiormq.exceptions
import psycopg

from hybrid_jobs.plumbing.amqp import NoNodeAnswered
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.plumbing.logfmt import describe_error


@dataclass(frozen=True)
class Diagnosis:
    """``fatal``: retrying cannot fix it. ``reason`` is safe to print (it never holds
    a password); ``hint`` says what to check, for a waiting message."""

    fatal: bool
    reason: str
    hint: str = ""


# Server messages at connect time that name a setting to fix. Each pattern keeps the
# server's own wording, which names the database, role or user (never a password).
_PG_FATAL = [
    re.compile(r'database "[^"]*" does not exist'),
    re.compile(r'role "[^"]*" does not exist'),
    re.compile(r'password authentication failed for user "[^"]*"'),
    re.compile(r"no pg_hba\.conf entry for [^\n]*"),
    re.compile(r'role "[^"]*" is not permitted to log in'),
    re.compile(r'permission denied for database "[^"]*"'),
    re.compile(r"server does not support SSL, but SSL was required"),
    re.compile(r"certificate verify failed[^\n]*"),
    re.compile(r'invalid \w+ value: "[^"]*"'),
]
_PG_NO_PASSWORD = re.compile(r"no password supplied")
_PG_NOT_POSTGRES = re.compile(
    r"received invalid response to SSL negotiation|expected authentication request"
)
_PG_DNS = re.compile(r"failed to resolve host '([^']*)': \[Errno (-?\d+)\]")

# Outages worth a specific hint; anything else unrecognised is an outage too.
_PG_OUTAGES = [
    (re.compile(r"Connection refused"), "connection refused", "is it running?"),
    (re.compile(r"timeout expired"), "no answer (timed out)", "is the host reachable?"),
    (
        re.compile(r"the database system is (starting up|in recovery mode|not yet accepting)"),
        "the server is starting up",
        "waiting for it to accept connections",
    ),
    (
        re.compile(r"the database system is shutting down"),
        "the server is shutting down",
        "waiting for it to come back",
    ),
    (
        re.compile(r"too many clients|remaining connection slots are reserved"),
        "the server has no free connection slots",
        "check max_connections",
    ),
]

# getaddrinfo's answers that mean "this name does not exist", as opposed to "the
# resolver is not answering right now" (EAI_AGAIN).
_DNS_PERMANENT = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def postgres(exc: BaseException, url: DatabaseUrl) -> Diagnosis:
    """What a failed PostgreSQL connection (or its first statement) means."""
    if isinstance(exc, psycopg.ProgrammingError):
        # libpq refused the URL's own options (an unknown query parameter).
        return Diagnosis(True, f"is not usable: {first_line(exc)}")
    text = str(exc)
    for pattern in _PG_FATAL:
        found = pattern.search(text)
        if found:
            return Diagnosis(True, found.group(0))
    if _PG_NO_PASSWORD.search(text):
        return Diagnosis(True, f"the server at {url.address} asks for a password; the URL has none")
    if _PG_NOT_POSTGRES.search(text):
        return Diagnosis(True, f"the server at {url.address} did not answer as PostgreSQL")
    dns = _PG_DNS.search(text)
    if dns:
        return _dns(dns.group(1), int(dns.group(2)))
    for pattern, reason, hint in _PG_OUTAGES:
        if pattern.search(text):
            return Diagnosis(False, reason, hint)
    return Diagnosis(False, first_line(exc), "")


def rabbitmq(exc: BaseException, url: AmqpUrl) -> Diagnosis:
    """What a failed RabbitMQ connection means."""
    if isinstance(exc, NoNodeAnswered):
        return _no_node_answered(exc)
    if isinstance(exc, aiormq.exceptions.ProbableAuthenticationError):
        # RabbitMQ answers a bad user name and a bad password alike (ACCESS_REFUSED),
        # and also refuses guest from anywhere but localhost.
        guest = " (guest may log in only from localhost)" if url.user == "guest" else ""
        return Diagnosis(
            True, f'RabbitMQ refused the login of user "{url.user}": wrong user or password{guest}'
        )
    if isinstance(exc, aiormq.exceptions.AuthenticationError):
        return Diagnosis(True, "RabbitMQ offers no login mechanism this client supports")
    if _vhost_refused(exc):
        return Diagnosis(
            True,
            f'RabbitMQ refused virtual host "{url.vhost}": it does not exist, or user '
            f'"{url.user}" has no permissions on it',
        )
    # aiormq wraps the socket's own error (refused, DNS, TLS) and chains it.
    cause = exc.__cause__ or exc.__context__ or exc
    if isinstance(cause, ssl.SSLError):
        return Diagnosis(True, f"TLS handshake with {url.address} failed: {first_line(cause)}")
    if isinstance(cause, socket.gaierror):
        return _dns(url.host, cause.errno or 0)
    if isinstance(cause, ConnectionRefusedError) or exc.args[:1] == (errno.ECONNREFUSED,):
        return Diagnosis(False, "connection refused", "is it running?")
    if isinstance(exc, TimeoutError):
        return Diagnosis(False, "no answer (timed out)", "is the host reachable?")
    if "unexpectedly closed" in str(exc):
        return Diagnosis(
            False, "the server closed the connection during the handshake", "is it RabbitMQ?"
        )
    return Diagnosis(False, describe_error(exc), "")


def _no_node_answered(exc: NoNodeAnswered) -> Diagnosis:
    """Every node of a cluster failed: fatal only when each one's failure is (a
    node that is merely down may be back in a moment, and may let us in)."""
    found = [(node, rabbitmq(cause, node)) for node, cause in exc.failures]
    if all(d.fatal for _, d in found):
        reasons = list(dict.fromkeys(d.reason for _, d in found))
        return Diagnosis(True, reasons[0] if len(reasons) == 1 else "; ".join(reasons))
    reasons = list(dict.fromkeys(d.reason for _, d in found))
    if len(reasons) == 1:
        return Diagnosis(False, f"no node answered ({reasons[0]})", found[0][1].hint)
    return Diagnosis(
        False, "no node answered: " + "; ".join(f"{n.address}: {d.reason}" for n, d in found)
    )


def _vhost_refused(exc: BaseException) -> bool:
    # RabbitMQ answers Connection.Open for a missing or forbidden virtual host with
    # Connection.Close 530 NOT_ALLOWED. aiormq 7 raises that as an InvalidFrameError
    # ("Expected one of ['Connection.OpenOk'], got <Connection.Close ...>"), losing
    # the reply; a later aiormq may raise ConnectionClosed(530, ...) instead.
    if isinstance(exc, aiormq.exceptions.ConnectionClosed) and exc.args[:1] == (530,):
        return True
    text = str(exc)
    return (
        isinstance(exc, aiormq.exceptions.InvalidFrameError)
        and "Connection.OpenOk" in text
        and "Connection.Close" in text
    )


def _dns(host: str, code: int) -> Diagnosis:
    if code in _DNS_PERMANENT:
        return Diagnosis(True, f'host "{host}" not found (no such name in DNS)')
    return Diagnosis(False, f'cannot resolve host "{host}" right now', "is DNS reachable?")


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
