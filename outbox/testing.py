"""Test helpers for producers: what did this transaction enqueue?

In your own test suite, against your real database::

    from hybrid_jobs.outbox.testing import assert_enqueued, enqueued

    with Session(engine) as session, session.begin():
        place_order(session, ...)               # your code, which calls outbox.enqueue
        assert_enqueued(session, "send_receipt", payload={"order_id": 42})
        assert len(enqueued(session, job_type="send_receipt")) == 1

The jobs a transaction enqueued are the rows it inserted, seen through the same
session before (or without) committing. They are told apart by their creation
time, which is the transaction's start (``now()``): savepoints, which test fixtures
often use, do not change it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from hybrid_jobs.outbox.enqueue import psycopg_connection

_MINE = """
SELECT job_id, job_type, queue, tenant, payload, priority, dedup_key, max_attempts,
       run_after, state
FROM jobs
WHERE created_at = now()
ORDER BY job_id
"""


@dataclass(frozen=True)
class EnqueuedJob:
    job_id: uuid.UUID
    job_type: str
    queue: str
    tenant: str | None
    payload: Any
    priority: int
    dedup_key: str | None
    max_attempts: int | None
    run_after: datetime
    state: str


def enqueued(session: Session, *, job_type: str | None = None) -> list[EnqueuedJob]:
    """The jobs the session's current transaction enqueued, oldest first."""
    conn = psycopg_connection(session)
    jobs = [EnqueuedJob(*row) for row in conn.exec_driver_sql(_MINE).all()]
    return [j for j in jobs if job_type is None or j.job_type == job_type]


def assert_enqueued(
    session: Session, job_type: str, *, payload: Any = None, **expected: Any
) -> EnqueuedJob:
    """Assert that the current transaction enqueued a ``job_type`` job whose payload
    contains ``payload`` (a dict: these keys with these values; anything else:
    equal) and whose other fields equal ``expected`` (queue=, tenant=, priority=...).
    Returns it; the assertion message lists what was enqueued instead."""
    unknown = set(expected) - set(EnqueuedJob.__dataclass_fields__)
    if unknown:
        raise TypeError(f"assert_enqueued: no such job field: {', '.join(sorted(unknown))}")
    jobs = enqueued(session)
    for job in jobs:
        if job.job_type != job_type or not _matches(job.payload, payload):
            continue
        if all(getattr(job, name) == value for name, value in expected.items()):
            return job
    seen = "\n".join(
        f"  {j.job_type} {j.payload!r} queue={j.queue} tenant={j.tenant}" for j in jobs
    )
    want = f"{job_type} {payload!r} {expected or ''}".rstrip()
    raise AssertionError(
        f"no {want} was enqueued in this transaction; it enqueued:\n{seen or '  nothing'}"
    )


def _matches(actual: Any, wanted: Any) -> bool:
    if wanted is None:
        return True
    if isinstance(wanted, dict) and isinstance(actual, dict):
        return all(k in actual and actual[k] == v for k, v in wanted.items())
    return bool(actual == wanted)
