"""``jobctl serve``'s settings, built once at its entry point."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from outbox.validation import max_payload_bytes
from plumbing.config import AmqpUrl, ConfigError, DatabaseUrl, read_setting_from

TOKEN_SETTING: Final = "JOBCTL_API_TOKEN"  # noqa: S105 (the variable's name)
# Room in a body for everything around the payload.
ENVELOPE_BYTES: Final = 16 * 1024


@dataclass(frozen=True)
class ApiSettings:
    database: DatabaseUrl
    amqp: AmqpUrl
    # None: no token configured, and every change is refused.
    token: str | None = field(default=None, repr=False)
    # Larger bodies get 413 before any route runs: a payload at the producer's
    # limit (MAX_PAYLOAD_BYTES) and its envelope fit.
    max_body_bytes: int = field(default_factory=lambda: max_payload_bytes() + ENVELOPE_BYTES)
    # Collect metrics for /metrics (tests of other things turn it off).
    metrics: bool = True
    pool_size: int = 5

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ConfigError("the body limit must be at least 1024 bytes")


def api_token() -> str | None:
    """The bearer token, from $JOBCTL_API_TOKEN or the file $JOBCTL_API_TOKEN_FILE
    names; None when neither is set. Never logged."""
    value, setting = read_setting_from(TOKEN_SETTING, "")
    if not value:
        return None
    if any(c.isspace() for c in value) or not value.isascii() or not value.isprintable():
        raise ConfigError(f"{setting} must be printable ASCII without spaces")
    return value
