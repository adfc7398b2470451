"""Inputs stored by reference: a large or sensitive payload stored once, named by
the jobs that run on it.

::

    with Session(engine) as session, session.begin():
        ref = outbox.store_input(session, scan, sensitive=True)
        outbox.enqueue(session, "ocr", payload_ref=ref)
        outbox.enqueue(session, "thumbnail", payload_ref=ref)   # shares it

The handler reads the content as ``job.payload``. The jobs table holds only the
reference, so its rows stay narrow however large the input. No operator surface
(``jobctl``, the HTTP API, the dashboard) ever shows an input's content: only that
the job runs on a stored input, its size, whether it is sensitive and whether it
was redacted. :func:`redact_input` erases one for good (an erasure request),
leaving every job and its history as they were; a job that has not started yet
then fails with INPUT_REDACTED instead of running on nothing. Retention
(``relay --keep-finished``) deletes an input once no job names it and it is older
than that. Nothing here commits.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hybrid_jobs.outbox.enqueue import psycopg_connection
from hybrid_jobs.outbox.ids import actor
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.outbox.validation import (
    JsonDefault,
    encode_input,
    input_id_arg,
    max_input_bytes,
    new_job_id,
)
from hybrid_jobs.schema import names
from hybrid_jobs.schema.queries import INPUT_GET, INPUT_REDACT, INPUT_STORE

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

# The longest reason a redaction records.
MAX_REDACTION_REASON_LENGTH = 1000


class InputNotFound(LookupError):
    """No stored input has this id (never stored, rolled back, or deleted by
    retention once no job named it)."""

    def __init__(self, input_id: uuid.UUID) -> None:
        super().__init__(
            f"no stored input {input_id}: it was never stored, its transaction rolled"
            " back, or retention deleted it once no job named it"
        )
        self.input_id = input_id


@dataclass(frozen=True)
class StoredInput:
    """What may be shown of a stored input: everything but its content."""

    input_id: uuid.UUID
    size_bytes: int
    sensitive: bool
    created_at: datetime
    redacted_at: datetime | None
    redacted_by: str | None
    redaction_reason: str | None
    # Jobs that name it, and those of them not finished yet (each counted up to
    # 10000).
    jobs: int
    unfinished: int

    @property
    def redacted(self) -> bool:
        return self.redacted_at is not None


def store_input(
    session: Session,
    content: Any,
    *,
    sensitive: bool = False,
    json_default: JsonDefault | None = None,
) -> uuid.UUID:
    """Store ``content`` (any JSON value, checked as a payload is, up to
    ``$MAX_INPUT_BYTES``, 16 MiB by default) through the session's transaction, and
    return its id for ``enqueue(..., payload_ref=)``, in this transaction or a later
    one. ``sensitive`` marks it for the operator surfaces (which never show an
    input's content in any case). A rolled-back transaction leaves no input behind;
    one no job names is deleted by retention once older than ``relay
    --keep-finished``. Raises ``TypeError``/``ValueError`` before writing anything."""
    if not isinstance(sensitive, bool):
        raise TypeError(f"sensitive must be a bool, not {type(sensitive).__name__}")
    encoded = encode_input(content, max_input_bytes(), json_default)
    input_id = new_job_id()
    params = {
        "input_id": input_id,
        "content": encoded,
        "size_bytes": len(encoded.encode("utf-8")),
        "sensitive": sensitive,
    }
    psycopg_connection(session).exec_driver_sql(INPUT_STORE, params)
    return input_id


def stored_input(session: Session, input_id: uuid.UUID | str) -> StoredInput:
    """What may be shown of a stored input (never its content);
    :class:`InputNotFound` for an unknown id."""
    ref = input_id_arg(input_id, "input_id")
    row = psycopg_connection(session).exec_driver_sql(INPUT_GET, {"input_id": ref}).first()
    if row is None:
        raise InputNotFound(ref)
    return StoredInput(*row)


def redact_input(
    session: Session, input_id: uuid.UUID | str, *, reason: str, by: str | None = None
) -> StoredInput:
    """Erase a stored input's content for good, through the session's transaction
    (an erasure request, say), recording when, ``by`` whom (else the database role)
    and why. The jobs naming it and their history are left as they were: one that has
    not started fails at its claim with INPUT_REDACTED, which ``outbox.explain``
    shows as its last error; one running already has read the content. Redacting
    it again changes nothing. Returns the input as it is now;
    :class:`InputNotFound` for an unknown id."""
    ref = input_id_arg(input_id, "input_id")
    reason = names.text("reason", reason, MAX_REDACTION_REASON_LENGTH)
    conn = psycopg_connection(session)
    conn.exec_driver_sql(INPUT_REDACT, {"input_id": ref, "by": actor(by), "reason": reason})
    return stored_input(session, ref)


store_input_async = async_twin(store_input)
stored_input_async = async_twin(stored_input)
redact_input_async = async_twin(redact_input)
