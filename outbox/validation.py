"""Checks every argument of an enqueue before anything is written.

A bad argument raises ``TypeError`` (wrong kind of value) or ``ValueError`` (right
kind, unacceptable value) naming the argument; the caller's transaction is untouched.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from schema import names

DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024
MAX_PAYLOAD_BYTES_ENV = "MAX_PAYLOAD_BYTES"
PRIORITY_RANGE = range(-32768, 32768)  # smallint
MAX_ATTEMPTS_LIMIT = 1000

# An escaped NUL in JSON text: \u0000 preceded by an even number of backslashes.
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


@dataclass(frozen=True)
class NewJob:
    """One job for :func:`outbox.enqueue_many`; the fields mean what enqueue's do."""

    job_type: str
    payload: Any
    queue: str = "default"
    dedup_key: str | None = None
    run_after: datetime | timedelta | None = None
    max_attempts: int | None = None
    priority: int = 0
    tenant: str | None = None


def new_job_id() -> uuid.UUID:
    """A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random bits. Ids
    created close together sort close together, so the primary key index grows at
    its right edge instead of touching a random page per insert, and a list of jobs
    in id order is in creation order (the clock of whoever enqueued them; ordering
    only, never a decision)."""
    millis = time.time_ns() // 1_000_000 & (1 << 48) - 1
    rand = int.from_bytes(secrets.token_bytes(10), "big")
    value = (millis << 80) | (0x7 << 76) | ((rand >> 64) & 0xFFF) << 64 | (0b10 << 62)
    return uuid.UUID(int=value | (rand & (1 << 62) - 1))


def max_payload_bytes() -> int:
    raw = os.environ.get(MAX_PAYLOAD_BYTES_ENV)
    if not raw:
        return DEFAULT_MAX_PAYLOAD_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{MAX_PAYLOAD_BYTES_ENV} must be an integer number of bytes") from None
    if value < 1:
        raise ValueError(f"{MAX_PAYLOAD_BYTES_ENV} must be positive")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def encode_payload(payload: Any, limit: int) -> str:
    """The payload as compact JSON text, checked the way PostgreSQL's jsonb will."""
    try:
        encoded = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except TypeError as exc:
        raise TypeError(f"payload is not JSON-serialisable: {exc}") from None
    except ValueError as exc:  # NaN / Infinity, circular references
        raise ValueError(f"payload is not valid JSON: {exc}") from None
    try:
        size = len(encoded.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("payload contains a lone surrogate, which is not valid UTF-8") from None
    if size > limit:
        raise ValueError(
            f"payload is {size} bytes as JSON; the limit is {limit} ({MAX_PAYLOAD_BYTES_ENV})"
        )
    # jsonb refuses the NUL character; catch it here, with a clear message.
    if _ESCAPED_NUL.search(encoded):
        raise ValueError("payload contains a NUL character (U+0000), which jsonb cannot store")
    return encoded


def _run_after(value: object) -> tuple[str | None, float | None]:
    if value is None:
        return None, None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
            raise ValueError("run_after must be timezone-aware (a naive datetime is ambiguous)")
        return value.isoformat(), None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        if not math.isfinite(seconds):
            raise ValueError("run_after is not a finite timedelta")
        return None, seconds
    raise TypeError(f"run_after must be a datetime or a timedelta, not {type(value).__name__}")


def to_row(job: NewJob, limit: int) -> tuple[uuid.UUID, str]:
    """A new id for the job, and the validated job as a JSON object for
    ``JOB_INSERT_MANY`` (payload embedded)."""
    job_type = names.job_type(job.job_type)
    queue = names.queue(job.queue)
    dedup_key = None if job.dedup_key is None else names.dedup_key(job.dedup_key)
    tenant = None if job.tenant is None else names.tenant(job.tenant)
    if job.max_attempts is not None:
        if not _is_int(job.max_attempts):
            raise TypeError(f"max_attempts must be an int, not {type(job.max_attempts).__name__}")
        if not 1 <= job.max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise ValueError(f"max_attempts must be between 1 and {MAX_ATTEMPTS_LIMIT}")
    if not _is_int(job.priority):
        raise TypeError(f"priority must be an int, not {type(job.priority).__name__}")
    if job.priority not in PRIORITY_RANGE:
        raise ValueError("priority must fit in a smallint (-32768..32767)")
    run_after, delay_seconds = _run_after(job.run_after)
    payload = encode_payload(job.payload, limit)
    job_id = new_job_id()
    head = json.dumps(
        {
            "job_id": str(job_id),
            "job_type": job_type,
            "queue": queue,
            "tenant": tenant,
            "dedup_key": dedup_key,
            "max_attempts": job.max_attempts,
            "priority": job.priority,
            "run_after": run_after,
            "delay_seconds": delay_seconds,
        },
        ensure_ascii=False,
        separators=(",", ":"),
    )
    # Splice the already-encoded payload in rather than encoding it a second time.
    return job_id, f'{head[:-1]},"payload":{payload}}}'
