"""Jobs: list, look at, enqueue, cancel (and retry, through the producer API)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from sqlalchemy.ext.asyncio import AsyncSession

from hybrid_jobs import defaults, outbox
from hybrid_jobs.jobctl.service import queries
from hybrid_jobs.jobctl.service.cursor import Cursor, Order
from hybrid_jobs.jobctl.service.errors import (
    IdempotencyMismatch,
    Invalid,
    NotAllowed,
    NotFound,
    WrongState,
    invalid_argument,
)
from hybrid_jobs.jobctl.service.inputs import job_input
from hybrid_jobs.jobctl.service.models import (
    Approval,
    Attempt,
    Blocker,
    BulkRetry,
    Dependency,
    Enqueued,
    JobPage,
    JobStateChange,
    JobSummary,
    JobView,
    LastError,
    Lease,
    Step,
    TypePolicy,
    Why,
)
from hybrid_jobs.jobctl.service.sql import fetch_all, fetch_one
from hybrid_jobs.outbox.edit import UNSET, Unset
from hybrid_jobs.outbox.validation import check_tags
from hybrid_jobs.outbox.validation import read_json as readable
from hybrid_jobs.schema import names
from hybrid_jobs.schema.queries import (
    JOB_FIND_BY_DEDUP_MANY,
    JOB_REQUEST_BY_KEY,
    JOB_REQUEST_RECORD,
    JOB_STATE,
)
from hybrid_jobs.schema.states import LEASED, TERMINAL, JobState

# The states a retry (an operator's replay) moves a job out of.
RETRYABLE: Final = frozenset({JobState.FAILED, JobState.CANCELLED})

DEFAULT_LIMIT: Final = defaults.PAGE_LIMIT
MAX_LIMIT: Final = defaults.MAX_PAGE_LIMIT
# Index entries one page of a filtered list over finished jobs may read (about
# 20 ms at most); past it the page ends early, with a token to read on.
SCAN_LIMIT: Final = 10_000
ATTEMPTS_SHOWN: Final = 100
# Parents and children shown of a job (a fan-in may wait for 1,000).
DEPENDENCIES_SHOWN: Final = 100
STEPS_SHOWN: Final = 100
MAX_IDEMPOTENCY_KEY_LENGTH: Final = 255
# A meta filter's key and value: meta is at most MAX_META_BYTES whole.
MAX_META_KEY_LENGTH: Final = 200
MAX_META_VALUE_LENGTH: Final = defaults.MAX_META_BYTES


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a list shows; None (or empty): any.

    ``tags``: jobs that carry every one of them. ``meta``: jobs whose meta has each
    key with that value, compared as text (``{"customer": 42}`` is found by 42 and
    by "42"; true and false as JSON writes them)."""

    state: JobState | None = None
    queue: str | None = None
    job_type: str | None = None
    tenant: str | None = None
    tags: Collection[str] = ()
    meta: Mapping[str, str | int | float | bool] | None = None

    def checked(self) -> JobFilter:
        try:
            return JobFilter(
                None if self.state is None else JobState(self.state),
                None if self.queue is None else names.queue(self.queue),
                None if self.job_type is None else names.job_type(self.job_type),
                None if self.tenant is None else names.tenant(self.tenant),
                tuple(check_tags(self.tags)),
                _meta_filter(self.meta),
            )
        except (ValueError, TypeError) as exc:
            raise invalid_argument(exc, _filter_named(exc)) from None


def _filter_named(exc: ValueError | TypeError) -> str | None:
    """The filter a refusal is about: a tag (the ``tag`` parameter and option) or
    the meta."""
    text = str(exc)
    return "meta" if text.startswith("meta") else "tag" if text.startswith("tag") else None


def _meta_filter(
    meta: Mapping[str, str | int | float | bool] | None,
) -> dict[str, str] | None:
    """The meta filter as texts, as ``->>`` reads the stored values."""
    if not meta:
        return None
    if not isinstance(meta, Mapping):
        raise TypeError(f"meta must be a dict of key to value, not {type(meta).__name__}")
    found: dict[str, str] = {}
    for key, value in meta.items():
        names.text("meta key", key, MAX_META_KEY_LENGTH)
        if isinstance(value, str):
            found[key] = names.text(f"meta value of {key!r}", value, MAX_META_VALUE_LENGTH)
        elif isinstance(value, bool | int | float):
            found[key] = json.dumps(value)
        else:
            raise TypeError(
                f"meta value of {key!r} must be a str, number or bool, not {type(value).__name__}"
            )
    return found


@dataclass(frozen=True)
class NewJobRequest:
    """A job to enqueue; the fields mean what outbox.enqueue's arguments mean.
    ``run_after``: an aware datetime, None for now."""

    job_type: str
    payload: Any = None
    queue: str = "default"
    tenant: str | None = None
    priority: int = 0
    run_after: datetime | None = None
    max_attempts: int | None = None
    dedup_key: str | None = None
    needs_approval: bool = False

    expires: datetime | None = None
    rate_limit: str | None = None
    key: str | None = None
    key_limit: int | None = None
    ordered: bool | str = False
    debounce: timedelta | None = None
    debounce_max: timedelta | None = None
    after: tuple[uuid.UUID, ...] = ()
    on_parent_failure: str = "cancel"
    resource: str | None = None
    tags: tuple[str, ...] = ()
    meta: dict[str, Any] | None = None
    weight: int = 1
    payload_ref: uuid.UUID | None = None
    on_complete_url: str | None = None

    def fingerprint(self) -> str:
        """What the request asked for, as a hash: the same request gives the same
        one, whatever the order of the payload's keys."""
        document = {
            "job_type": self.job_type,
            "payload": self.payload,
            "queue": self.queue,
            "tenant": self.tenant,
            "priority": self.priority,
            "run_after": None if self.run_after is None else self.run_after.astimezone(UTC),
            "max_attempts": self.max_attempts,
        }
        if self.dedup_key is not None:
            # Absent rather than null: fingerprints stored before the field existed
            # still match their requests.
            document["dedup_key"] = self.dedup_key
        if self.needs_approval:
            document["needs_approval"] = True

        if self.expires is not None:
            document["expires"] = self.expires.astimezone(UTC)
        if self.rate_limit is not None:
            document["rate_limit"] = self.rate_limit
        if self.key is not None:
            document |= {"key": self.key, "key_limit": self.key_limit, "ordered": self.ordered}
        if self.debounce is not None:
            document["debounce"] = self.debounce.total_seconds()
        if self.debounce_max is not None:
            document["debounce_max"] = self.debounce_max.total_seconds()
        if self.after:
            document |= {
                "after": [str(i) for i in self.after],
                "on_parent_failure": self.on_parent_failure,
            }
        if self.resource is not None:
            document["resource"] = self.resource
        if self.tags:
            document["tags"] = list(self.tags)
        if self.meta:
            document["meta"] = self.meta
        if self.weight != 1:
            document["weight"] = self.weight
        if self.payload_ref is not None:
            document["payload_ref"] = str(self.payload_ref)
        if self.on_complete_url is not None:
            document["on_complete_url"] = self.on_complete_url
        text = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def parse_job_id(text: str) -> uuid.UUID | None:
    """A job id from a URL or a command line; None when it is not a UUID."""
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        return None


# --------------------------------------------------------------------- reads


def _summary(row: Sequence[Any]) -> JobSummary:
    # queries.SUMMARY_COLUMNS, with `done` after the state.
    (job_id, job_type, queue, tenant, state, priority, attempt, max_attempts, run_after) = row[:9]
    created_at, started_at, finished_at, last_error_code, delay_reason, tags, meta = row[9:16]
    state = JobState(state)
    return JobSummary(
        job_id,
        job_type,
        queue,
        tenant,
        state,
        state in TERMINAL,
        priority,
        attempt,
        max_attempts,
        run_after,
        created_at,
        started_at,
        finished_at,
        last_error_code,
        delay_reason,
        tuple(tags),
        readable(meta)[0],
    )


async def list_jobs(
    session: AsyncSession,
    where: JobFilter | None = None,
    *,
    limit: int = DEFAULT_LIMIT,
    after: str | None = None,
    scan: int = SCAN_LIMIT,
) -> JobPage:
    """A page of jobs, newest first (waiting and running ones by creation, finished
    ones by when they finished; every list by tag by creation), at most ``limit``
    (1-500); ``after`` is the ``next`` of the previous page. A filtered list reads
    at most ``scan`` candidates per page (by tag: jobs with its first tag), so a
    page may come back short, and ``scan_limited``, with a ``next`` to read on.
    Reads only."""
    where = (where or JobFilter()).checked()
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise Invalid(f"limit must be between 1 and {MAX_LIMIT}", "limit")
    statement = queries.job_list(
        where.state,
        queue=where.queue is not None,
        job_type=where.job_type is not None,
        tenant=where.tenant is not None,
        after=after is not None,
        tags=bool(where.tags),
        meta=where.meta is not None,
    )
    start = None if after is None else Cursor.decode(after, statement.order)
    params = {
        "queue": where.queue,
        "job_type": where.job_type,
        "tenant": where.tenant,
        "tag": next(iter(where.tags), None),
        "tags": list(where.tags),
        "meta": None if where.meta is None else json.dumps(where.meta, ensure_ascii=False),
        "after_id": None if start is None else start.job_id,
        "after_finished": None if start is None else start.finished_at,
        "limit": limit + 1,  # one more: is there a next page?
        "scan": scan,
    }
    rows = await fetch_all(session, statement.sql, params)
    jobs = tuple(_summary(row) for row in rows[:limit])
    if len(rows) > limit:
        return JobPage(jobs, _cursor(jobs[-1], statement.order).encode(), scan_limited=False)
    if statement.edge_sql is not None:
        edge = await fetch_one(session, statement.edge_sql, params)
        if edge is not None and edge[0] >= scan:
            # The scan stopped at its bound, not at the end: read on from its last row.
            cursor = Cursor(
                statement.order, edge[1], edge[2] if statement.order is Order.FINISHED else None
            )
            return JobPage(jobs, cursor.encode(), scan_limited=True)
    return JobPage(jobs, None, scan_limited=False)


def _cursor(job: JobSummary, order: Order) -> Cursor:
    return Cursor(order, job.id, job.finished_at if order is Order.FINISHED else None)


async def get_job(session: AsyncSession, job_id: uuid.UUID) -> JobView | None:
    """The job whole, with its newest attempts and why it waits (outbox.explain);
    None for an unknown id. Reads only."""
    row = await fetch_one(session, queries.JOB_GET, {"job_id": job_id})
    if row is None:
        return None
    attempts = await fetch_all(
        session, queries.JOB_ATTEMPTS, {"job_id": job_id, "limit": ATTEMPTS_SHOWN}
    )
    relations = await fetch_all(
        session, queries.JOB_DEPENDENCIES, {"job_id": job_id, "limit": DEPENDENCIES_SHOWN}
    )
    steps = await fetch_all(session, queries.JOB_STEPS, {"job_id": job_id, "limit": STEPS_SHOWN})
    (
        payload_text,
        dedup_key,
        updated_at,
        cancel_requested_at,
        cancel_forced_at,
        last_error_message,
        progress_text,
        progress_at,
        result_text,
        delay_since,
        lease_owner,
        lease_generation,
        lease_expires_at,
        checked_at,
        key,
        key_limit,
        key_order,
        resource,
    ) = row[16:]
    summary = _summary(row)
    as_text: list[str] = []
    payload = _read("payload", payload_text, as_text)
    progress = _read("progress", progress_text, as_text)
    result = _read("result", result_text, as_text)
    last_error = None
    if summary.last_error_code is not None or last_error_message is not None:
        last_error = LastError(summary.last_error_code, last_error_message)
    lease = None
    if summary.state in LEASED:
        lease = Lease(lease_owner, lease_generation, lease_expires_at)
    # The same rule as the producer API's: read in this transaction, so under
    # REPEATABLE READ the row above and the reasons agree.
    approval = None
    try:
        explanation = await outbox.explain_async(session, job_id)
    except outbox.JobNotFound:
        # Deleted by retention between two statements of a READ COMMITTED caller.
        why = None
    else:
        why = Why(
            explanation.summary,
            tuple(Blocker(b.code, dict(b.facts)) for b in explanation.blockers),
        )
        if explanation.approval is not None:
            approval = Approval(**explanation.approval)
    # A type that declared nothing has no row: it allows everything.
    declared = await outbox.job_type_policy_async(session, summary.job_type)
    policy = None if declared.updated_at is None else type_policy(declared)
    return JobView(
        **{f.name: getattr(summary, f.name) for f in dataclasses.fields(JobSummary)},
        payload=payload,
        dedup_key=dedup_key,
        updated_at=updated_at,
        cancel_requested_at=cancel_requested_at,
        cancel_forced_at=cancel_forced_at,
        last_error=last_error,
        progress=progress,
        progress_at=progress_at,
        result=result,
        delay_since=delay_since,
        lease=lease,
        attempts=tuple(Attempt(*a) for a in reversed(attempts)),
        why=why,
        checked_at=checked_at,
        as_text=tuple(as_text),
        approval=approval,
        key=key,
        key_limit=key_limit,
        key_order=key_order,
        resource=resource,
        parents=tuple(Dependency(*r[1:]) for r in relations if r[0] == "parent"),
        children=tuple(Dependency(*r[1:]) for r in relations if r[0] == "child"),
        steps=tuple(Step(*r) for r in steps),
        policy=policy,
        input=await job_input(session, job_id),
    )


def _read(name: str, text: str | None, as_text: list[str]) -> Any:
    value, whole = readable(text)
    if not whole:
        as_text.append(name)
    return value


# --------------------------------------------------------------------- actions


async def enqueue_job(
    session: AsyncSession, request: NewJobRequest, *, idempotency_key: str | None = None
) -> Enqueued:
    """Enqueue one job (outbox.enqueue_async), and return it as stored.

    ``request.dedup_key`` means what outbox.enqueue's does: a job of the type with
    that key is returned instead, and nothing is written (``created`` False).

    An ``idempotency_key`` names this request, in a namespace of its own (not the
    producers' dedup keys), for any job type: a repeat of the request returns what
    the first one returned (``replayed``); a repeat with anything else in it raises
    :class:`IdempotencyMismatch`, having written nothing. A concurrent repeat waits
    for the first and is answered the same way. Raises :class:`Invalid` for an
    unacceptable argument and :class:`outbox.Backpressure` when the tenant has its
    max_queued waiting. Never commits.
    """
    key = None if idempotency_key is None else _idempotency_key(idempotency_key)
    if key is not None:
        earlier = await fetch_one(session, JOB_REQUEST_BY_KEY, {"key": key})
        if earlier is not None:
            # Before the enqueue, so a repeat is answered even when the tenant is at
            # its max_queued now.
            return await _replay(session, earlier, request)
    # The enqueue and the key's record together, or neither: a request that loses
    # the key to a concurrent one leaves no job of its own behind.
    savepoint = await session.begin_nested()
    try:
        job_id, created = await _enqueue(session, request)
        if key is not None:
            params = {"key": key, "job_id": job_id, "fingerprint": request.fingerprint()}
            if await fetch_one(session, JOB_REQUEST_RECORD, params) is None:
                await savepoint.rollback()
                earlier = await fetch_one(session, JOB_REQUEST_BY_KEY, {"key": key})
                assert earlier is not None, "the key's row committed before ours was refused"
                return await _replay(session, earlier, request)
    except BaseException:
        if savepoint.is_active:
            await savepoint.rollback()
        raise
    await savepoint.commit()
    return Enqueued(await _must_get(session, job_id), created)


async def _enqueue(session: AsyncSession, request: NewJobRequest) -> tuple[uuid.UUID, bool]:
    """The job's id, and whether this call wrote it (False: its dedup key found it,
    or, debounced, it replaced the waiting job of its key)."""
    waiting: uuid.UUID | None = None
    if request.debounce is not None and request.dedup_key is not None:
        # A debounced job keeps its key apart from the dedup keys (jobs_debounce_idx,
        # while it has not started): the enqueue replaces that job, never answers it.
        waiting = await _debounced_waiting(session, request.job_type, request.dedup_key)
    elif request.dedup_key is not None:
        found = await _find_by_dedup(session, request.job_type, request.dedup_key)
        if found is not None:
            return found, False
    try:
        job_id = await outbox.enqueue_async(
            session,
            request.job_type,
            request.payload,
            queue=request.queue,
            dedup_key=request.dedup_key,
            run_after=request.run_after,
            max_attempts=request.max_attempts,
            priority=request.priority,
            tenant=request.tenant,
            needs_approval=request.needs_approval,
            expires=request.expires,
            rate_limit=request.rate_limit,
            key=request.key,
            key_limit=request.key_limit,
            ordered=request.ordered,
            debounce=request.debounce,
            debounce_max=request.debounce_max,
            after=request.after,
            on_parent_failure=request.on_parent_failure,
            resource=request.resource,
            tags=request.tags,
            meta=request.meta,
            weight=request.weight,
            payload_ref=request.payload_ref,
            on_complete_url=request.on_complete_url,
        )
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc, _argument_named(exc)) from None
    return job_id, job_id != waiting


# The request's fields, which enqueue's messages name as its arguments.
_REQUEST_FIELDS: Final = frozenset(f.name for f in dataclasses.fields(NewJobRequest))
_WORD: Final = re.compile(r"[A-Za-z_]+")


def _argument_named(exc: ValueError | TypeError) -> str | None:
    """The request field an enqueue refusal is about: the first word of its message
    that is one ("payload is ...", "a job takes a key or a resource, not both":
    key); None when it names none (the request as a whole)."""
    return next((w for w in _WORD.findall(str(exc)) if w in _REQUEST_FIELDS), None)


async def _replay(
    session: AsyncSession, earlier: tuple[Any, ...], request: NewJobRequest
) -> Enqueued:
    job_id, fingerprint, made = earlier
    if fingerprint != request.fingerprint():
        raise IdempotencyMismatch(
            f"Idempotency-Key was used for job {job_id} with a different request; "
            "use a new key for a new request"
        )
    return Enqueued(await _must_get(session, job_id), created=bool(made), replayed=True)


def _idempotency_key(key: str) -> str:
    try:
        key = names.text("Idempotency-Key", key, MAX_IDEMPOTENCY_KEY_LENGTH)
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc, "Idempotency-Key") from None
    if not key.isprintable() or not key.isascii():
        raise Invalid("Idempotency-Key must be printable ASCII", "Idempotency-Key")
    return key


async def _debounced_waiting(
    session: AsyncSession, job_type: str, dedup_key: str
) -> uuid.UUID | None:
    """The job a debounced enqueue with this key would replace now, if any (only to
    answer 200 rather than 202: the enqueue itself decides)."""
    try:
        params = {"job_type": names.job_type(job_type), "debounce_key": names.dedup_key(dedup_key)}
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc, _argument_named(exc)) from None
    row = await fetch_one(session, queries.DEBOUNCE_WAITING, params)
    return None if row is None else uuid.UUID(str(row[0]))


async def _find_by_dedup(session: AsyncSession, job_type: str, dedup_key: str) -> uuid.UUID | None:
    try:
        job_type = names.job_type(job_type)
        dedup_key = names.dedup_key(dedup_key)
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc, _argument_named(exc)) from None
    keys = json.dumps([{"job_type": job_type, "dedup_key": dedup_key}])
    row = await fetch_one(session, JOB_FIND_BY_DEDUP_MANY, {"keys": keys})
    return None if row is None else uuid.UUID(str(row[2]))


async def _must_get(session: AsyncSession, job_id: uuid.UUID) -> JobView:
    job = await get_job(session, job_id)
    assert job is not None, f"job {job_id} vanished inside its own transaction"
    return job


async def cancel_jobs(
    session: AsyncSession,
    job_ids: Iterable[uuid.UUID],
    *,
    force: bool = False,
    override_policy: bool = False,
    by: str | None = None,
) -> list[JobStateChange]:
    """Cancel each job that waits, ask each running one to stop
    (outbox.request_cancel_async; ``force``: interrupt its handler at its worker's
    next heartbeat). ``applied`` is True when the job is cancelled or asked to stop
    now (a repeated cancel too); False for a job that had finished otherwise, an
    unknown id (state None), or a running job whose type does not allow it
    (``not_allowed``: its policy; ``override_policy`` asks it to stop all the same,
    recording ``by``). Never commits."""
    done: list[JobStateChange] = []
    for job_id in job_ids:
        try:
            state = await outbox.request_cancel_async(
                session, job_id, force=force, override_policy=override_policy, by=by
            )
        except outbox.NotAllowed as exc:
            done.append(JobStateChange(job_id, exc.state, False, type_policy(exc.policy)))
            continue
        except (ValueError, TypeError) as exc:
            raise invalid_argument(exc, "by") from None
        applied = state in (JobState.CANCELLED, JobState.CANCEL_REQUESTED)
        done.append(JobStateChange(job_id, state, applied))
    return done


def type_policy(policy: outbox.JobTypePolicy) -> TypePolicy:
    return TypePolicy(
        policy.job_type,
        policy.replay,
        policy.cancel_running,
        policy.on_cancel,
        policy.updated_at,
        policy.updated_by,
    )


def refusal(change: JobStateChange, action: str) -> NotAllowed:
    """The refusal of a change its job's type does not allow, for one line or a 409."""
    policy = change.not_allowed
    assert policy is not None and change.state is not None
    promise = "" if policy.on_cancel is None else f" (on cancel: {policy.on_cancel})"
    return NotAllowed(
        f"job {change.id} is {change.state}: {policy.job_type} does not allow {action}"
        f"{promise}; override the policy to do it anyway (recorded)",
        change.state,
        policy,
    )


async def approve_job(
    session: AsyncSession, job_id: uuid.UUID, *, by: str | None = None
) -> JobStateChange:
    """Let a job that waits for approval run (outbox.approve_async): due now, woken
    at commit. Raises :class:`NotFound` for an unknown id and :class:`WrongState`
    for a job that does not wait for approval (decided already, or never needed
    it), having changed nothing. Never commits."""
    try:
        await outbox.approve_async(session, job_id, by=by)
    except outbox.JobNotFound:
        raise NotFound(f"no job {job_id}") from None
    except outbox.NotAwaitingApproval as exc:
        raise WrongState(str(exc), exc.state) from None
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc, "by") from None
    return JobStateChange(job_id, JobState.QUEUED, True)


async def reject_job(
    session: AsyncSession, job_id: uuid.UUID, *, by: str | None = None, reason: str | None = None
) -> JobStateChange:
    """Cancel a job that waits for approval for good (outbox.reject_async):
    CANCELLED, last_error_code REJECTED, ``reason`` its message. Refuses like
    :func:`approve_job`. Never commits."""
    try:
        state = await outbox.reject_async(session, job_id, by=by, reason=reason)
    except outbox.JobNotFound:
        raise NotFound(f"no job {job_id}") from None
    except outbox.NotAwaitingApproval as exc:
        raise WrongState(str(exc), exc.state) from None
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc) from None
    return JobStateChange(job_id, state, True)


async def edit_job(
    session: AsyncSession,
    job_id: uuid.UUID,
    *,
    payload: Any = UNSET,
    priority: int | Unset = UNSET,
    run_after: datetime | timedelta | Unset = UNSET,
    max_attempts: int | Unset = UNSET,
) -> JobView:
    """Change a job that has not started yet (outbox.update_job_async): only the
    fields given, its wake-up moved with a new start or priority. Returns the job as
    stored. Raises :class:`NotFound` for an unknown id, :class:`WrongState` once it
    has started or ended (or for a new start of a job held for approval or for its
    parents), :class:`Invalid` for an unacceptable value, having changed nothing.
    Never commits."""
    try:
        await outbox.update_job_async(
            session,
            job_id,
            payload=payload,
            priority=priority,
            run_after=run_after,
            max_attempts=max_attempts,
        )
    except outbox.JobNotFound:
        raise NotFound(f"no job {job_id}") from None
    except outbox.JobNotEditable as exc:
        raise WrongState(str(exc), exc.state) from None
    except (ValueError, TypeError) as exc:
        raise invalid_argument(exc, _argument_named(exc)) from None
    return await _must_get(session, job_id)


async def retry_jobs(
    session: AsyncSession,
    job_ids: Iterable[uuid.UUID],
    *,
    by: str | None = None,
    dry_run: bool = False,
    override_policy: bool = False,
) -> list[JobStateChange]:
    """Put each FAILED or CANCELLED job back in the queue (outbox.retry_job_async),
    its history kept and a fresh attempt budget given. ``applied`` is False for a
    job in any other state (left as it was), for an unknown id (state None), and
    for a job whose type does not allow replay (``not_allowed``: its policy), unless
    ``override_policy`` (recorded as forced). ``by`` names who asked, for
    job_replays. ``dry_run``: the same, in a savepoint rolled back, so the answer is
    what the rule would do. Never commits."""
    done: list[JobStateChange] = []
    async with _savepoint(session, keep=not dry_run):
        for job_id in job_ids:
            row = await fetch_one(session, JOB_STATE, {"job_id": job_id})
            before = None if row is None else JobState(row[0])
            try:
                state = await outbox.retry_job_async(
                    session, job_id, by=by, override_policy=override_policy
                )
            except outbox.NotAllowed as exc:
                done.append(JobStateChange(job_id, exc.state, False, type_policy(exc.policy)))
                continue
            except (ValueError, TypeError) as exc:
                raise invalid_argument(exc, "by") from None
            applied = before in RETRYABLE and state == JobState.QUEUED
            done.append(JobStateChange(job_id, before if dry_run else state, applied))
    return done


@asynccontextmanager
async def _savepoint(session: AsyncSession, *, keep: bool) -> AsyncIterator[None]:
    """The block in a savepoint: released when it ends if ``keep`` (rolled back
    otherwise: a dry run), and rolled back whenever it raises."""
    savepoint = await session.begin_nested()
    try:
        yield
    except BaseException:
        await savepoint.rollback()
        raise
    if keep:
        await savepoint.commit()
    else:
        await savepoint.rollback()


async def retry_matching(
    session: AsyncSession,
    *,
    queue: str | None = None,
    job_type: str | None = None,
    error_code: str | None = None,
    finished_after: datetime | None = None,
    every: bool = False,
    states: Collection[JobState] = (JobState.FAILED,),
    limit: int = 1000,
    by: str | None = None,
    dry_run: bool = False,
    override_policy: bool = False,
) -> BulkRetry:
    """Retry the jobs in ``states`` (FAILED by default; CANCELLED ones only when
    asked: a cancel is a person's decision, not a failure) that match every filter given,
    oldest finished first, at most ``limit`` (outbox.retry_jobs_async). With no
    filter, ``every`` must say so: a bulk retry of everything is never the result
    of a forgotten filter. ``dry_run``: the same statement in a savepoint rolled
    back, so the count is exactly what the rule would retry, and nothing changes.
    Jobs whose type does not allow replay are passed over and counted
    (``not_allowed``), unless ``override_policy``. Never commits."""
    filtered = any(v is not None for v in (queue, job_type, error_code, finished_after))
    if filtered and every:
        raise Invalid("all means every failed job: give filters or all, not both", "all")
    if not filtered and not every:
        raise Invalid(
            "say which jobs to retry: a filter (queue, job_type, error_code,"
            " finished_after), or all for every failed job",
            "all",
        )
    async with _savepoint(session, keep=not dry_run):
        try:
            matched = await outbox.retry_jobs_async(
                session,
                queue=queue,
                job_type=job_type,
                error_code=error_code,
                finished_after=finished_after,
                limit=limit,
                by=by,
                states=states,
                override_policy=override_policy,
            )
        except (ValueError, TypeError) as exc:
            raise invalid_argument(exc) from None
    return BulkRetry(matched, dry_run, not_allowed=matched.not_allowed)
