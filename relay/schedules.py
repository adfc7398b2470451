"""Firing recurring schedules: a relay chore that needs no leader.

Every relay runs :func:`fire_due`. Due schedules are locked ``FOR UPDATE SKIP
LOCKED``, so relays split them; each is handled in its own savepoint of one
transaction that records its occurrences in ``schedule_fires``, enqueues the jobs
of the ones it recorded (job row and wake-up), and moves the schedule on. The
ledger's primary key (schedule, nominal instant) is the arbiter: an occurrence whose
row exists already enqueues nothing. A relay that dies mid-way rolls all of it back,
and the next one starts again from the stored ``next_fire_at``.

Which occurrences run, of those that came due since the schedule was last handled
(one, on time, when a relay keeps up; several after a gap, however short):

- ``catchup="all"``: each runs, except that of those more than ``grace`` seconds
  late (missed while no relay ran) only the newest ``max_catchup`` do, the rest
  are recorded skipped (reason ``catchup_limit``);
- ``"latest"``: only the newest runs, however late; the others are recorded skipped
  (reason ``catchup``);
- ``"skip"``: only the newest runs, and only if it is at most ``grace`` seconds late;
  the others are recorded skipped (reason ``catchup``).

So after any gap, ``skip`` and ``latest`` enqueue at most one job per schedule.
(``grace`` must exceed the relay's polling delay under load, else a busy relay
would count its own lateness as downtime and "skip" would drop the current one.)

A schedule whose firing fails (not the database being away: that is retried as
any outage is) rolls back alone, in its savepoint, and says why on its row
(``failures``, ``last_error``, ``last_error_at``) and in the log; it is not looked at
again before ``retry_at``, a backoff that doubles with each failure in a row (from
``FAILURE_BACKOFF`` up to ``FAILURE_BACKOFF_CAP``), so schedules that keep failing
never hold back the ones due after them. The next success clears ``failures``.

After a very long outage only the newest occurrences are walked and recorded (about
``keep_fires`` of them, what retention would keep anyway); the span passed over is
logged, not recorded row by row.
"""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from hybrid_jobs import defaults
from hybrid_jobs.outbox.recurrence import Recurrence
from hybrid_jobs.outbox.schedules import NO_PAYLOAD_LIMIT, JobTemplate
from hybrid_jobs.outbox.validation import to_row
from hybrid_jobs.plumbing.transient import is_transient_db_error
from hybrid_jobs.schema.queries import (
    JOB_FIND_BY_DEDUP_MANY,
    JOB_INSERT_MANY,
    JOB_INSERT_PLAIN_MANY,
    SCHEDULE_ADVANCE,
    SCHEDULE_CLAIM_DUE,
    SCHEDULE_FAILED,
    SCHEDULE_FIRE_PRUNE,
    SCHEDULE_FIRE_RECORD_MANY,
    SCHEDULE_FIRE_SET_JOB,
    SCHEDULE_NEXT_DUE,
)

log = logging.getLogger("relay")

DEFAULT_MAX_CATCHUP: Final = defaults.SCHEDULE_MAX_CATCHUP
DEFAULT_KEEP_FIRES: Final = defaults.SCHEDULE_KEEP_FIRES
DEFAULT_GRACE: Final = defaults.SCHEDULE_GRACE
# Old ledger rows deleted per fired schedule per round: a round adds a handful.
PRUNE_BATCH: Final = 100
# A schedule whose firing fails is tried again after this many seconds, doubled with
# each failure in a row, up to the cap: soon enough for a passing fault, rare enough
# that one failing for good costs a log line every five minutes.
FAILURE_BACKOFF: Final = 5.0
FAILURE_BACKOFF_CAP: Final = 300.0
MAX_ERROR_LENGTH: Final = 2000

SKIPPED_CATCHUP: Final = "catchup"
SKIPPED_CATCHUP_LIMIT: Final = "catchup_limit"


@dataclass(frozen=True)
class Decision:
    at: datetime  # nominal UTC instant
    skip_reason: str | None  # None: enqueue a job


@dataclass(frozen=True)
class Plan:
    decisions: list[Decision]
    next_fire_at: datetime
    # Occurrences passed over without a ledger row (a very long outage): from the
    # first, up to but not including the second.
    unrecorded: tuple[datetime, datetime] | None = None


def plan_fires(
    rule: Recurrence,
    next_fire_at: datetime,
    now: datetime,
    *,
    catchup: str,
    max_catchup: int,
    grace: float,
    window: int,
) -> Plan:
    """What to do with the occurrences from ``next_fire_at`` up to ``now``.

    Walks forward from the stored nominal instant (never from ``now``), keeping the
    newest ``window`` occurrences; far behind, it jumps ahead to about ``window``
    occurrences before ``now`` (every occurrence is computed from the rule, so a
    jump lands on real occurrences).
    """
    if window < 2:
        raise ValueError("window must be at least 2")
    kept: deque[datetime] = deque(maxlen=window)
    unkept: datetime | None = None  # the first occurrence walked past without keeping it
    at = next_fire_at.astimezone(UTC)
    while at <= now:
        if len(kept) == window:
            unkept = unkept or kept[0]
            span = kept[-1] - kept[0]
            if at < now - span:
                # Far behind: what lies before the last `span` would not be kept.
                kept.clear()
                at = rule.next_after(now - span)
                continue
        kept.append(at)
        at = rule.next_after(at)
    unrecorded = None if unkept is None else (unkept, kept[0] if kept else at)
    on_time_from = now - timedelta(seconds=grace)
    return Plan(_decide(list(kept), on_time_from, catchup, max_catchup), at, unrecorded)


def _decide(
    due: list[datetime], on_time_from: datetime, catchup: str, max_catchup: int
) -> list[Decision]:
    """Which of the occurrences due at once (oldest first) run; see the module's
    docstring."""
    if not due:
        return []
    if catchup == "all":
        missed = [t for t in due if t < on_time_from]
        on_time = [t for t in due if t >= on_time_from]
        # The newest missed ones fire: after a long outage the recent ones matter most.
        cut = max(len(missed) - max_catchup, 0)
        return [Decision(t, SKIPPED_CATCHUP_LIMIT) for t in missed[:cut]] + [
            Decision(t, None) for t in missed[cut:] + on_time
        ]
    *older, newest = due
    runs = catchup == "latest" or newest >= on_time_from
    skipped = [Decision(t, SKIPPED_CATCHUP) for t in older]
    return [*skipped, Decision(newest, None if runs else SKIPPED_CATCHUP)]


@dataclass(frozen=True)
class _Due:
    """A row of SCHEDULE_CLAIM_DUE: when the schedule fires, and what each
    occurrence enqueues."""

    name: str
    template: JobTemplate
    cron: str | None
    every_seconds: float | None
    timezone: str
    catchup: str
    next_fire_at: datetime
    db_now: datetime

    @classmethod
    def of(cls, row: tuple[Any, ...]) -> _Due:
        name, job_type, payload, cron, every_seconds, timezone, queue, tenant = row[:8]
        priority, max_attempts, catchup, next_fire_at, db_now, tags, meta = row[8:]
        template = JobTemplate(
            job_type, payload, queue, tenant, priority, max_attempts, tuple(tags), meta
        )
        return cls(name, template, cron, every_seconds, timezone, catchup, next_fire_at, db_now)

    def dedup_key(self, at: datetime) -> str:
        # The occurrence's identity again, on the job: a second line of defence.
        return f"schedule:{self.name}@{at.astimezone(UTC).isoformat()}"


async def fire_due(
    pool: AsyncConnectionPool[AsyncConnection],
    *,
    batch: int = 100,
    max_catchup: int = DEFAULT_MAX_CATCHUP,
    keep_fires: int = DEFAULT_KEEP_FIRES,
    grace: float = DEFAULT_GRACE,
) -> int:
    """Fire the due occurrences of every due schedule; returns the jobs enqueued.

    ``max_catchup`` bounds the missed occurrences one ``catchup="all"`` schedule
    fires at once; ``keep_fires`` is how many ledger rows each schedule keeps.
    """
    if batch < 1 or max_catchup < 1 or keep_fires < 1 or grace < 0:
        raise ValueError("batch, max_catchup and keep_fires must be positive, grace not negative")
    # Enough to hold every on-time occurrence (at most one a second) besides the
    # missed ones the ledger keeps.
    window = keep_fires + max_catchup + math.ceil(grace) + 2
    enqueued = 0
    failed: list[str] = []
    while True:
        async with pool.connection() as conn, conn.transaction():
            cur = await conn.execute(SCHEDULE_CLAIM_DUE, {"limit": batch, "failed": failed})
            rows = [_Due.of(row) for row in await cur.fetchall()]
            fired: list[str] = []
            for due in rows:
                try:
                    async with conn.transaction():  # a savepoint: one bad schedule
                        count = await _fire(conn, due, max_catchup, grace, window)
                except Exception as exc:
                    if is_transient_db_error(exc):
                        raise
                    await _back_off(conn, due, exc)
                    failed.append(due.name)
                    continue
                enqueued += count
                fired.append(due.name)
            if fired:
                await conn.execute(
                    SCHEDULE_FIRE_PRUNE,
                    {"names": fired, "keep": keep_fires, "limit": PRUNE_BATCH},
                )
        # A failed schedule now waits out its backoff, and this round passes it by
        # anyway: a full batch of failing ones holds back none due after them.
        if len(rows) < batch:
            return enqueued


async def _back_off(conn: AsyncConnection, due: _Due, exc: Exception) -> None:
    """Say on the schedule and in the log why its firing failed, and when it will be
    tried again."""
    error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_LENGTH]
    cur = await conn.execute(
        SCHEDULE_FAILED,
        {"name": due.name, "error": error, "base": FAILURE_BACKOFF, "cap": FAILURE_BACKOFF_CAP},
    )
    row = await cur.fetchone()
    failures, retry_at = row if row else (None, None)
    log.error(
        "relay.schedule_failed",
        exc_info=exc,
        extra={
            "schedule": due.name,
            "error": error,
            "failures": failures,
            "retry_at": retry_at.isoformat() if retry_at else None,
            "why": "its firing raised; the schedule waits, the others go on",
        },
    )


async def seconds_until_due(pool: AsyncConnectionPool[AsyncConnection]) -> float | None:
    """Seconds until the next occurrence of an active schedule is due (0 or less:
    one is due now), or None when there is no active schedule."""
    async with pool.connection() as conn:
        row = await (await conn.execute(SCHEDULE_NEXT_DUE)).fetchone()
    return None if row is None or row[0] is None else float(row[0])


async def _fire(
    conn: AsyncConnection, due: _Due, max_catchup: int, grace: float, window: int
) -> int:
    rule = Recurrence.from_row(due.cron, due.every_seconds, due.timezone)
    plan = plan_fires(
        rule,
        due.next_fire_at,
        due.db_now,
        catchup=due.catchup,
        max_catchup=max_catchup,
        grace=grace,
        window=window,
    )
    if plan.unrecorded:
        log.warning(
            "relay.schedule_occurrences_unrecorded",
            extra={
                "schedule": due.name,
                "from": plan.unrecorded[0].isoformat(),
                "until": plan.unrecorded[1].isoformat(),
                "why": "too far behind to record each one",
            },
        )
    jobs: dict[datetime, str] = {}
    fires: list[dict[str, Any]] = []
    for decision in plan.decisions:
        job_id = None
        if decision.skip_reason is None:
            job = due.template.job(due.dedup_key(decision.at))
            job_id, row = to_row(job, NO_PAYLOAD_LIMIT)
            jobs[decision.at] = _with_occurrence(row, decision.at)
        fires.append(
            {
                "scheduled_for": decision.at.isoformat(),
                "outcome": "skipped" if job_id is None else "enqueued",
                "skip_reason": decision.skip_reason,
                "job_id": None if job_id is None else str(job_id),
            }
        )
    recorded = await _record(conn, due, fires)
    ours = [(at, job_id) for at, job_id in recorded if job_id is not None]
    if ours:
        await _enqueue(conn, due, [(at, job_id, jobs[at]) for at, job_id in ours])
    _log_fired(due, plan, recorded)
    last = plan.decisions[-1].at if plan.decisions else None
    await conn.execute(
        SCHEDULE_ADVANCE,
        {"name": due.name, "next_fire_at": plan.next_fire_at, "last_fire_at": last},
    )
    return len(ours)


def _with_occurrence(row: str, at: datetime) -> str:
    """The job's row (a JSON object, from to_row) with the occurrence it is for:
    job.scheduled_for. Spliced in, as to_row splices the payload."""
    return f'{row[:-1]},"scheduled_for":{json.dumps(at.astimezone(UTC).isoformat())}}}'


async def _record(
    conn: AsyncConnection, due: _Due, fires: list[dict[str, Any]]
) -> list[tuple[datetime, Any]]:
    if not fires:
        return []
    cur = await conn.execute(
        SCHEDULE_FIRE_RECORD_MANY, {"name": due.name, "fires": json.dumps(fires)}
    )
    return [(at.astimezone(UTC), job_id) for at, job_id in await cur.fetchall()]


async def _enqueue(conn: AsyncConnection, due: _Due, jobs: list[tuple[datetime, Any, str]]) -> None:
    """Insert the recorded occurrences' jobs and wake-ups, as outbox.enqueue does."""
    document = "[" + ",".join(row for _, _, row in jobs) + "]"
    insert = JOB_INSERT_MANY if due.template.tags else JOB_INSERT_PLAIN_MANY
    cur = await conn.execute(insert, {"jobs": document})
    inserted = {row[0] for row in await cur.fetchall()}
    taken = [(at, job_id) for at, job_id, _ in jobs if job_id not in inserted]
    if not taken:
        return
    # A job with the occurrence's dedup key exists already (a schedule deleted and
    # made again under its old name, say): the record points at that job.
    keys = [{"job_type": due.template.job_type, "dedup_key": due.dedup_key(at)} for at, _ in taken]
    cur = await conn.execute(JOB_FIND_BY_DEDUP_MANY, {"keys": json.dumps(keys)})
    existing = {key: job_id for _, key, job_id in await cur.fetchall()}
    for at, _ in taken:
        # KeyError if that job vanished meanwhile: the savepoint rolls back, and the
        # next round records the occurrence afresh.
        job_id = existing[due.dedup_key(at)]
        await conn.execute(
            SCHEDULE_FIRE_SET_JOB, {"name": due.name, "scheduled_for": at, "job_id": job_id}
        )
    log.info(
        "relay.schedule_job_existed",
        extra={"schedule": due.name, "count": len(taken), "why": "dedup key taken"},
    )


def _log_fired(due: _Due, plan: Plan, recorded: list[tuple[datetime, Any]]) -> None:
    skipped = sum(1 for d in plan.decisions if d.skip_reason is not None)
    if len(recorded) < len(plan.decisions):
        # Another transaction recorded these first: the ledger did its job.
        log.info(
            "relay.schedule_fire_conflict",
            extra={"schedule": due.name, "count": len(plan.decisions) - len(recorded)},
        )
    if skipped:
        log.info(
            "relay.schedule_caught_up",
            extra={
                "schedule": due.name,
                "catchup": due.catchup,
                "skipped": skipped,
                "fired": len(plan.decisions) - skipped,
            },
        )
