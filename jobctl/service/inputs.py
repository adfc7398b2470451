"""Stored inputs (``outbox.store_input``): what an operator may see of one, and its
redaction. No function here returns an input's content."""

from __future__ import annotations

import dataclasses
import uuid

from sqlalchemy.ext.asyncio import AsyncSession

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.service.errors import NotFound, invalid_argument
from hybrid_jobs.jobctl.service.models import InputView
from hybrid_jobs.jobctl.service.sql import fetch_one
from hybrid_jobs.schema.queries import INPUT_OF_JOB


def _view(stored: outbox.StoredInput) -> InputView:
    return InputView(**{f.name: getattr(stored, f.name) for f in dataclasses.fields(InputView)})


def parse_input_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value.strip())
    except ValueError:
        message = f"not an input id: {value[:100]!r}"
        raise invalid_argument(ValueError(message), "input_id") from None


async def get_input(session: AsyncSession, input_id: uuid.UUID) -> InputView:
    """What may be shown of a stored input; NotFound for an unknown id."""
    try:
        return _view(await outbox.stored_input_async(session, input_id))
    except outbox.InputNotFound as exc:
        raise NotFound(str(exc)) from None


async def job_input(session: AsyncSession, job_id: uuid.UUID) -> InputView | None:
    """What may be shown of the stored input a job runs on; None for a job that
    carries its payload."""
    row = await fetch_one(session, INPUT_OF_JOB, {"job_id": job_id})
    return None if row is None else InputView(*row)


async def redact_input(
    session: AsyncSession, input_id: uuid.UUID, *, reason: str, by: str | None = None
) -> InputView:
    """Erase a stored input's content for good (outbox.redact_input): the jobs
    naming it and their history stay; one not started fails INPUT_REDACTED.
    Redacting it again changes nothing. NotFound for an unknown id, Invalid for a
    reason that is empty or too long."""
    try:
        stored = await outbox.redact_input_async(session, input_id, reason=reason, by=by)
    except outbox.InputNotFound as exc:
        raise NotFound(str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise invalid_argument(exc, "reason") from None
    return _view(stored)
