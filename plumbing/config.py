"""Connection settings shared by the relay, the consumer and the migrations.

Each process builds its frozen settings once at its entry point (the CLI) and passes
them down. URLs come from the environment (``DATABASE_URL``, ``AMQP_URL``, or the
``*_FILE`` variants that name a file holding the URL, for container secrets) or from
flags that override them. A malformed URL is reported in one line that names the
variable and never echoes the URL, since it may carry a password.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psycopg.conninfo
import yarl

DEFAULT_DATABASE_URL = "postgresql://127.0.0.1:5432/jobs"
# No credentials here: without a user in the URL, RabbitMQ's client library uses the
# broker's local default account.
DEFAULT_AMQP_URL = "amqp://127.0.0.1:5672/"

_PG_SCHEMES = {"postgresql", "postgres", "postgresql+psycopg"}
_AMQP_SCHEMES = {"amqp", "amqps"}


class ConfigError(ValueError):
    """A setting is missing or malformed. The message is safe to print."""


def read_setting(name: str, default: str) -> str:
    """``$NAME``, else the contents of the file named by ``$NAME_FILE``, else default."""
    value = os.environ.get(name)
    if value:
        return value.strip()
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"{name}_FILE: cannot read {path}: {exc.strerror}") from None
    return default


@dataclass(frozen=True)
class DatabaseUrl:
    """A validated PostgreSQL URL, in the forms each library wants."""

    conninfo: str  # for psycopg: postgresql://...

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
            psycopg.conninfo.conninfo_to_dict(conninfo)
        except psycopg.ProgrammingError:
            raise ConfigError(f"{variable} is not a valid PostgreSQL URL") from None
        return cls(conninfo)

    @property
    def sqlalchemy(self) -> str:
        return "postgresql+psycopg://" + self.conninfo.removeprefix("postgresql://")

    def redacted(self) -> str:
        """Host, port and database, for logs: never the user's password."""
        params = psycopg.conninfo.conninfo_to_dict(self.conninfo)
        host = params.get("host") or "localhost"
        port = params.get("port") or "5432"
        return f"postgresql://{host}:{port}/{params.get('dbname') or ''}"

    def __repr__(self) -> str:
        return f"DatabaseUrl({self.redacted()!r})"


@dataclass(frozen=True)
class AmqpUrl:
    url: str

    @classmethod
    def parse(cls, raw: str, *, variable: str = "AMQP_URL") -> AmqpUrl:
        try:
            parsed = yarl.URL(raw)
        except (ValueError, TypeError):
            raise ConfigError(f"{variable} is not a valid URL") from None
        if parsed.scheme not in _AMQP_SCHEMES:
            raise ConfigError(f"{variable} must be an amqp:// or amqps:// URL")
        if not parsed.host:
            raise ConfigError(f"{variable} must name a host")
        try:
            parsed.port  # noqa: B018 - a bad port only raises when read
        except ValueError:
            raise ConfigError(f"{variable} has an invalid port") from None
        return cls(raw)

    def redacted(self) -> str:
        parsed = yarl.URL(self.url)
        return str(parsed.with_user(None).with_password(None))

    def __repr__(self) -> str:
        return f"AmqpUrl({self.redacted()!r})"


def database_url(override: str | None = None) -> DatabaseUrl:
    return DatabaseUrl.parse(override or read_setting("DATABASE_URL", DEFAULT_DATABASE_URL))


def amqp_url(override: str | None = None) -> AmqpUrl:
    return AmqpUrl.parse(override or read_setting("AMQP_URL", DEFAULT_AMQP_URL))
