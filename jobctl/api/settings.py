"""``jobctl serve``'s settings, built once at its entry point."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from hybrid_jobs import defaults
from hybrid_jobs.jobctl.api.proxies import TrustedProxies
from hybrid_jobs.jobctl.api.tokens import Tokens
from hybrid_jobs.jobctl.metrics import CollectorSettings
from hybrid_jobs.outbox.validation import max_payload_bytes
from hybrid_jobs.plumbing.config import AmqpUrl, ConfigError, DatabaseUrl

# Room in a body for everything around the payload.
ENVELOPE_BYTES: Final = 16 * 1024
# The names a loopback listener answers to.
LOOPBACK_NAMES: Final = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """An address only this machine reaches: localhost, 127.0.0.0/8, ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::", "[::]")  # noqa: S104 (what a wildcard looks like)


@dataclass(frozen=True)
class PublicUrl:
    """Where people and clients reach the server, through a proxy or not: its
    origin (the Origin check of the dashboard's buttons, Secure cookies over https)
    and its path, the mount point the proxy strips (Location headers, links)."""

    scheme: str
    netloc: str
    path: str

    @classmethod
    def parse(cls, raw: str, setting: str = "JOBCTL_PUBLIC_URL") -> PublicUrl:
        parts = urlsplit(raw.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{setting} must be an http:// or https:// URL with a host")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ConfigError(f"{setting} must not hold a query, a fragment or credentials")
        try:
            parts.port  # noqa: B018 (reading it checks it)
        except ValueError:
            raise ConfigError(f"{setting} has an invalid port") from None
        return cls(parts.scheme, parts.netloc.lower(), parts.path.rstrip("/"))

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{self.netloc}"

    @property
    def host(self) -> str:
        found = urlsplit(self.origin).hostname
        assert found is not None
        return found


@dataclass(frozen=True)
class ApiSettings:
    database: DatabaseUrl
    amqp: AmqpUrl
    # A fixed token (a str), a source that may change (Tokens: from a file), or None:
    # no token configured, every change refused and every read open.
    token: str | Tokens | None = field(default=None, repr=False)
    # Larger bodies get 413 before any route runs: a payload at the producer's
    # limit (MAX_PAYLOAD_BYTES) and its envelope fit.
    max_body_bytes: int = field(default_factory=lambda: max_payload_bytes() + ENVELOPE_BYTES)
    # Collect metrics for /metrics (tests of other things turn it off), and how.
    metrics: bool = True
    collector: CollectorSettings = field(default_factory=CollectorSettings)
    pool_size: int = defaults.SERVE_POOL_SIZE
    # GET /v1/jobs/{id}?wait= requests held at once, by the process and by one client.
    max_waiters: int = defaults.SERVE_MAX_WAITERS
    max_waiters_per_client: int = defaults.SERVE_MAX_WAITERS_PER_CLIENT
    bind_host: str = defaults.SERVE_BIND_HOST
    # Host names (or addresses) requests may name besides the loopback names, the
    # bind address and the public URL's host; "*" lets every one through, and
    # ".example.com" a domain and its subdomains.
    allowed_hosts: tuple[str, ...] = ()
    public_url: PublicUrl | None = None
    # /metrics without the token even when one is set (a network only Prometheus
    # reaches).
    open_metrics: bool = False
    readiness_seconds: float = defaults.SERVE_READINESS_SECONDS
    failures_allowed: int = defaults.SERVE_FAILURES_ALLOWED
    failure_window_seconds: float = defaults.SERVE_FAILURE_WINDOW_SECONDS
    proxy_failures_allowed: int = defaults.SERVE_PROXY_FAILURES_ALLOWED
    # The reverse proxies whose X-Forwarded-For and X-Forwarded-Proto are believed
    # (addresses and networks, comma-separated; "*": any peer). None by default:
    # every request is its socket's peer.
    forwarded_allow_ips: str = defaults.SERVE_FORWARDED_ALLOW_IPS

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ConfigError("the body limit must be at least 1024 bytes")
        if self.failures_allowed < 1 or self.failure_window_seconds <= 0:
            raise ConfigError("the failed-attempt limit and its window must be positive")
        if self.max_waiters < 1 or self.max_waiters_per_client < 1:
            raise ConfigError("the limits of waiting requests (?wait=) must be at least 1")
        if self.proxy_failures_allowed < self.failures_allowed:
            raise ConfigError("a proxy's failed-attempt limit must be at least a client's")
        self.trusted_proxies  # noqa: B018 (reading it checks it)

    @property
    def trusted_proxies(self) -> TrustedProxies:
        return TrustedProxies.parse(self.forwarded_allow_ips)

    @property
    def tokens(self) -> Tokens | None:
        if self.token is None or isinstance(self.token, Tokens):
            return self.token
        return Tokens.fixed(self.token)

    def served_hosts(self) -> frozenset[str] | None:
        """The hosts a request may name (lower case, no port); None: any."""
        if "*" in self.allowed_hosts:
            return None
        hosts = {*LOOPBACK_NAMES, *(h.lower().strip("[]") for h in self.allowed_hosts)}
        if not _wildcard(self.bind_host):
            hosts.add(self.bind_host.lower().strip("[]"))
        if self.public_url is not None:
            hosts.add(self.public_url.host)
        return frozenset(hosts)

    @property
    def public_https(self) -> bool:
        """People reach the server over https (a TLS proxy in front of it), so every
        answer carries HSTS, whether the proxy is trusted to say so or not."""
        return self.public_url is not None and self.public_url.scheme == "https"

    @property
    def root_path(self) -> str:
        return "" if self.public_url is None else self.public_url.path
