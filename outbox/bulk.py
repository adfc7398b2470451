"""A large batch of plain jobs written by COPY instead of one INSERT statement.

``enqueue_many`` writes most batches with one statement that reads the jobs from a
JSON document (``JOB_INSERT_MANY``). For a large batch whose jobs need none of that
statement's steps but tags (no dedup key to look up, no parents, approval, key
order, stored input or debounce), the server's parse of the document and the statement's
projection of every row cost more than the rows themselves. So such a batch goes
by COPYs instead, into ``jobs``, ``outbox`` and (for tags) ``job_tags``, on the same connection
and in the caller's transaction: the rows written are the ones the statement
writes, checked by the same validation (:func:`validation.job_fields`), and the
outbox's trigger notifies the relay at commit as it does for an insert.

Where the statement computes a start or a deadline from the database's ``now()``,
the COPY takes ``now()`` once from the same transaction (the instant every
``now()`` of the transaction returns) and adds the job's span to it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

import psycopg

from hybrid_jobs.outbox import backpressure
from hybrid_jobs.outbox.validation import NewJob, job_fields, new_job_ids, parent_ids
from hybrid_jobs.plumbing import tracing
from hybrid_jobs.schema import names
from hybrid_jobs.schema.queries import (
    JOB_COPY,
    JOB_COPY_NOW,
    JOB_COPY_TAGGED,
    JOB_TAGS_COPY,
    OUTBOX_COPY,
)

if TYPE_CHECKING:
    import uuid

    from sqlalchemy import Connection

# Below this many jobs the one statement costs as much or less: a COPY takes more
# round trips (now(), a savepoint, the jobs, their wake-ups) where the statement
# takes one. Per job, committed in batches of each size (`python -m
# bench.bulk_enqueue --sizes 200 300 500 1000`): 44 against 40 µs at 200, the same
# at 300, 29 against 31 at 500 and 26 against 32 at 1,000.
COPY_FROM = 500

_Copies = list[tuple[str, Iterable[tuple[Any, ...]]]]
_ToWrite = Iterator[tuple[str, Iterable[tuple[Any, ...]]]]

# A span from now whose end a datetime can hold, with room to spare; a longer one
# (which the database refuses as out of range) goes by the statement, and fails there
# as it always has.
_LONGEST_SPAN = timedelta(days=365 * 1000)


def copyable(batch: Sequence[object]) -> bool:
    """Whether the batch is large enough, and every job in it plain enough, to go
    by COPY. A job with a value enqueue refuses may be counted plain: the same
    checks refuse it on either path."""
    return len(batch) >= COPY_FROM and all(_plain(job) for job in batch)


def in_transaction(conn: Connection) -> bool:
    """Whether the session's connection runs its statements in a transaction: an
    autocommit one (``isolation_level="AUTOCOMMIT"``) commits each apart, and the
    two COPYs must commit together, so such a session's batch goes by the one
    statement."""
    return getattr(conn.connection.driver_connection, "autocommit", True) is False


def _plain(job: object) -> bool:
    return (
        type(job) is NewJob
        and job.dedup_key is None
        and job.debounce is None
        and job.needs_approval is False
        and not job.after
        and job.payload_ref is None
        and not job.ordered
        and _near(job.run_after)
        and _near(job.expires)
    )


def _near(value: object) -> bool:
    return not isinstance(value, timedelta) or abs(value) < _LONGEST_SPAN


def copy_jobs(conn: Connection, batch: Sequence[NewJob], limit: int) -> list[uuid.UUID]:
    """Writes the jobs and their wake-ups by COPY, in the caller's transaction, and
    returns their ids in order (none can conflict: no job has a dedup key).

    Each job is checked as the statement's path checks it, in the batch's order, as
    it is written: the checks run while the server writes the rows before them,
    where a whole check first would leave the server idle. A savepoint holds it
    all, backpressure's tokens included: a refused job ends the COPY and the
    savepoint takes back what was written, so, as on the statement's path, a
    refused batch keeps nothing and the caller's transaction goes on. Backpressure
    is asked before the first row, from the batch's tenants; when it refuses, the
    jobs are checked first, so a batch that holds a refused job says so, as the
    statement's path (which checks before it asks) does."""
    tenants = _tenants(batch)
    if tenants is None:  # a tenant's name is refused: say what the checks say first
        _check(batch, limit)
        raise AssertionError("a tenant's name refused here passed the checks")
    # In UTC: a span is elapsed time, as now() + interval counts it in PostgreSQL,
    # where Python adds a span to a zoned datetime on the wall clock (across a change
    # of summer time, an hour off).
    now: datetime = conn.exec_driver_sql(JOB_COPY_NOW).scalar_one().astimezone(UTC)
    captured = tracing.capture()
    trace = None if captured is None else json.dumps(captured, separators=(",", ":"))
    ids = new_job_ids(len(batch))
    wakeups: list[tuple[Any, ...]] = []
    tagged: list[tuple[str, uuid.UUID]] = []

    def rows() -> Iterator[tuple[Any, ...]]:
        for job, new_id in zip(batch, ids, strict=True):
            fields = _checked(job, limit, new_id)
            queue, tenant, priority = fields["queue"], fields["tenant"], fields["priority"]
            run_after = _instant(job.run_after, fields["run_after"], now) or now
            row: tuple[Any, ...] = (
                new_id,
                fields["job_type"],
                queue,
                tenant,
                fields["payload"],
                fields["max_attempts"],
                priority,
                run_after,
                trace,
                _instant(job.expires, fields["expires_at"], now),
                fields["rate_limit"],
                fields["key"],
                fields["key_limit"],
                fields["resource"],
                fields["weight"],
                fields["meta"],
            )
            if with_tags:
                tags = fields.get("tags", [])
                row = (*row, tags)
                tagged.extend([(tag, new_id) for tag in tags])
            yield row
            wakeups.append((new_id, queue, tenant or "", priority, run_after))

    # A batch without tags by the COPY without their column.
    with_tags = any(job.tags for job in batch)
    job_copy = JOB_COPY_TAGGED if with_tags else JOB_COPY
    copies = [(job_copy, rows()), (OUTBOX_COPY, wakeups), (JOB_TAGS_COPY, tagged)]
    with conn.begin_nested():
        try:
            backpressure.refuse(conn, tenants)
        except backpressure.Backpressure:
            _check(batch, limit)
            raise
        _write(conn, copies)
    return ids


def _tenants(batch: Sequence[NewJob]) -> Counter[str] | None:
    """How many jobs each tenant adds (backpressure's question), or None if a
    tenant's name is refused."""
    tenants: Counter[str] = Counter()
    for job in batch:
        if job.tenant is not None:
            try:
                tenants[names.tenant(job.tenant)] += 1
            except (TypeError, ValueError):
                return None
    return tenants


def _check(batch: Sequence[NewJob], limit: int) -> None:
    """Every job checked in order, as the statement's path checks them: the first
    refused one raises."""
    for job in batch:
        _checked(job, limit)


def _checked(job: NewJob, limit: int, job_id: uuid.UUID | None = None) -> dict[str, Any]:
    """The job checked as the statement's path checks it (its ``after``, empty here,
    for on_parent_failure; then every field), as the fields it stores."""
    parent_ids(job)
    return job_fields(job, limit, None, None, job_id)[1]


def _write(conn: Connection, copies: _Copies) -> None:
    """The COPYs, on the session's own driver connection; an error of the server's
    raised as SQLAlchemy raises it for a statement (an OperationalError for a
    timeout, an IntegrityError for a constraint), for the caller's handlers."""
    driver = conn.connection.driver_connection
    begun: list[str] = []  # the COPYs begun, the last one the one that failed
    to_write = _to_write(copies, begun)
    try:
        if isinstance(driver, psycopg.AsyncConnection):  # an AsyncSession's, in its greenlet
            # imported here: the daemons import the producer API without SQLAlchemy
            from sqlalchemy.util import await_only

            await_only(_copy_async(driver, to_write))
        elif isinstance(driver, psycopg.Connection):
            _copy(driver, to_write)
        else:  # psycopg_connection refused any other driver already
            raise TypeError(f"COPY needs a psycopg connection, not {type(driver).__name__}")
    except psycopg.Error as exc:
        from sqlalchemy.exc import DBAPIError

        raise DBAPIError.instance(
            begun[-1] if begun else JOB_COPY,
            None,
            exc,
            psycopg.Error,
            connection_invalidated=conn.dialect.is_disconnect(cast(Any, exc), None, None),
            dialect=conn.dialect,
        ) from exc


def _instant(given: object, checked: object, now: datetime) -> object:
    """A start or deadline as the COPY writes it: a span (as given) added to the
    transaction's now, an instant as checked (its ISO text), or None."""
    return now + given if isinstance(given, timedelta) else checked


def _to_write(copies: _Copies, begun: list[str]) -> _ToWrite:
    """The COPYs with rows to write, each looked at once the one before is written
    (the lists fill as the jobs' rows go out): a batch with no tags has no COPY of
    them. Each one's statement goes to ``begun`` as it is handed out."""
    for statement, rows in copies:
        if not isinstance(rows, list) or rows:
            begun.append(statement)
            yield statement, rows


def _copy(driver: psycopg.Connection[Any], copies: _ToWrite) -> None:
    with driver.cursor() as cursor:
        for statement, rows in copies:
            with cursor.copy(statement) as copy:
                for row in rows:
                    copy.write_row(row)


async def _copy_async(driver: psycopg.AsyncConnection[Any], copies: _ToWrite) -> None:
    async with driver.cursor() as cursor:
        for statement, rows in copies:
            async with cursor.copy(statement) as copy:
                for row in rows:
                    await copy.write_row(row)
