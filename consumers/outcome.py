"""How one attempt ended, in the form the fenced finish statement takes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["succeeded", "retry", "failed", "cancelled"]

# Long enough for a useful message, short enough to keep the hot row small.
MAX_ERROR_MESSAGE = 2000

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
        return cls("retry", code, _bounded(message), delay_seconds)

    @classmethod
    def failed(cls, code: str, message: str) -> Outcome:
        return cls("failed", code, _bounded(message))

    @classmethod
    def cancelled(cls, message: str) -> Outcome:
        return cls("cancelled", "CANCELLED", _bounded(message))


def _bounded(message: str) -> str:
    if len(message) <= MAX_ERROR_MESSAGE:
        return message
    return message[: MAX_ERROR_MESSAGE - 1] + "…"
