"""Enqueue hooks: functions that see each job an enqueue is about to write.

::

    from hybrid_jobs import outbox

    @outbox.hooks.add
    def stamp_request_id(session, job):
        return dataclasses.replace(job, meta={**(job.meta or {}), "request_id": current()})

A hook is a plain function of the session and one :class:`~outbox.NewJob`. It runs
inside the producer's transaction, before the job is checked and written, and
returns the job to write: a changed copy (``dataclasses.replace``), or None to leave
it as it was. It may write rows of its own through the session; they commit, or
roll back, with the job. ``enqueue``, ``enqueue_many``, their async twins and a
handler's ``fn.enqueue`` all run the hooks; an ``AsyncSession``'s hooks get the
``Session`` it wraps (SQLAlchemy runs them inside the async session's transaction).
The jobs a schedule makes (fired by the relay, or by ``trigger_schedule``) pass no
hook.

Hooks run in the order they were added, each on the job the one before returned.
A hook that raises stops nothing but its own call: it is logged
(``outbox.hook_failed``, naming the hook and the job type) and the job goes on as
that hook got it. The exception: a hook whose own statement failed has aborted the
transaction, in which nothing more can be written; its error is raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg.pq import TransactionStatus

from hybrid_jobs.outbox.validation import NewJob

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

log = logging.getLogger("outbox.hooks")

EnqueueHook = Callable[["Session", NewJob], "NewJob | None"]
H = TypeVar("H", bound=EnqueueHook)

_hooks: list[EnqueueHook] = []


def add(hook: H) -> H:
    """Run ``hook`` on every job this process enqueues, after the hooks added
    before it. Returns the hook, so it can be used as a decorator."""
    if not callable(hook):
        raise TypeError(f"an enqueue hook is a function of (session, job), not {hook!r}")
    _hooks.append(hook)
    return hook


def remove(hook: EnqueueHook) -> None:
    """Stop running ``hook`` (ValueError if it was not added)."""
    _hooks.remove(hook)


def registered() -> tuple[EnqueueHook, ...]:
    """The hooks, in the order they run."""
    return tuple(_hooks)


def name(hook: Callable[..., Any]) -> str:
    """How a log line names a hook: its module and qualified name."""
    qualname = getattr(hook, "__qualname__", None) or type(hook).__qualname__
    return f"{getattr(hook, '__module__', None) or '?'}.{qualname}"


def apply(session: Session, jobs: Iterable[Any]) -> list[Any]:
    """Every job as the hooks leave it. Items that are not NewJobs pass untouched:
    enqueue refuses them itself."""
    batch = list(jobs)
    hooks = tuple(_hooks)
    if not hooks:
        return batch
    return [_through(hooks, session, job) if isinstance(job, NewJob) else job for job in batch]


def _through(hooks: tuple[EnqueueHook, ...], session: Session, job: NewJob) -> NewJob:
    for hook in hooks:
        try:
            changed = hook(session, job)
        except Exception as exc:
            if _aborted(session):
                raise
            _failed(hook, job, exc)
            continue
        if changed is None:
            continue
        if not isinstance(changed, NewJob):
            problem = TypeError(f"returned {type(changed).__name__}, not a NewJob or None")
            _failed(hook, job, problem)
            continue
        job = changed
    return job


def _aborted(session: Session) -> bool:
    """The session's transaction failed in the database (a hook's statement did):
    nothing more can be written in it. Asked of the driver, not the server."""
    if not session.in_transaction():
        return False
    driver = session.connection().connection.driver_connection
    status = getattr(getattr(driver, "info", None), "transaction_status", None)
    return status == TransactionStatus.INERROR


def _failed(hook: EnqueueHook, job: NewJob, exc: Exception) -> None:
    log.warning(
        "outbox.hook_failed",
        exc_info=exc,
        extra={
            "hook": name(hook),
            "job_type": job.job_type,
            "action": "the job is enqueued as if this hook were absent",
        },
    )
