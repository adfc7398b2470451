"""One round's reads: every statement in one read-only snapshot.

REPEATABLE READ makes the gauges agree with each other (a job cannot be counted both
waiting and running), and READ ONLY says what the round is. The first statement
sets a short statement timeout for this transaction only, takes the collectors'
advisory lock (released at commit) and reads the clock every age is measured from.
Nothing here changes the collector's state: the caller applies a reading once the
transaction has ended well, so a failed round leaves the counters as they were.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from psycopg import AsyncConnection

from hybrid_jobs.jobctl.metrics import queries as q
from hybrid_jobs.jobctl.metrics.cursor import Cursor, Seen
from hybrid_jobs.schema.queries import WEBHOOK_DELIVERY_COUNTS


@dataclass(frozen=True)
class Attempt:
    queue: str | None  # None: the job was deleted (retention) since
    job_type: str | None
    outcome: str  # the state the attempt left the job in
    attempt: int
    execution_s: float
    wait_s: float | None  # None: an attempt recorded before ready_at existed
    lease_expired: bool
    finished_at: datetime


@dataclass
class Cursors:
    """Where each history stands; kept by the collector across rounds."""

    attempts: Cursor
    cancellations: Cursor
    fires: Cursor

    @classmethod
    def new(cls, overlap: float, limit: int) -> Cursors:
        window = timedelta(seconds=overlap)
        return cls(Cursor(window, limit), Cursor(window, limit), Cursor(window, limit))


@dataclass(frozen=True)
class Worker:
    worker_id: str
    queues: tuple[str, ...]
    stale_outcomes: int
    leases_lost: int


@dataclass(frozen=True)
class Reading:
    now: datetime
    # (queue, state, count, age of the oldest due job in seconds or None)
    waiting: list[tuple[str, str, int, float | None]]
    # (queue, state, count, how many with an expired lease)
    leased: list[tuple[str, str, int, int]]
    outbox_due: int
    outbox_oldest_age: float | None
    # relays live, and of those connected to RabbitMQ
    relays: tuple[int, int]
    # (queue, reason, relays that cannot publish to it)
    publish_failing: list[tuple[str, str, int]]
    workers: list[Worker]
    queues: list[str]
    # (queue, jobs that wait for approval)
    awaiting_approval: list[tuple[str, int]] = field(default_factory=list)
    # resources an expired lease left uncertain
    resources_uncertain: int = 0

    # (queue, count): waiting for a rate limit's token; ended as expired
    rate_limited: list[tuple[str, int]] = field(default_factory=list)
    # (queue, count): a dedicated tenant's jobs turned down by consumers not naming it
    no_authorized_runner: list[tuple[str, int]] = field(default_factory=list)
    expired: list[tuple[str, int]] = field(default_factory=list)
    # None: a late attempt counted already, read as its key only
    attempts: list[Seen[Attempt | None]] = field(default_factory=list)
    # the latency of a job that ended CANCELLED; None for one that ended otherwise
    # although a cancel was asked for (its handler finished anyway)
    cancellations: list[Seen[float | None]] = field(default_factory=list)
    fires: list[Seen[float]] = field(default_factory=list)
    # (queue, KEY_BUSY or KEY_ORDER, waiting jobs turned down for their key)
    key_waits: list[tuple[str, str, int]] = field(default_factory=list)
    # (queue, jobs held for their parents: after=, DEPENDENCY)
    waiting_for_parents: list[tuple[str, int]] = field(default_factory=list)
    # (queue, RESOURCE_BUSY or RESOURCE_UNCERTAIN, waiting jobs turned down for it)
    resource_waits: list[tuple[str, str, int]] = field(default_factory=list)
    # (queue, waiting jobs turned down for their tenant's cap: TENANT_CAP)
    tenant_cap: list[tuple[str, int]] = field(default_factory=list)
    # (queue, waiting jobs turned down for their type's limit: CONCURRENCY_LIMIT)
    concurrency_limit: list[tuple[str, int]] = field(default_factory=list)
    # (queue, waiting jobs turned down for their queue's limit: QUEUE_CONCURRENCY_LIMIT)
    queue_limit: list[tuple[str, int]] = field(default_factory=list)
    # (queue, waiting jobs heavier than the consumer they met: WEIGHT_OVER_CONCURRENCY)
    too_heavy: list[tuple[str, int]] = field(default_factory=list)
    # Webhook calls per state: how many, and how many of their attempts failed.
    webhook_calls: list[tuple[str, int, int]] = field(default_factory=list)


async def _rows(conn: AsyncConnection, statement: Any, params: Any = None) -> list[Any]:
    cur = await conn.execute(statement, params)
    return await cur.fetchall()


def _attempt(row: Any) -> tuple[tuple[Any, Any], datetime, Attempt]:
    job_id, generation, at, queue, job_type, outcome, attempt, execution, wait, expired = row
    return (
        (job_id, generation),
        at,
        Attempt(queue, job_type, outcome, attempt, execution, wait, expired, at),
    )


async def _attempts(
    conn: AsyncConnection, cursor: Cursor, now: datetime
) -> list[Seen[Attempt | None]]:
    params = cursor.params(now)
    late = await _rows(conn, q.METRICS_ATTEMPTS_LATE, params)
    # The first round counts nothing: no need to look anything up for the late part.
    missing = [] if cursor.mark is None else [r for r in late if (r[0], r[1]) not in cursor.counted]
    found: dict[Any, Attempt] = {}
    if missing:
        by_key = {"job_ids": [r[0] for r in missing], "generations": [r[1] for r in missing]}
        for row in await _rows(conn, q.METRICS_ATTEMPTS_BY_KEY, by_key):
            key, _, attempt = _attempt(row)
            found[key] = attempt
    seen: list[Seen[Attempt | None]] = [
        Seen(True, (job_id, generation), at, found.get((job_id, generation)))
        for job_id, generation, at in late
    ]
    for row in await _rows(conn, q.METRICS_ATTEMPTS_AHEAD, params):
        key, at, attempt = _attempt(row)
        seen.append(Seen(False, key, at, attempt))
    return seen


async def read_round(conn: AsyncConnection, cursors: Cursors, timeout_s: float) -> Reading | None:
    """Everything one round needs, or None when another collection holds the lock.
    Runs its own transaction on ``conn``."""
    async with conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        begin = await _rows(
            conn,
            q.METRICS_ROUND_BEGIN,
            {"timeout_ms": str(max(1, round(timeout_s * 1000))), "lock": q.LOCK_NAME},
        )
        _, _, locked, now = begin[0]
        if not locked:
            return None
        waiting = [
            (queue, state, int(n), age)
            for queue, state, n, age in await _rows(conn, q.METRICS_JOBS_WAITING)
        ]
        awaiting = [
            (queue, int(n)) for queue, n in await _rows(conn, q.METRICS_JOBS_AWAITING_APPROVAL)
        ]
        leased = [
            (queue, state, int(n), int(expired))
            for queue, state, n, expired in await _rows(conn, q.METRICS_JOBS_LEASED)
        ]
        key_waits = [
            (queue, reason, int(n)) for queue, reason, n in await _rows(conn, q.METRICS_KEY_WAITS)
        ]
        parents = [
            (queue, int(n)) for queue, n in await _rows(conn, q.METRICS_JOBS_WAITING_FOR_PARENTS)
        ]
        resource_waits = [
            (queue, reason, int(n))
            for queue, reason, n in await _rows(conn, q.METRICS_RESOURCE_WAITS)
        ]
        tenant_cap = [(queue, int(n)) for queue, n in await _rows(conn, q.METRICS_TENANT_CAP_WAITS)]
        concurrency_limit = [
            (queue, int(n)) for queue, n in await _rows(conn, q.METRICS_CONCURRENCY_LIMIT_WAITS)
        ]
        queue_limit = [
            (queue, int(n)) for queue, n in await _rows(conn, q.METRICS_QUEUE_LIMIT_WAITS)
        ]
        too_heavy = [(queue, int(n)) for queue, n in await _rows(conn, q.METRICS_WEIGHT_WAITS)]
        ((uncertain,),) = await _rows(conn, q.METRICS_RESOURCES_UNCERTAIN)
        webhook_calls = [
            (state, int(n), int(failed))
            for state, n, failed in await _rows(conn, WEBHOOK_DELIVERY_COUNTS)
        ]
        ((due, oldest),) = await _rows(conn, q.METRICS_OUTBOX_DUE)
        ((relays_live, relays_connected),) = await _rows(conn, q.METRICS_RELAYS)
        publish_failing = [
            (queue, reason, int(relays))
            for queue, reason, relays, *_ in await _rows(conn, q.METRICS_PUBLISH_FAILING)
        ]
        workers = [
            Worker(w, tuple(queues), int(stale), int(lost))
            for w, queues, stale, lost in await _rows(conn, q.METRICS_WORKERS)
        ]
        queues = [r[0] for r in await _rows(conn, q.METRICS_QUEUES)]
        rate_limited = [(r[0], int(r[1])) for r in await _rows(conn, q.METRICS_JOBS_RATE_LIMITED)]
        expired = [(r[0], int(r[1])) for r in await _rows(conn, q.METRICS_JOBS_EXPIRED)]
        unauthorized = [
            (r[0], int(r[1])) for r in await _rows(conn, q.METRICS_JOBS_NO_AUTHORIZED_RUNNER)
        ]
        attempts = await _attempts(conn, cursors.attempts, now)
        cancellations: list[Seen[float | None]] = [
            Seen(late, (job_id, at), at, latency if state == "CANCELLED" else None)
            for late, job_id, at, state, latency in await _rows(
                conn, q.METRICS_CANCELLATIONS_SINCE, cursors.cancellations.params(now)
            )
        ]
        fires = [
            Seen(late, (name, scheduled_for), fired_at, delay)
            for late, name, scheduled_for, fired_at, delay in await _rows(
                conn, q.METRICS_SCHEDULE_FIRES_SINCE, cursors.fires.params(now)
            )
        ]
    return Reading(
        now=now,
        waiting=waiting,
        key_waits=key_waits,
        waiting_for_parents=parents,
        resource_waits=resource_waits,
        tenant_cap=tenant_cap,
        concurrency_limit=concurrency_limit,
        queue_limit=queue_limit,
        too_heavy=too_heavy,
        webhook_calls=webhook_calls,
        leased=leased,
        outbox_due=int(due),
        outbox_oldest_age=oldest,
        relays=(int(relays_live), int(relays_connected)),
        publish_failing=publish_failing,
        workers=workers,
        queues=queues,
        awaiting_approval=awaiting,
        resources_uncertain=int(uncertain),
        rate_limited=rate_limited,
        expired=expired,
        no_authorized_runner=unauthorized,
        attempts=attempts,
        cancellations=cancellations,
        fires=fires,
    )
