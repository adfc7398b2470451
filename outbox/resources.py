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

What was found at the target is about one holder: name the one you saw
(``job_id=``, from :func:`resource_holds`) and only its hold is resolved, never a
later holder's (:class:`HeldByAnother`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from hybrid_jobs.outbox.enqueue import psycopg_connection
from hybrid_jobs.outbox.ids import actor, job_id_arg
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.schema import names
from hybrid_jobs.schema.queries import RESOURCE_HOLD_LIST, RESOURCE_RESOLVE
from hybrid_jobs.schema.states import JobState

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session

MAX_OUTCOME_LENGTH = 2000


class NotUncertain(Exception):
    """The resource is not uncertain: free, or held by a live lease (``job_id``),
    which is that lease's to release."""

    def __init__(self, resource: str, job_id: uuid.UUID | None) -> None:
        why = "is free" if job_id is None else f"is held by the live lease of job {job_id}"
        super().__init__(f"resource {resource!r} is not uncertain: it {why}")
        self.resource = resource
        self.job_id = job_id


class HeldByAnother(NotUncertain):
    """The resource is not the hold the caller named (``named_job_id``, and
    ``named_generation`` if given): that one was resolved meanwhile, and the resource
    is held now by the lease ``job_id``, ``lease_generation`` (uncertain since
    ``uncertain_since``, or None: a live lease). Nothing changed: what was found at
    the target was about the earlier holder, so look again. A :class:`NotUncertain`,
    so code that catches that one catches this one too."""

    def __init__(
        self,
        resource: str,
        hold: ResourceHold,
        named_job_id: uuid.UUID,
        named_generation: int | None,
    ) -> None:
        named = f"job {named_job_id}" + (
            "" if named_generation is None else f" (lease generation {named_generation})"
        )
        now = (
            "by its live lease"
            if hold.uncertain_since is None
            else f"uncertain since {hold.uncertain_since.isoformat()}"
        )
        Exception.__init__(
            self,
            f"resource {resource!r} is not the hold of {named}, as named: it is held by job"
            f" {hold.job_id} (lease generation {hold.lease_generation}), {now}; nothing"
            " changed: look at the target again",
        )
        self.resource = resource
        self.job_id = hold.job_id
        self.lease_generation = hold.lease_generation
        self.uncertain_since = hold.uncertain_since
        self.named_job_id = named_job_id
        self.named_generation = named_generation


@dataclass(frozen=True)
class Resolved:
    """What :func:`resolve_resource` freed: the job whose expired lease had left the
    resource uncertain, since when, and that lease's generation."""

    resource: str
    job_id: uuid.UUID
    uncertain_since: datetime
    lease_generation: int


@dataclass(frozen=True)
class ResourceHold:
    """A resource held now: by ``job_id`` (its state and type), since
    ``held_since``; ``uncertain_since`` set when that job's lease expired, and
    ``waiting`` jobs of the resource behind it. ``state`` and ``job_type`` are None
    once retention has deleted the job: its hold stays, uncertain, until resolved.
    ``lease_generation``: the holder's lease, the fence :func:`resolve_resource`
    takes."""

    resource: str
    job_id: uuid.UUID
    state: JobState | None
    job_type: str | None
    held_since: datetime
    uncertain_since: datetime | None
    waiting: int
    lease_generation: int

    @property
    def uncertain(self) -> bool:
        return self.uncertain_since is not None


def resolve_resource(
    session: Session,
    resource: str,
    *,
    by: str | None = None,
    outcome: str | None = None,
    job_id: uuid.UUID | str | None = None,
    lease_generation: int | None = None,
) -> Resolved:
    """Free a resource an expired lease left uncertain, once someone has looked at
    the target: ``by`` who (else the database role and application_name) and, if
    given, ``outcome`` what they found, recorded with the time; the resource's next
    waiting job is woken when the caller commits. Raises :class:`NotUncertain`
    (nothing changed) for a resource that is free or held by a live lease.

    What was found is about one holder. ``job_id`` (and, to tell one lease of it
    from its retry's, ``lease_generation``) names the holder the caller saw, as
    :func:`resource_holds` lists it: only that hold is resolved, in one statement;
    if it was resolved meanwhile and the resource is another lease's now, this
    raises :class:`HeldByAnother` (a :class:`NotUncertain`) and changes nothing.
    Without ``job_id`` (as before it existed) the statement frees the uncertain hold
    as it is at that moment, whoever's, and the :class:`Resolved` it returns says
    whose (job and generation): name the holder whenever you looked at the target
    some time ago."""
    name = names.resource(resource)
    said = None if outcome is None else names.text("outcome", outcome, MAX_OUTCOME_LENGTH)
    holder = None if job_id is None else job_id_arg(job_id)
    if lease_generation is not None:
        if holder is None:
            raise ValueError("lease_generation names a lease of job_id: give job_id too")
        if (
            not isinstance(lease_generation, int)
            or isinstance(lease_generation, bool)
            or lease_generation < 0
        ):
            raise ValueError("lease_generation must be an int >= 0")
    conn = psycopg_connection(session)
    row = conn.exec_driver_sql(
        RESOURCE_RESOLVE,
        {
            "resource": name,
            "job_id": holder,
            "lease_generation": lease_generation,
            "by": actor(by),
            "outcome": said,
        },
    ).first()
    if row is None:
        now = next((h for h in _holds(conn) if h.resource == name), None)
        if (
            now is not None
            and holder is not None
            and (now.job_id, now.lease_generation)
            != (holder, now.lease_generation if lease_generation is None else lease_generation)
        ):
            raise HeldByAnother(name, now, holder, lease_generation)
        raise NotUncertain(name, None if now is None else now.job_id)
    return Resolved(name, row[0], row[1], row[2])


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
            lease_generation=r[7],
        )
        for r in conn.exec_driver_sql(RESOURCE_HOLD_LIST).all()
    ]


resolve_resource_async = async_twin(resolve_resource)
resource_holds_async = async_twin(resource_holds)
