"""How one attempt ended, in the form the fenced finish statement takes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Kind = Literal["succeeded", "retry", "failed", "cancelled"]

# Long enough for a useful message, short enough to keep the hot row small.
MAX_ERROR_MESSAGE = 2000
MAX_ERROR_CODE = 200
# A retry later than this is a mistake (an infinite or absurd delay); it is capped.
MAX_RETRY_DELAY = 365 * 24 * 3600.0

UNKNOWN_JOB_TYPE = "UNKNOWN_JOB_TYPE"
TIMEOUT = "TIMEOUT"


@dataclass(frozen=True)
class Outcome:
    kind: Kind
    error_code: str | None = None
    error_message: str | None = None
    delay_seconds: float | None = None

    @classmethod
    def succeeded(cls) -> Outcome:
        return cls("succeeded")

    @classmethod
    def retry(cls, code: str, message: str, delay_seconds: float) -> Outcome:
        delay = delay_seconds if math.isfinite(delay_seconds) else MAX_RETRY_DELAY
        return cls(
            "retry",
            _clean(code, MAX_ERROR_CODE),
            _clean(message, MAX_ERROR_MESSAGE),
            min(max(delay, 0.0), MAX_RETRY_DELAY),
        )

    @classmethod
    def failed(cls, code: str, message: str) -> Outcome:
        return cls("failed", _clean(code, MAX_ERROR_CODE), _clean(message, MAX_ERROR_MESSAGE))

    @classmethod
    def cancelled(cls, message: str) -> Outcome:
        return cls("cancelled", "CANCELLED", _clean(message, MAX_ERROR_MESSAGE))


def _clean(text: str, limit: int) -> str:
    """Text PostgreSQL will store whatever a handler put in its exception: no NUL,
    no lone surrogates, bounded."""
    text = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 1] + "…"
