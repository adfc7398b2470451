"""The rules for names that end up in the database and in RabbitMQ: job types,
queue and tenant names, dedup keys. Both the producer and the handler registry check them."""

from __future__ import annotations

import re

from schema.tables import MAX_DEDUP_KEY_LENGTH, MAX_JOB_TYPE_LENGTH, QUEUE_NAME_PATTERN

MAX_QUEUE_NAME_LENGTH = 100
_QUEUE_NAME = re.compile(QUEUE_NAME_PATTERN)


def text(name: str, value: object, max_length: int) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must not be empty")
    if len(value) > max_length:
        raise ValueError(f"{name} is {len(value)} characters long; the limit is {max_length}")
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL characters")
    return value


def job_type(value: object) -> str:
    return text("job_type", value, MAX_JOB_TYPE_LENGTH)


def queue(value: object) -> str:
    name = text("queue", value, MAX_QUEUE_NAME_LENGTH)
    if not _QUEUE_NAME.match(name):
        raise ValueError(
            "queue must be 1-100 characters of letters, digits and _ . : - "
            "and start with a letter or digit"
        )
    return name


def tenant(value: object) -> str:
    """Tenant names follow queue names: they become metric labels and log fields."""
    name = text("tenant", value, MAX_QUEUE_NAME_LENGTH)
    if not _QUEUE_NAME.match(name):
        raise ValueError(
            "tenant must be 1-100 characters of letters, digits and _ . : - "
            "and start with a letter or digit"
        )
    return name


def dedup_key(value: object) -> str:
    return text("dedup_key", value, MAX_DEDUP_KEY_LENGTH)
