"""Completion webhooks, the producer's side: a URL a job is enqueued with.

``outbox.enqueue(..., on_complete_url="https://...")`` stores the URL on the job; when
the job ends (SUCCEEDED, FAILED or CANCELLED, whichever statement ends it) the
transaction that ends it also records a call owed to that URL, which a relay
delivers, signed, at least once (docs/guides/webhooks.md). A job without one is
written by the same statements as before: only a batch with such a job runs the
statement here.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

import yarl

from hybrid_jobs.schema.queries import JOB_WEBHOOK_SET_MANY
from hybrid_jobs.schema.tables import MAX_WEBHOOK_URL_LENGTH

if TYPE_CHECKING:
    from sqlalchemy import Connection


def webhook_url(value: object, what: str = "on_complete_url") -> str:
    """The URL, checked: text, http or https, with a host, at most
    MAX_WEBHOOK_URL_LENGTH characters, no credentials in it (they would be shown to
    every operator). ``ValueError``/``TypeError`` otherwise, never echoing it whole."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a URL (str), not {type(value).__name__}")
    url = value.strip()
    if len(url) > MAX_WEBHOOK_URL_LENGTH:
        raise ValueError(f"{what} is longer than {MAX_WEBHOOK_URL_LENGTH} characters")
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise ValueError(f"{what} must not contain spaces or control characters")
    try:
        parsed = yarl.URL(url)
    except ValueError:
        raise ValueError(f"{what} is not a valid URL") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"{what} must be an http:// or https:// URL with a host")
    if parsed.user is not None or parsed.password is not None:
        raise ValueError(
            f"{what} must not carry credentials: the receiver checks the signature instead"
        )
    # yarl read the scheme case-blind; the URL is stored with it in lower case, as
    # the relay and the tables' checks expect it
    return parsed.scheme + url[len(parsed.scheme) :]


def set_urls(conn: Connection, ids: Sequence[uuid.UUID], urls: Sequence[str | None]) -> None:
    """Store each inserted job's URL (``ids`` and ``urls`` side by side; a job
    without one, or a duplicate whose insert was skipped, has None)."""
    rows = [
        {"job_id": str(job_id), "url": url}
        for job_id, url in zip(ids, urls, strict=True)
        if url is not None
    ]
    if rows:
        conn.exec_driver_sql(JOB_WEBHOOK_SET_MANY, {"webhooks": json.dumps(rows)})
