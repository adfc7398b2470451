"""Enqueue jobs inside the caller's SQLAlchemy transaction.

The job row and its wake-up (an outbox row) are written through the caller's
connection and commit, or roll back, with the caller's own rows. Nothing here
commits. The relay hears about new wake-ups through a NOTIFY that PostgreSQL sends
only when the transaction commits.

The statements are psycopg-style SQL from :mod:`schema.queries`, run with
``exec_driver_sql``, so the session must use the psycopg 3 driver
(``postgresql+psycopg://``), synchronous or asynchronous.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from hybrid_jobs.outbox import backpressure, bulk, hooks, known_types, webhooks
from hybrid_jobs.outbox.twin import async_twin
from hybrid_jobs.outbox.validation import (
    JsonDefault,
    NewJob,
    max_payload_bytes,
    new_job_ids,
    parent_ids,
    to_row,
    unique_fields,
)
from hybrid_jobs.plumbing import tracing
from hybrid_jobs.schema.queries import (
    INPUT_LOCK,
    JOB_DEBOUNCE_MANY,
    JOB_FIND_BY_DEDUP_MANY,
    JOB_FIND_BY_UNIQUE_MANY,
    JOB_INSERT_MANY,
    JOB_INSERT_PLAIN_MANY,
    JOB_INSERT_REF_MANY,
    JOB_INSERT_UNIQUE_MANY,
    JOB_INSERT_UNIQUE_REF_MANY,
    JOB_KEYS_LOCK,
    JOB_PARENTS_LOCK,
    JOB_TAGS_PRUNE,
)
from hybrid_jobs.schema.states import JobState

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection
    from sqlalchemy.orm import Session

# A parent in one of these counts as done for a child, whatever it asked for.
_SETTLED_FOR = {
    "cancel": {JobState.SUCCEEDED},
    "run": {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED},
}
_ENDED_BADLY = {JobState.FAILED, JobState.CANCELLED}


@dataclass(frozen=True)
class _Plan:
    rows: list[str]
    keys: list[tuple[str, str | None]]  # (job_type, dedup_key) per job, in order
    tenants: Counter[str]  # jobs per tenant, for backpressure
    # Debounced jobs, by (job_type, dedup_key): the last of a batch wins.
    debounced: dict[tuple[str, str], str]
    ordered_keys: list[str]  # keys of ordered jobs, to lock before numbering them
    # Whether a job of the batch has tags or parents: else the shorter insert does.
    tagged_or_after: bool = False
    # The jobs whose dedup_key has a scope (unique=), by position: the row, and its
    # key as JOB_FIND_BY_UNIQUE_MANY looks it up.
    scoped: dict[int, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    # The stored inputs the batch's jobs name (payload_ref=), each once.
    refs: list[uuid.UUID] = field(default_factory=list)

    @property
    def document(self) -> str:
        return "[" + ",".join(self.rows) + "]"

    @property
    def debounce_document(self) -> str | None:
        return "[" + ",".join(self.debounced.values()) + "]" if self.debounced else None

    def lookup_document(
        self, inserted: set[uuid.UUID], ids: list[uuid.UUID], debounced: Sequence[Any] = ()
    ) -> str | None:
        """The (job_type, dedup_key) pairs whose insert was skipped as a duplicate."""
        found = {(row[0], row[1]) for row in debounced}
        wanted = [
            {"job_type": t, "dedup_key": k}
            for n, ((t, k), job_id) in enumerate(zip(self.keys, ids, strict=True))
            if job_id not in inserted and (t, k) not in found and n not in self.scoped
        ]
        return json.dumps(wanted, ensure_ascii=False) if wanted else None


def _plan(
    jobs: Sequence[NewJob], limit: int, parents: dict[uuid.UUID, JobState] | None = None
) -> tuple[_Plan, list[uuid.UUID]]:
    rows: list[str] = []
    keys: list[tuple[str, str | None]] = []
    ids: list[uuid.UUID] = []
    tenants: list[str | None] = []
    debounced: dict[tuple[str, str], str] = {}
    ordered_keys: set[str] = set()
    tagged_or_after = False
    scoped: dict[int, tuple[str, dict[str, Any]]] = {}
    refs: set[uuid.UUID] = set()
    # The enqueuing code's span, once for the batch: every job of it was made there.
    trace_context = tracing.capture()
    for job, new_id in zip(jobs, new_job_ids(len(jobs)), strict=True):
        if not isinstance(job, NewJob):
            raise TypeError(f"enqueue_many takes NewJob items, not {type(job).__name__}")
        edges = _edges(job, parents or {})
        job_id, row = to_row(job, limit, trace_context, edges, new_id)
        tagged_or_after = tagged_or_after or bool(edges) or bool(job.tags)
        if job.debounce is not None and job.dedup_key is not None:
            debounced.pop((job.job_type, job.dedup_key), None)
            debounced[(job.job_type, job.dedup_key)] = row
        else:
            rows.append(row)
        if job.unique != "forever":
            lookup = {"n": len(ids), "job_type": job.job_type, "unique_key": job.dedup_key}
            scoped[len(ids)] = (row, lookup | {"unique_seconds": unique_fields(job)[1]})
        keys.append((job.job_type, job.dedup_key))
        ids.append(job_id)
        tenants.append(job.tenant)
        if job.ordered and job.key is not None:
            ordered_keys.add(job.key)
        if job.payload_ref is not None:
            refs.add(uuid.UUID(str(job.payload_ref)))  # checked by to_row
    plan = _Plan(
        rows,
        keys,
        backpressure.tenants_of(tenants),
        debounced,
        sorted(ordered_keys),
        tagged_or_after,
        scoped,
        sorted(refs),
    )
    return plan, ids


def _edges(job: NewJob, states: dict[uuid.UUID, JobState]) -> list[dict[str, Any]] | None:
    """The job's edges to its parents, each done already if the parent's state
    settles it. Refuses a parent that does not exist, and one that ended FAILED or
    CANCELLED for a job that would be cancelled for it at once."""
    ids = parent_ids(job)
    if not ids:
        return None
    edges: list[dict[str, Any]] = []
    for position, parent in enumerate(ids):
        state = states.get(parent)
        if state is None:
            raise ValueError(f"after names job {parent}, which does not exist")
        if state in _ENDED_BADLY and job.on_parent_failure == "cancel":
            raise ValueError(
                f"after names job {parent}, which ended {state}: with"
                " on_parent_failure='cancel' the job could never run (replay the"
                " parent first, or pass on_parent_failure='run')"
            )
        done = state in _SETTLED_FOR[job.on_parent_failure]
        edges.append({"parent_id": str(parent), "position": position, "done": done})
    return edges


def _lock_parents(conn: Connection, jobs: list[NewJob]) -> dict[uuid.UUID, JobState]:
    """Locks every parent the batch names and returns its state (none named: {}).

    No cycle can be written: a job's id is made by enqueue, so ``after`` can name
    only jobs that exist already (committed, or enqueued earlier in this
    transaction), never one of its own batch, and no existing job can wait for a
    job that did not exist when it was enqueued. Every edge points from a newer job
    to an older one."""
    wanted = sorted({parent for job in jobs for parent in parent_ids(job)})
    if not wanted:
        return {}
    found = conn.exec_driver_sql(JOB_PARENTS_LOCK, {"ids": wanted}).all()
    return {row[0]: JobState(row[1]) for row in found}


def _lock_inputs(conn: Connection, refs: list[uuid.UUID]) -> None:
    """Locks the stored inputs the batch names (INPUT_LOCK); refuses one that does
    not exist or was redacted (ValueError), before anything is written."""
    found = {row[0]: row[1] for row in conn.exec_driver_sql(INPUT_LOCK, {"input_ids": refs})}
    for ref in refs:
        if ref not in found:
            raise ValueError(
                f"payload_ref names input {ref}, which does not exist (never stored, its"
                " transaction rolled back, or retention deleted it once no job named it)"
            )
        if found[ref] is not None:
            raise ValueError(
                f"payload_ref names input {ref}, which was redacted at {found[ref].isoformat()}:"
                " a job could only fail on it"
            )


def _resolve(
    plan: _Plan,
    ids: list[uuid.UUID],
    inserted: set[uuid.UUID],
    found: Sequence[Any],
    debounced_rows: Sequence[Any] = (),
    held: Mapping[int, uuid.UUID] | None = None,
) -> list[uuid.UUID]:
    debounced = {(row[0], row[1]): row[2] for row in debounced_rows}
    if len(debounced) < len(plan.debounced):
        # The job holding the key started between the conflict and the update.
        raise RuntimeError("a debounced job started while it was replaced; retry the transaction")
    existing = {(row[0], row[1]): row[2] for row in found}
    result: list[uuid.UUID] = []
    for n, ((job_type, dedup_key), job_id) in enumerate(zip(plan.keys, ids, strict=True)):
        if job_id in inserted:
            result.append(job_id)
        elif held and n in held:
            result.append(held[n])
        elif n in plan.scoped:
            raise RuntimeError(
                f"dedup_key {dedup_key!r} for {job_type!r} was held and freed again"
                f" {_UNIQUE_ROUNDS + 1} times while this job was enqueued; retry the transaction"
            )
        elif dedup_key is not None and (job_type, dedup_key) in debounced:
            result.append(debounced[(job_type, dedup_key)])
        elif (job_type, dedup_key) in existing:
            result.append(existing[(job_type, dedup_key)])
        else:
            # The winner of a dedup race was deleted, or rolled back after we looked.
            raise RuntimeError(
                f"dedup_key {dedup_key!r} for {job_type!r} conflicted but no job holds it; "
                "retry the transaction"
            )
    return result


def check_driver(conn: Connection | AsyncConnection) -> None:
    if conn.dialect.driver != "psycopg":
        raise TypeError(
            "outbox.enqueue needs a session on the psycopg 3 driver "
            f"(postgresql+psycopg://), not {conn.dialect.name}+{conn.dialect.driver}"
        )


def psycopg_connection(session: Session) -> Connection:
    """The session's connection, refused (TypeError) unless it is on psycopg 3."""
    conn = session.connection()
    check_driver(conn)
    return conn


def enqueue_many(session: Session, jobs: Iterable[NewJob]) -> list[uuid.UUID]:
    """Enqueue several jobs in one statement (a large batch of plain jobs: by COPY,
    :mod:`outbox.bulk`); returns their ids in the given order.

    A job whose ``dedup_key`` is already taken for its job type is not inserted; its
    place in the result holds the existing job's id. In strict mode
    (:func:`outbox.require_known_job_types`) a job type no handler of this process
    knows is refused (``ValueError``) before anything is written. The enqueue hooks
    (:mod:`outbox.hooks`) see each job first, and what they return is written.
    """
    batch = hooks.apply(session, jobs)
    # These two here and not in insert_jobs: the relay fires schedules through that,
    # and it imports neither handlers nor the producer's hooks.
    known_types.refuse_unknown(getattr(job, "job_type", None) for job in batch)
    return insert_jobs(session, batch, max_payload_bytes())


def insert_jobs(session: Session, jobs: Iterable[NewJob], payload_limit: int) -> list[uuid.UUID]:
    """:func:`enqueue_many` with the payload limit given: a schedule's job was
    checked against the limit when the schedule was written, and must not become
    unenqueueable because a process has a smaller one."""
    batch = list(jobs)
    urls = _webhook_urls(batch)
    if bulk.copyable(batch) and bulk.in_transaction(conn := psycopg_connection(session)):
        result = bulk.copy_jobs(conn, batch, payload_limit)
        if urls is not None:
            webhooks.set_urls(conn, result, urls)
        return result
    if not any(isinstance(job, NewJob) and job.after for job in batch):
        plan, ids = _plan(batch, payload_limit)
        if not ids:
            return []
        conn = psycopg_connection(session)
    else:
        # Checked before anything is written; the lock below marks the parents only.
        for job in batch:
            if isinstance(job, NewJob):
                parent_ids(job)
        conn = psycopg_connection(session)
        plan, ids = _plan(batch, payload_limit, _lock_parents(conn, batch))
    backpressure.refuse(conn, plan.tenants)
    if plan.ordered_keys:
        conn.exec_driver_sql(JOB_KEYS_LOCK, {"keys": plan.ordered_keys})
    if plan.refs:
        _lock_inputs(conn, plan.refs)
    if plan.scoped:
        insert = JOB_INSERT_UNIQUE_REF_MANY if plan.refs else JOB_INSERT_UNIQUE_MANY
    elif plan.refs:
        insert = JOB_INSERT_REF_MANY
    else:
        insert = JOB_INSERT_MANY if plan.tagged_or_after else JOB_INSERT_PLAIN_MANY
    inserted = set(conn.exec_driver_sql(insert, {"jobs": plan.document}).scalars())
    held = _holders(conn, plan, ids, inserted, insert) if plan.scoped else {}
    debounced: Sequence[Any] = []
    if plan.debounce_document:
        debounced = conn.exec_driver_sql(JOB_DEBOUNCE_MANY, {"jobs": plan.debounce_document}).all()
        conn.exec_driver_sql(JOB_TAGS_PRUNE, {"ids": [row[2] for row in debounced]})
    lookup = plan.lookup_document(inserted, ids, debounced)
    found = conn.exec_driver_sql(JOB_FIND_BY_DEDUP_MANY, {"keys": lookup}).all() if lookup else []
    result = _resolve(plan, ids, inserted, found, debounced, held)
    if urls is not None:
        # A job inserted, or a debounced one (a repeat replaces what it was given);
        # a duplicate keeps the job that holds its key as it was.
        webhooks.set_urls(
            conn,
            result,
            [
                url if ids[n] in inserted or (job.debounce is not None and job.dedup_key) else None
                for n, (job, url) in enumerate(zip(batch, urls, strict=True))
            ],
        )
    return result


def _webhook_urls(batch: list[NewJob]) -> list[str | None] | None:
    """Each job's on_complete_url, checked before anything is written; None when no
    job of the batch has one (the common case: no statement for it)."""
    if not any(isinstance(job, NewJob) and job.on_complete_url is not None for job in batch):
        return None
    return [
        None if job.on_complete_url is None else webhooks.webhook_url(job.on_complete_url)
        for job in batch
    ]


# How many times a scoped job is inserted again when the key's holder left its scope
# between the insert and the look-up. Each time another transaction's job took the
# key and left its scope within that moment: a few is plenty.
_UNIQUE_ROUNDS = 3


def _holders(
    conn: Connection,
    plan: _Plan,
    ids: list[uuid.UUID],
    inserted: set[uuid.UUID],
    insert: str = JOB_INSERT_UNIQUE_MANY,
) -> dict[int, uuid.UUID]:
    """The job holding each scoped key whose insert was skipped, by position. A key
    whose holder left its scope since the insert met it (a claim, an end) is free:
    that job is inserted again (and added to ``inserted``)."""
    held: dict[int, uuid.UUID] = {}
    wanted = [n for n in plan.scoped if ids[n] not in inserted]
    rounds = 0
    while wanted:
        keys = json.dumps([plan.scoped[n][1] for n in wanted], ensure_ascii=False)
        found = conn.exec_driver_sql(JOB_FIND_BY_UNIQUE_MANY, {"keys": keys}).all()
        held.update({row[0]: row[1] for row in found})
        free = [n for n in wanted if n not in held]
        if not free or rounds == _UNIQUE_ROUNDS:
            break  # (what is still free then, _resolve refuses)
        rounds += 1
        again = "[" + ",".join(plan.scoped[n][0] for n in free) + "]"
        inserted.update(conn.exec_driver_sql(insert, {"jobs": again}).scalars())
        wanted = [n for n in free if ids[n] not in inserted]
    return held


enqueue_many_async = async_twin(enqueue_many)


def enqueue(
    session: Session,
    job_type: str,
    payload: Any = None,
    *,
    queue: str = "default",
    dedup_key: str | None = None,
    run_after: datetime | timedelta | None = None,
    max_attempts: int | None = None,
    priority: int = 0,
    tenant: str | None = None,
    needs_approval: bool = False,
    expires: datetime | timedelta | None = None,
    rate_limit: str | None = None,
    debounce: timedelta | None = None,
    debounce_max: timedelta | None = None,
    key: str | None = None,
    key_limit: int | None = None,
    ordered: bool | str = False,
    after: Sequence[uuid.UUID | str] = (),
    on_parent_failure: str = "cancel",
    resource: str | None = None,
    json_default: JsonDefault | None = None,
    tags: Collection[str] = (),
    meta: Mapping[str, Any] | None = None,
    unique: str | timedelta = "forever",
    payload_ref: uuid.UUID | str | None = None,
    on_complete_url: str | None = None,
    weight: int = 1,
) -> uuid.UUID:
    """Enqueue one job through the session's transaction, without committing.

    ``payload`` is any JSON value: ``None`` is stored as JSON null (the handler gets
    None), and a dict key that is not a string is refused (``TypeError``), where
    ``json.dumps`` would turn it into text. A value JSON cannot hold (a datetime, a
    UUID, a Decimal) is refused (``TypeError``, naming where it is), unless
    ``json_default`` makes JSON of it: a function as ``json.dumps``'s ``default``,
    called with each such value, returning one JSON can hold (or raising
    ``TypeError``). It runs before the size and depth checks, so what is checked
    and stored is plain JSON, and that is what the handler reads.

    Returns the new job's id, or with a ``dedup_key`` already used for ``job_type``,
    the existing job's id (and inserts nothing). ``run_after`` is an aware datetime
    or a timedelta from the database's now. Without ``max_attempts`` the job's
    handler decides (else 5). ``priority``: higher runs first. ``tenant``: whose job
    it is, for caps, fair share and backpressure (None: nobody's, no limit applies).
    ``needs_approval``: it waits (``APPROVAL_REQUIRED``) until :func:`outbox.approve`
    makes it due, or :func:`outbox.reject` cancels it (takes no ``run_after``).

    ``expires``: a deadline (an aware datetime, or a timedelta from now): no
    attempt starts after it; a job still waiting then ends CANCELLED with
    last_error_code EXPIRED. A ``run_after`` not before it is refused
    (``ValueError``): the job could never run. ``rate_limit``: the rate limit
    (:func:`outbox.set_rate_limit`) the job takes a token of when it starts, as a
    handler's ``rate_limit`` would. ``debounce`` (with ``dedup_key``): while the job
    with that key has not started, an enqueue with the key replaces its payload and
    moves its start to ``debounce`` from now, never later than ``debounce_max``
    after the first enqueue, and returns its id; once it has started, an enqueue
    makes a new job.

    ``key``: the entity the job is about; at most ``key_limit`` (default 1) jobs
    with the same key hold a lease at once, across queues and job types; the
    others wait (KEY_BUSY) without spending an attempt. ``ordered=True``: jobs
    of the key start one after the other in enqueue order (commit order), passing
    a job that ended FAILED or CANCELLED; ``"strict"`` holds the key behind a
    FAILED one until it is replayed. Ordered jobs of a key run one at a time, so
    ``ordered`` with a ``key_limit`` above 1 is refused (``ValueError``).

    ``after``: ids of jobs (existing, or enqueued earlier in this transaction, so
    a whole graph is one commit; at most 1000) it waits for: it is held
    (``DEPENDENCY``) until every one has SUCCEEDED, then woken by the statement
    that ended the last. If one ends FAILED or CANCELLED, ``on_parent_failure``
    decides: ``"cancel"`` ends the job, and the jobs waiting for it under
    ``"cancel"``, CANCELLED with last_error_code PARENT_FAILED; ``"run"`` counts
    that parent as done. An unknown id, one named twice, or a parent that ended
    FAILED or CANCELLED already under ``"cancel"`` is refused (``ValueError``);
    a job with ``after`` takes no ``run_after``, ``debounce`` or
    ``needs_approval``. The handler reads its parents' results with
    ``job.parent_results()``.
    ``resource``: an exclusive target the job acts on (``"deploy:prod"``): at most
    one job with it holds a lease at once, across queues and job types; the others
    wait (RESOURCE_BUSY). A clean end of the holder's lease frees it; a lease that
    expires leaves it uncertain (RESOURCE_UNCERTAIN), and no job of it starts until
    :func:`outbox.resolve_resource`. A job takes a key or a resource, not both.

    ``tags``: a few labels (at most 16, each 1-64 letters, digits and ``_.:/=-``,
    starting with a letter or digit; a repeat counts once), and ``meta``: a small
    JSON object (at most 4 KiB as JSON, ``json_default`` applied as for the
    payload). Neither changes how the job runs: every operator surface shows them,
    and the operator's job lists (``jobctl jobs list --tag``, ``GET /v1/jobs?tag=``,
    ``jobctl.service.list_jobs``) find jobs by them. A debounced repeat replaces them.

    ``unique`` (with ``dedup_key``): how long the key is held, that is, for how long
    an enqueue with it returns the job that holds it instead of making one:
    ``"forever"`` (the default) until retention deletes the job; ``"waiting"`` until
    the job first starts (waiting for approval or for its parents counts as
    waiting; a retry or a snooze does not take the key back); ``"active"`` until it
    ends (SUCCEEDED, FAILED or CANCELLED, however it got there; waiting for a retry
    is still active); a ``timedelta`` (one second to ten years) for the window of
    the clock it was enqueued in, windows of that length counted from the Unix epoch
    (as River's ``ByPeriod``), whatever the job's state. A key held under one scope
    is not seen by an enqueue under ``"forever"``, and the reverse: give a job
    type's key one scope. A replayed job holds no ``"waiting"`` or ``"active"`` key.
    Not with ``debounce``, whose key is held until the job starts already.

    ``payload_ref``: an input stored by :func:`outbox.store_input` (in this
    transaction or an earlier one), run on instead of a payload (give none): the
    handler reads its content as ``job.payload``. Several jobs may name one input;
    it is read once per claimed batch, and deleted by retention once no job names
    it. An input that does not exist, or was redacted, is refused (``ValueError``);
    one redacted after this enqueue fails the job at its claim (INPUT_REDACTED).
    Not with ``debounce``.

    ``on_complete_url``: an http(s) URL the relay calls, signed, when the job ends
    (SUCCEEDED, FAILED or CANCELLED, however it got there), at least once, retrying
    with back-off (docs/guides/webhooks.md); it overrides the ``webhook=`` of the
    job type's handler. The call carries the job's id, type, queue, final state,
    attempts, end time and error, never its payload.

    ``weight``: how many slots one run of the job takes (1 to 100): of its
    consumer's ``--concurrency``, of its tenant's cap and of its type's and its
    queue's concurrency limits (a handler's ``global_limit``, a consumer's
    ``--queue-limit``), all given back when its lease ends. A
    consumer claims it only when that many of its slots are free; one whose whole
    ``--concurrency`` is smaller turns it down (``WEIGHT_OVER_CONCURRENCY``, and a
    warning in its log).

    Raises ``TypeError``/``ValueError`` before writing anything if an argument is
    unacceptable, and :class:`outbox.Backpressure` if the tenant's max_queued or
    max_enqueue_rate is reached.
    """
    job = NewJob(
        job_type,
        payload,
        queue,
        dedup_key,
        run_after,
        max_attempts,
        priority,
        tenant,
        needs_approval,
        expires,
        rate_limit,
        debounce,
        debounce_max,
        key=key,
        key_limit=key_limit,
        ordered=ordered,
        after=after,
        on_parent_failure=on_parent_failure,
        resource=resource,
        json_default=json_default,
        tags=tags,
        meta=meta,
        unique=unique,
        payload_ref=payload_ref,
        on_complete_url=on_complete_url,
        weight=weight,
    )
    return enqueue_many(session, [job])[0]


enqueue_async = async_twin(enqueue)
