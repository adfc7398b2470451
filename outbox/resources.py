"""Exclusive resources: resolving one a vanished holder left uncertain, and what is
held now, inside the caller's SQLAlchemy transaction.

::

    outbox.enqueue(session, "deploy", {"sha": sha}, resource="deploy:prod")
    # ... its consumer is killed mid-deploy: the lease expires, the job goes to
    # RETRY_WAIT, and deploy:prod stays held, UNCERTAIN: nothing of it starts ...
    with Session(engine) as session, session.begin():
        outbox.resolve_resource(session, "deploy:prod", by="alice")
    # freed at commit, and its next waiting job (the retry, or another) woken

A clean end of a lease (any outcome, a give-back, an acknowledged cancel) frees the
resource in the statement that records it; only an expired lease leaves it held,
since nobody knows what the vanished holder did to the target.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from hybrid_jobs.outbox.enqueue import psycopg_connection
from hybrid_jobs.outbox.ids import actor
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.schema import names
from hybrid_jobs.schema.queries import RESOURCE_HOLD_LIST, RESOURCE_RESOLVE
from hybrid_jobs.schema.states import JobState

MAX_OUTCOME_LENGTH = 2000


class NotUncertain(Exception):
    """The resource is not uncertain: free, or held by a live lease (``job_id``),
    which is that lease's to release."""

    def __init__(self, resource: str, job_id: uuid.UUID | None) -> None:
        why = "is free" if job_id is None else f"is held by the live lease of job {job_id}"
        super().__init__(f"resource {resource!r} is not uncertain: it {why}")
        self.resource = resource
        self.job_id = job_id


@dataclass(frozen=True)
class Resolved:
    """What :func:`resolve_resource` freed: the job whose expired lease had left the
    resource uncertain, and since when."""

    resource: str
    job_id: uuid.UUID
    uncertain_since: datetime


@dataclass(frozen=True)
class ResourceHold:
    """A resource held now: by ``job_id`` (its state and type), since
    ``held_since``; ``uncertain_since`` set when that job's lease expired, and
    ``waiting`` jobs of the resource behind it."""

    resource: str
    job_id: uuid.UUID
    state: JobState | None
    job_type: str | None
    held_since: datetime
    uncertain_since: datetime | None
    waiting: int

    @property
    def uncertain(self) -> bool:
        return self.uncertain_since is not None


def resolve_resource(
    session: Session, resource: str, *, by: str | None = None, outcome: str | None = None
) -> Resolved:
    """Free a resource an expired lease left uncertain, once someone has looked at
    the target: ``by`` who (else the database role and application_name) and, if
    given, ``outcome`` what they found, recorded with the time; the resource's next
    waiting job is woken when the caller commits. Raises :class:`NotUncertain`
    (nothing changed) for a resource that is free or held by a live lease."""
    name = names.resource(resource)
    said = None if outcome is None else names.text("outcome", outcome, MAX_OUTCOME_LENGTH)
    conn = psycopg_connection(session)
    row = conn.exec_driver_sql(
        RESOURCE_RESOLVE, {"resource": name, "by": actor(by), "outcome": said}
    ).first()
    if row is None:
        holder = next((h.job_id for h in _holds(conn) if h.resource == name), None)
        raise NotUncertain(name, holder)
    return Resolved(name, row[0], row[1])


def resource_holds(session: Session) -> list[ResourceHold]:
    """The resources held now, uncertain ones first (oldest first)."""
    conn = psycopg_connection(session)
    return _holds(conn)


def _holds(conn: Connection) -> list[ResourceHold]:
    return [
        ResourceHold(
            resource=r[0],
            job_id=r[1],
            state=None if r[2] is None else JobState(r[2]),
            job_type=r[3],
            held_since=r[4],
            uncertain_since=r[5],
            waiting=r[6],
        )
        for r in conn.exec_driver_sql(RESOURCE_HOLD_LIST).all()
    ]


resolve_resource_async = async_twin(resolve_resource)
resource_holds_async = async_twin(resource_holds)
