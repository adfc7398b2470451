"""Connection settings shared by the relay, the consumer and the migrations.

Each process builds its frozen settings once at its entry point (the CLI) and passes
them down. URLs come from the environment (``DATABASE_URL``, ``AMQP_URL``, or the
``*_FILE`` variants that name a file holding the URL, for container secrets) or from
flags that override them. A malformed URL is reported in one line that names the
setting it came from (``DATABASE_URL``, ``DATABASE_URL_FILE`` or ``--database-url``)
and never echoes the URL, since it may carry a password. Each parsed URL remembers
that setting, so an error found later (a refused login at start-up) names it too.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode

import psycopg.conninfo
import yarl

from hybrid_jobs import defaults

DEFAULT_DATABASE_URL = defaults.DATABASE_URL
DEFAULT_AMQP_URL = defaults.AMQP_URL
DEFAULT_SCHEMA = defaults.SCHEMA

# An instance's schema: lower case, so that it needs no quoting anywhere a user
# types it (search_path, psql), and short enough that the NOTIFY channels named
# after it stay within PostgreSQL's 63 bytes.
_SCHEMA_NAME = re.compile(r"^(?!pg_)[a-z_][a-z0-9_]{0,47}$")

_PG_SCHEMES = {"postgresql", "postgres", "postgresql+psycopg"}
_AMQP_SCHEMES = {"amqp", "amqps"}


class ConfigError(ValueError):
    """A setting is missing or malformed. The message is safe to print."""


def read_setting(name: str, default: str) -> str:
    """``$NAME``, else the contents of the file named by ``$NAME_FILE``, else default."""
    return read_setting_from(name, default)[0]


def read_setting_from(name: str, default: str) -> tuple[str, str]:
    """Like ``read_setting``, with the name of the setting the value came from
    (``NAME``, or ``NAME_FILE``), for error messages. The default counts as ``NAME``:
    setting it is how a user changes it."""
    value = os.environ.get(name)
    if value:
        return value.strip(), name
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").strip(), f"{name}_FILE"
        except OSError as exc:
            raise ConfigError(f"{name}_FILE: cannot read {path}: {exc.strerror}") from None
    return default, name


def check_schema(schema: str, variable: str = "HYBRID_JOBS_SCHEMA") -> str:
    """``schema`` if it can name an instance's schema; else a ConfigError."""
    if not _SCHEMA_NAME.match(schema):
        raise ConfigError(
            f"{variable} must be 1-48 lower-case letters, digits or underscores, starting "
            "with a letter or underscore and not with pg_"
        )
    return schema


def _with_search_path(conninfo: str, schema: str) -> str:
    """``conninfo`` (a postgresql:// URL) with ``-c search_path=<schema>`` added to
    the startup options it may already carry. Only the query string is touched: the
    host list of a multi-host URL stays as written."""
    base, _, query = conninfo.partition("?")
    params = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "options"]
    # libpq reads $PGOPTIONS only when the URL has no options: once it has ours,
    # the variable's would be lost.
    options = psycopg.conninfo.conninfo_to_dict(conninfo).get("options") or os.environ.get(
        "PGOPTIONS"
    )
    merged = " ".join(filter(None, [str(options or ""), f"-c search_path={schema}"]))
    return f"{base}?{urlencode([*params, ('options', merged)], quote_via=quote)}"


def _check_ports(variable: str, ports: str) -> None:
    # libpq takes any text as a port and only fails at connect time, with a message
    # that looks like an outage; a port that cannot exist is a typo to report now.
    for port in ports.split(","):
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            raise ConfigError(f"{variable} has an invalid port (must be a number 1-65535)")


@dataclass(frozen=True)
class DatabaseUrl:
    """A validated PostgreSQL URL, in the forms each library wants."""

    conninfo: str  # for psycopg: postgresql://...
    # Where the URL came from, to name in error messages: DATABASE_URL,
    # DATABASE_URL_FILE or --database-url.
    setting: str = field(default="DATABASE_URL", compare=False)
    # The URL points at a transaction-pooling proxy (PgBouncer in transaction mode,
    # DATABASE_POOLER=transaction): no prepared statements, no startup options.
    pooled: bool = field(default=False, compare=False)
    # A direct connection for LISTEN, which a transaction pooler cannot carry
    # (DATABASE_LISTEN_URL); None: the main URL.
    listen: str | None = field(default=None, compare=False, repr=False)
    # The instance's schema (HYBRID_JOBS_SCHEMA), which every connection made from
    # ``conninfo`` looks in first; None: the connection's own search_path.
    schema: str | None = field(default=None, compare=False)
    # Whether the schema was set (HYBRID_JOBS_SCHEMA), not the default: `jobctl
    # migrate` creates a new instance beside an existing one only when told to.
    schema_given: bool = field(default=False, compare=False)

    @classmethod
    def parse(cls, raw: str, *, variable: str = "DATABASE_URL") -> DatabaseUrl:
        scheme, sep, rest = raw.partition("://")
        if not sep or scheme not in _PG_SCHEMES:
            raise ConfigError(
                f"{variable} must be a postgresql:// URL (got scheme {scheme!r})"
                if sep
                else f"{variable} must be a postgresql:// URL"
            )
        conninfo = f"postgresql://{rest}"
        try:
            params = psycopg.conninfo.conninfo_to_dict(conninfo)
        except psycopg.ProgrammingError:
            raise ConfigError(f"{variable} is not a valid PostgreSQL URL") from None
        _check_ports(variable, str(params.get("port") or ""))
        return cls(conninfo, variable)

    @property
    def params(self) -> dict[str, str]:
        return {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(self.conninfo).items()}

    def in_schema(self, schema: str, *, given: bool = False) -> DatabaseUrl:
        """This URL for the instance in ``schema``: its connections (psycopg's, and
        SQLAlchemy's through :attr:`sqlalchemy`) start with ``search_path`` set to
        it, so the project's unqualified SQL finds that instance's tables. Through a
        transaction pooler startup options do not reach the server: there the role's
        search_path must name the schema (the start-up check says so)."""
        check_schema(schema)
        conninfo = self.conninfo
        listen = self.listen
        if not self.pooled:
            conninfo = _with_search_path(conninfo, schema)
        if listen is not None:
            listen = _with_search_path(listen, schema)
        return replace(self, conninfo=conninfo, listen=listen, schema=schema, schema_given=given)

    @property
    def has_password(self) -> bool:
        return bool(self.params.get("password"))

    @property
    def address(self) -> str:
        """``host:port`` as libpq will try it (a socket directory for a local socket)."""
        params = self.params
        return f"{params.get('host') or 'localhost'}:{params.get('port') or '5432'}"

    @property
    def dbname(self) -> str:
        """The database libpq will ask for: the URL's, else $PGDATABASE, else the one
        named after the user."""
        params = self.params
        return (
            params.get("dbname")
            or os.environ.get("PGDATABASE")
            or params.get("user")
            or os.environ.get("PGUSER")
            or getpass.getuser()
        )

    @property
    def sqlalchemy(self) -> str:
        return "postgresql+psycopg://" + self.conninfo.removeprefix("postgresql://")

    def redacted(self) -> str:
        """Host, port and database, for logs: never the user's password."""
        return f"postgresql://{self.address}/{self.params.get('dbname') or ''}"

    def __repr__(self) -> str:
        return f"DatabaseUrl({self.redacted()!r})"


# Where one node's URL ends and the next begins in a multi-node AMQP_URL: a comma
# before a scheme (or at the end), so a comma inside a password (allowed unencoded
# in a URL's user information) does not split it.
_NODE_SEPARATOR = re.compile(r"\s*,\s*(?=[a-z][a-z0-9+.-]*://|$)", re.IGNORECASE)


@dataclass(frozen=True)
class AmqpUrl:
    """A validated RabbitMQ URL, or one per node of a cluster, comma-separated
    (``amqp://u:p@h1:5672/v,amqp://u:p@h2:5672/v``): clients connect to the first
    node that answers and, when they lose it, to the next one that does
    (``plumbing.amqp``). ``nodes`` are the URLs one by one; the properties that
    describe one node (``host``, ``user``, ``vhost``) describe the first."""

    urls: tuple[str, ...]
    # AMQP_URL, AMQP_URL_FILE or --amqp-url.
    setting: str = field(default="AMQP_URL", compare=False)

    @classmethod
    def parse(cls, raw: str, *, variable: str = "AMQP_URL") -> AmqpUrl:
        parts = _NODE_SEPARATOR.split(raw.strip())
        urls = tuple(
            _check_amqp_node(part, variable if len(parts) == 1 else f"{variable} (URL {i})")
            for i, part in enumerate(parts, 1)
        )
        parsed = cls(urls, variable)
        if len({node.vhost for node in parsed.nodes}) > 1:
            # One cluster, one namespace: nodes that disagree would split the queues.
            raise ConfigError(f"{variable}: every URL must name the same virtual host")
        return parsed

    @property
    def url(self) -> str:
        """The setting's value (every node's URL, comma-separated), to hand on to
        another process; a client library takes one of ``nodes`` at a time."""
        return ",".join(self.urls)

    @property
    def nodes(self) -> tuple[AmqpUrl, ...]:
        return tuple(AmqpUrl((url,), self.setting) for url in self.urls)

    @property
    def has_password(self) -> bool:
        return any(yarl.URL(url).password for url in self.urls)

    @property
    def host(self) -> str:
        return yarl.URL(self.urls[0]).host or ""

    @property
    def address(self) -> str:
        """``host:port`` of each node, comma-separated."""
        return ",".join(_amqp_address(yarl.URL(url)) for url in self.urls)

    @property
    def user(self) -> str:
        # aiormq logs in as guest when the URL names no user.
        return yarl.URL(self.urls[0]).user or "guest"

    @property
    def vhost(self) -> str:
        # As aiormq reads it: the path after its first slash, "/" when empty.
        path = yarl.URL(self.urls[0]).path
        return path[1:].replace("%2F", "/") if path not in ("", "/") else "/"

    def redacted(self) -> str:
        """Every node's URL without user or password, comma-separated, for logs."""
        return ",".join(str(yarl.URL(url).with_user(None).with_password(None)) for url in self.urls)

    def __repr__(self) -> str:
        return f"AmqpUrl({self.redacted()!r})"


def _check_amqp_node(raw: str, variable: str) -> str:
    """One node's URL, checked; the messages name ``variable`` (which URL of a list)."""
    bad_port = f"{variable} has an invalid port (must be a number 1-65535)"
    if not raw:
        raise ConfigError(f"{variable} is empty")
    try:
        parsed = yarl.URL(raw)
    except (ValueError, TypeError) as exc:
        # Newer yarl checks the port range while parsing; older only when read.
        if "port" in str(exc).lower():
            raise ConfigError(bad_port) from None
        raise ConfigError(f"{variable} is not a valid URL") from None
    if parsed.scheme not in _AMQP_SCHEMES:
        raise ConfigError(f"{variable} must be an amqp:// or amqps:// URL")
    if not parsed.host:
        raise ConfigError(f"{variable} must name a host")
    try:
        port = parsed.port
    except ValueError:
        raise ConfigError(bad_port) from None
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(bad_port)
    return raw


def _amqp_address(parsed: yarl.URL) -> str:
    return f"{parsed.host}:{parsed.port or (5671 if parsed.scheme == 'amqps' else 5672)}"


def database_url(override: str | None = None) -> DatabaseUrl:
    """The PostgreSQL URL: ``override`` (the ``--database-url`` flag), else the
    environment, else the default; with DATABASE_POOLER, DATABASE_LISTEN_URL (or
    DATABASE_LISTEN_URL_FILE) and the instance's schema (HYBRID_JOBS_SCHEMA) from
    the environment."""
    if override:
        url = DatabaseUrl.parse(override, variable="--database-url")
    else:
        raw, setting = read_setting_from("DATABASE_URL", DEFAULT_DATABASE_URL)
        url = DatabaseUrl.parse(raw, variable=setting)
    pooler = os.environ.get("DATABASE_POOLER", defaults.DATABASE_POOLER).strip().lower() or "none"
    if pooler not in ("none", "transaction"):
        raise ConfigError("DATABASE_POOLER must be none or transaction")
    raw_listen, listen_setting = read_setting_from("DATABASE_LISTEN_URL", "")
    listen = DatabaseUrl.parse(raw_listen, variable=listen_setting) if raw_listen else None
    url = replace(url, pooled=pooler == "transaction", listen=listen.conninfo if listen else None)
    schema, given = instance_schema()
    return url.in_schema(schema, given=given)


def instance_schema() -> tuple[str, bool]:
    """The instance's schema (``$HYBRID_JOBS_SCHEMA``, else ``hybrid_jobs``), and
    whether it was set rather than defaulted."""
    raw, setting = read_setting_from("HYBRID_JOBS_SCHEMA", "")
    if not raw:
        return DEFAULT_SCHEMA, False
    return check_schema(raw, setting), True


def amqp_url(override: str | None = None) -> AmqpUrl:
    """The RabbitMQ URL, or one per node: ``override`` (the ``--amqp-url`` flag),
    else the environment, else the default."""
    if override:
        return AmqpUrl.parse(override, variable="--amqp-url")
    raw, setting = read_setting_from("AMQP_URL", DEFAULT_AMQP_URL)
    return AmqpUrl.parse(raw, variable=setting)


def password_in_flag(url: DatabaseUrl | AmqpUrl) -> str | None:
    """A warning when a URL given as a flag holds a password: the command line of a
    process is readable by every user of the machine (``ps``, /proc). Names the flag,
    never the value."""
    if not (url.setting.startswith("--") and url.has_password):
        return None
    variable = url.setting.removeprefix("--").replace("-", "_").upper()
    return (
        f"{url.setting} holds a password, which anyone on this machine can read with "
        f"`ps`; set {variable} or {variable}_FILE instead"
    )


WEBHOOK_SECRET_ENV = "WEBHOOK_SECRET"  # noqa: S105 (the variable's name, not a secret)
# Shorter than this, an HMAC key is guessable: refused rather than used.
MIN_WEBHOOK_SECRET_LENGTH = 16


def webhook_secret() -> bytes | None:
    """The key the relay signs webhook calls with: ``$WEBHOOK_SECRET``, else the
    contents of the file named by ``$WEBHOOK_SECRET_FILE``; None when neither is set.
    Never taken from a flag (it would show in ``ps``) and never echoed."""
    value, source = read_setting_from(WEBHOOK_SECRET_ENV, "")
    if not value:
        return None
    if len(value) < MIN_WEBHOOK_SECRET_LENGTH:
        raise ConfigError(
            f"{source} is too short: a webhook secret needs at least "
            f"{MIN_WEBHOOK_SECRET_LENGTH} characters (e.g. `openssl rand -hex 32`)"
        )
    return value.encode()
