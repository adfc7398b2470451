"""Completion webhooks' calls, for operators: what was owed, how it went, and a
second chance for one that was given up."""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncSession

from hybrid_jobs.jobctl.service.errors import Invalid, NotFound
from hybrid_jobs.jobctl.service.models import WebhookCallView
from hybrid_jobs.jobctl.service.sql import fetch_all, fetch_one
from hybrid_jobs.schema.queries import WEBHOOK_DELIVERY_LIST, WEBHOOK_DELIVERY_RETRY

WEBHOOK_STATES = ("PENDING", "DELIVERED", "GAVE_UP")
DEFAULT_WEBHOOK_LIMIT = 50
MAX_WEBHOOK_LIMIT = 1000


async def list_webhook_calls(
    session: AsyncSession,
    *,
    state: str | None = None,
    job_id: uuid.UUID | None = None,
    limit: int = DEFAULT_WEBHOOK_LIMIT,
) -> list[WebhookCallView]:
    """The newest calls first, of one state and/or one job. Reads only. Invalid for
    an unknown state or a limit out of 1..MAX_WEBHOOK_LIMIT."""
    if state is not None and state.upper() not in WEBHOOK_STATES:
        raise Invalid(f"state must be one of {', '.join(WEBHOOK_STATES)}", "state")
    if not 1 <= limit <= MAX_WEBHOOK_LIMIT:
        raise Invalid(f"limit must be from 1 to {MAX_WEBHOOK_LIMIT}", "limit")
    rows = await fetch_all(
        session,
        WEBHOOK_DELIVERY_LIST,
        {
            "state": state.upper() if state else None,
            "job_id": job_id,
            "delivery_id": None,
            "limit": limit,
        },
    )
    # WEBHOOK_DELIVERY_LIST's columns are WebhookCallView's fields in order.
    return [WebhookCallView(*row) for row in rows]


async def retry_webhook_call(session: AsyncSession, delivery_id: int) -> WebhookCallView:
    """Make a GAVE_UP call due again now, its attempts counted afresh (the endpoint
    is fixed, say). NotFound for an unknown id, Invalid for one not GAVE_UP."""
    row = await fetch_one(session, WEBHOOK_DELIVERY_RETRY, {"delivery_id": delivery_id})
    found = await _get(session, delivery_id)
    if found is None:
        raise NotFound(f"no webhook call {delivery_id} (retention deletes settled ones)")
    if row is None:
        raise Invalid(f"webhook call {delivery_id} is {found.state}: only GAVE_UP is retried")
    return found


async def _get(session: AsyncSession, delivery_id: int) -> WebhookCallView | None:
    row = await fetch_one(
        session,
        WEBHOOK_DELIVERY_LIST,
        {"state": None, "job_id": None, "delivery_id": delivery_id, "limit": 1},
    )
    return None if row is None else WebhookCallView(*row)
