"""The rules for names that end up in the database and in RabbitMQ: job types,
queue and tenant names, dedup keys. Both the producer and the handler registry check them.

A name is matched whole (``fullmatch``: ``$`` would let a trailing newline through,
which PostgreSQL's CHECK then refuses), and no name holds a control character: names
are printed in logs, terminals and metric labels, where one could forge a line or
rewrite the screen. Dedup keys are the caller's data, not names: only what
PostgreSQL's text cannot hold is refused there.
"""

from __future__ import annotations

import re
from functools import lru_cache

from hybrid_jobs import defaults
from hybrid_jobs.schema.tables import (
    MAX_DEDUP_KEY_LENGTH,
    MAX_JOB_TYPE_LENGTH,
    MAX_KEY_LENGTH,
    MAX_TAG_LENGTH,
    QUEUE_NAME_PATTERN,
    TAG_PATTERN,
)

MAX_QUEUE_NAME_LENGTH = defaults.MAX_QUEUE_NAME_LENGTH
_QUEUE_NAME = re.compile(QUEUE_NAME_PATTERN)
_TAG = re.compile(TAG_PATTERN)
# What a JSON schema (the HTTP API's document) can say of text(): no control
# character (C0, DEL, C1), at least one character.
NO_CONTROLS_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]+$"
# Unicode's control characters (category Cc) are exactly these.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _has_control(value: str) -> bool:
    return _CONTROL.search(value) is not None


def text(name: str, value: object, max_length: int, *, controls: bool = False) -> str:
    """``value`` if it is a non-empty str of at most ``max_length`` characters that
    PostgreSQL's text can hold (no NUL, no lone surrogate) and, unless ``controls``,
    has no control character; else TypeError/ValueError naming ``name``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must not be empty")
    if len(value) > max_length:
        raise ValueError(f"{name} is {len(value)} characters long; the limit is {max_length}")
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} must be valid Unicode (no lone surrogates)") from None
    if not controls and _has_control(value):
        raise ValueError(f"{name} must not contain control characters (newlines, tabs, escapes)")
    return value


def job_type(value: object) -> str:
    return _job_type(value) if type(value) is str else text("job_type", value, 0)


# A batch names the same few job types, queues and tenants thousands of times: each
# is checked once. Only a str is remembered (hashable, and what passes); a refused
# one raises every time, and lru_cache keeps no exception.
@lru_cache(maxsize=4096)
def _job_type(value: str) -> str:
    return text("job_type", value, MAX_JOB_TYPE_LENGTH)


def _alphabet(name: str, value: object) -> str:
    found = text(name, value, MAX_QUEUE_NAME_LENGTH)
    if not _QUEUE_NAME.fullmatch(found):
        raise ValueError(
            f"{name} must be 1-100 characters of letters, digits and _ . : - "
            "and start with a letter or digit"
        )
    return found


def queue(value: object) -> str:
    return _queue(value) if type(value) is str else _alphabet("queue", value)


def tenant(value: object) -> str:
    """Tenant names follow queue names: they become metric labels and log fields."""
    return _tenant(value) if type(value) is str else _alphabet("tenant", value)


@lru_cache(maxsize=4096)
def _queue(value: str) -> str:
    return _alphabet("queue", value)


@lru_cache(maxsize=4096)
def _tenant(value: str) -> str:
    return _alphabet("tenant", value)


def dedup_key(value: object) -> str:
    return text("dedup_key", value, MAX_DEDUP_KEY_LENGTH, controls=True)


def rate_limit(value: object, *, pattern: bool = False) -> str:
    """A rate limit's name, like a tenant's; with ``pattern``, a set of them may also
    be named by a prefix and ``:*`` (``"sms:*"``)."""
    if pattern and isinstance(value, str) and value.endswith(":*"):
        return _alphabet("rate limit", value[:-2]) + ":*"
    return _alphabet("rate limit", value)


def key(value: object) -> str:
    return text("key", value, MAX_KEY_LENGTH, controls=True)


def resource(value: object) -> str:
    return text("resource", value, MAX_KEY_LENGTH, controls=True)


def tag(value: object) -> str:
    """A tag: it goes in URLs and command lines and is matched whole by the search,
    so a short name without spaces or commas."""
    found = text("tag", value, MAX_TAG_LENGTH)
    if not _TAG.fullmatch(found):
        raise ValueError(
            f"tag {found!r} must be 1-{MAX_TAG_LENGTH} characters of letters, digits and"
            " _ . : / = - and start with a letter or digit"
        )
    return found
