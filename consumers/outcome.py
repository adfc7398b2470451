"""How one attempt ended, in the form the fenced finish statement takes."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["succeeded", "retry", "failed", "cancelled"]

# Long enough for a useful message, short enough to keep the hot row small.
MAX_ERROR_MESSAGE = 2000
MAX_ERROR_CODE = 200
# A traceback keeps its last frames (where it was raised) within this many characters.
MAX_TRACEBACK = 8000
# A retry later than this is a mistake (an infinite or absurd delay); it is capped.
MAX_RETRY_DELAY = 365 * 24 * 3600.0

TIMEOUT = "TIMEOUT"
# A handler's return value is kept as the job's result up to this size, as JSON.
MAX_RESULT_BYTES = 64 * 1024


@dataclass(frozen=True)
class Outcome:
    kind: Kind
    error_code: str | None = None
    error_message: str | None = None
    delay_seconds: float | None = None
    traceback: str | None = None
    # The handler's return value as JSON text, for a success.
    result: str | None = None
    # The handler's last progress report, if the throttle had not written it yet
    # (JSON text): recorded with the outcome, so a finished job shows where it got.
    progress: str | None = None

    @classmethod
    def succeeded(cls, result: str | None = None) -> Outcome:
        return cls("succeeded", result=result)

    @classmethod
    def retry(
        cls, code: str, message: str, delay_seconds: float, traceback: str | None = None
    ) -> Outcome:
        delay = delay_seconds if math.isfinite(delay_seconds) else MAX_RETRY_DELAY
        return cls(
            "retry",
            _clean(code, MAX_ERROR_CODE),
            _clean(message, MAX_ERROR_MESSAGE),
            min(max(delay, 0.0), MAX_RETRY_DELAY),
            _tail(traceback),
        )

    @classmethod
    def failed(cls, code: str, message: str, traceback: str | None = None) -> Outcome:
        return cls(
            "failed",
            _clean(code, MAX_ERROR_CODE),
            _clean(message, MAX_ERROR_MESSAGE),
            traceback=_tail(traceback),
        )

    @classmethod
    def cancelled(cls, message: str) -> Outcome:
        return cls("cancelled", "CANCELLED", _clean(message, MAX_ERROR_MESSAGE))


def _clean(text: str, limit: int) -> str:
    """Text PostgreSQL will store whatever a handler put in its exception: no NUL,
    no lone surrogates, bounded."""
    text = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tail(traceback: str | None) -> str | None:
    """A traceback bounded by keeping its end: the frame that raised is what matters."""
    if traceback is None:
        return None
    text = traceback.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= MAX_TRACEBACK else "…" + text[-(MAX_TRACEBACK - 1) :]


def encode_result(value: Any) -> tuple[str | None, str | None]:
    """A handler's return value as JSON text for ``jobs.result``, or, when it cannot
    be kept, a small note saying why (and the reason, for the log)."""
    if value is None:
        return None, None
    try:
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        reason = f"not JSON-serialisable ({type(exc).__name__}: {exc})"
    else:
        size = len(encoded.encode("utf-8", "replace"))
        if size > MAX_RESULT_BYTES:
            reason = f"{size} bytes as JSON; the limit is {MAX_RESULT_BYTES}"
        elif "\\u0000" in encoded:
            reason = "it contains a NUL character, which jsonb cannot store"
        else:
            return encoded, None
    return json.dumps({"result_dropped": reason}), reason
