"""Arguments the operator's calls share: a job id, and who is acting."""

from __future__ import annotations

import uuid

from hybrid_jobs.schema import names

MAX_ACTOR_LENGTH = 200


def job_id_arg(value: object) -> uuid.UUID:
    """A job id given as a UUID or its text; anything else is refused by name, so
    a typo from a command line reads as such rather than as "no such job"."""
    if isinstance(value, uuid.UUID):
        return value
    if not isinstance(value, str):
        raise TypeError(f"job_id must be a UUID or a str, not {type(value).__name__}")
    try:
        return uuid.UUID(value.strip())
    except ValueError:
        raise ValueError(f"job_id is not a UUID: {value[:100]!r}") from None


def actor(value: object) -> str | None:
    """Who is acting, as recorded (None: the database role and application_name)."""
    return None if value is None else names.text("by", value, MAX_ACTOR_LENGTH)
