"""How one attempt ended, in the form the fenced finish statement takes."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any, Literal

from hybrid_jobs import defaults

Kind = Literal["succeeded", "retry", "failed", "cancelled", "snoozed"]

# Long enough for a useful message, short enough to keep the hot row small.
MAX_ERROR_MESSAGE = 2000
MAX_ERROR_CODE = 200
# A traceback keeps its last frames (where it was raised) within this many characters.
MAX_TRACEBACK = 8000
# A retry later than this is a mistake (an infinite or absurd delay); it is capped.
MAX_RETRY_DELAY = 365 * 24 * 3600.0

TIMEOUT = "TIMEOUT"
# The error code of a snoozed attempt's history row (never the job's last error: a
# snooze is not one).
SNOOZED = "SNOOZED"
# A handler's return value is kept as the job's result up to this size, as JSON,
# nested at most this deep (every surface that shows a result must be able to).
MAX_RESULT_BYTES = defaults.MAX_RESULT_BYTES
MAX_RESULT_DEPTH = defaults.MAX_RESULT_DEPTH
# An escaped NUL in JSON text: \u0000 preceded by an even number of backslashes.
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


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
    def snoozed(cls, seconds: float) -> Outcome:
        """Back to waiting for ``seconds`` (bounded as a retry's delay), the attempt
        refunded."""
        delay = seconds if math.isfinite(seconds) else MAX_RETRY_DELAY
        delay = min(max(delay, 0.0), MAX_RETRY_DELAY)
        return cls("snoozed", SNOOZED, f"snoozed for {delay:.10g} s", delay)

    @classmethod
    def cancelled(cls, message: str) -> Outcome:
        return cls("cancelled", "CANCELLED", _clean(message, MAX_ERROR_MESSAGE))

    def storable(self, refused: str) -> Outcome:
        """This outcome without the handler's data (its result and progress), for
        when the database refused it: a note saying why stands in for the result."""
        note = _note(f"the database refused it: {refused}") if self.kind == "succeeded" else None
        return replace(self, result=note, progress=None)

    def bare(self, refused: str) -> Outcome:
        """This outcome reduced to what it decides (its kind and retry delay), with
        plain ASCII texts: the last resort when the database refused it again."""
        code = None if self.error_code is None else _ascii(self.error_code, MAX_ERROR_CODE)
        message = None
        if self.error_message is not None:
            message = _ascii(
                f"the database refused this attempt's error text ({refused})", MAX_ERROR_MESSAGE
            )
        plain = self.storable(refused)
        return replace(plain, error_code=code, error_message=message, traceback=None)


def _clean(text: str, limit: int) -> str:
    """Text PostgreSQL will store whatever a handler put in its exception: no NUL,
    no lone surrogates, bounded."""
    text = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ascii(text: str, limit: int) -> str:
    text = text.replace("\x00", "").encode("ascii", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _tail(traceback: str | None) -> str | None:
    """A traceback bounded by keeping its end: the frame that raised is what matters."""
    if traceback is None:
        return None
    text = traceback.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= MAX_TRACEBACK else "…" + text[-(MAX_TRACEBACK - 1) :]


def json_problem(encoded: str) -> str | None:
    """Why PostgreSQL's jsonb would refuse this JSON text, or None: a lone surrogate
    (not valid UTF-8; common in file names decoded with ``surrogateescape``) or an
    escaped NUL character."""
    try:
        encoded.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = encoded[exc.start]
        return f"it contains a lone surrogate (U+{ord(char):04X}), which is not valid UTF-8"
    if _ESCAPED_NUL.search(encoded):
        return "it contains a NUL character (U+0000), which jsonb cannot store"
    return None


def encode_result(value: Any) -> tuple[str | None, str | None]:
    """A handler's return value as JSON text for ``jobs.result``, or, when it cannot
    be kept, a small note saying why (and the reason, for the log): not JSON, NaN or
    infinite numbers, nested deeper than ``MAX_RESULT_DEPTH``, a lone surrogate, a NUL
    character, or more than ``MAX_RESULT_BYTES``. Whatever a handler returns, the
    job's outcome can be recorded."""
    if value is None:
        return None, None
    try:
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        reason = f"not JSON-serialisable ({type(exc).__name__}: {exc})"
    else:
        problem = json_problem(encoded)
        if problem is not None:
            reason = problem
        else:
            size = len(encoded.encode("utf-8"))
            depth = _depth(encoded) if _may_nest(encoded) else 0
            if size > MAX_RESULT_BYTES:
                reason = f"{size} bytes as JSON; the limit is {MAX_RESULT_BYTES}"
            elif depth > MAX_RESULT_DEPTH:
                reason = f"nested {depth} levels deep; the limit is {MAX_RESULT_DEPTH}"
            else:
                return encoded, None
    reason = _clean(reason, MAX_ERROR_MESSAGE)
    return _note(reason), reason


def _note(reason: str) -> str:
    return json.dumps({"result_dropped": _clean(reason, MAX_ERROR_MESSAGE)})


def _may_nest(encoded: str) -> bool:
    return encoded.count("[") + encoded.count("{") > MAX_RESULT_DEPTH


def _depth(encoded: str) -> int:
    """How deep the containers of compact JSON text nest (brackets inside strings
    are skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in encoded:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest
