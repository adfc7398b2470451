"""Waking a queue: the relay's one decision, and the publish that carries it out.

For one queue, in one transaction: the statement OUTBOX_WAKE_QUEUE picks the due
wake-ups to send now (within the queue's window, highest priority first, fair
between tenants, oldest first) and marks them sent. A queue whose waiting jobs
have no tenant pays for no fair share: OUTBOX_WAKE_PLAIN decides it (by priority,
then age) and only says so when a tenant's wake-up waits, for OUTBOX_WAKE_QUEUE
to decide instead. The relay publishes the chosen ones, packed several ids to a
message when there are several, waits for the broker's confirms, and commits. A
failure anywhere rolls the marks back and the rows go out again: a wake-up can be
published twice, never lost. A failure that is the queue's own (QueueFailure)
backs off that queue alone (relay/backoff.py).

The commit is asynchronous (the relay's connections run with synchronous_commit
off, see plumbing/db.py): if the database crashed before flushing it, the marks
would be lost and the wake-ups sent again, which costs a duplicate wake-up and
nothing more; in exchange the relay does not wait for a disk flush per batch.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

import psycopg.errors
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from hybrid_jobs.plumbing import tracing
from hybrid_jobs.plumbing.db import native
from hybrid_jobs.plumbing.logfmt import describe_error
from hybrid_jobs.relay.broker import Publisher, QueueFailure, WakeUp, pack
from hybrid_jobs.relay.pace import pace
from hybrid_jobs.relay.spread import pack_limit
from hybrid_jobs.schema.queries import (
    JOB_TRACE_CONTEXTS,
    OUTBOX_DUE_QUEUES,
    OUTBOX_WAKE_PLAIN,
    OUTBOX_WAKE_QUEUE,
)

log = logging.getLogger("relay")

# Fault injection for the crash tests: with this set to "kill-after-publish" the
# relay kills itself between the broker's confirms and the commit that marks the
# batch sent. Never set it anywhere else.
FAULT_ENV = "RELAY_FAULT_INJECTION"
# How long the publish spans wait to read the woken jobs' trace contexts.
TRACE_READ_SECONDS = 2.0
# How many of a queue's unsent wake-ups the decision reads in one go to find the
# tenants' first ones (OUTBOX_WAKE_QUEUE's bulk): this many per tenant its last
# pass found (one before any pass has). An index row read costs a small part of a
# probe, so four rows a tenant cost less than the probe per tenant they save where
# tenants have a few wake-ups each, and a little where they have many.
BULK_PER_TENANT = 4
# From this many tenants with a backlog (as the last full read found them), a pass
# asks for the next tenants only (OUTBOX_WAKE_QUEUE's near): it reads a few times
# the room of the first wake-ups across tenants, not every tenant's first.
NEAR_FROM_TENANTS = 64
# The first wake-ups across tenants such a pass reads, per wake-up of room the last
# pass had (at least NEAR_SCAN_MIN rows, at most NEAR_SCAN_TENANTS per tenant: a
# longer scan costs more than reading every tenant): enough to find that many
# tenants whose turn comes next where each has a few wake-ups in the backlog.
# Doubled (up to NEAR_SCAN_MOST_PER_ROOM) each time a pass tried and found too few,
# and brought back down by one each time one found enough: where a queue's tenants'
# wake-ups are interleaved, a short scan meets mostly tenants that were just served.
NEAR_SCAN_PER_ROOM = 2
NEAR_SCAN_MOST_PER_ROOM = 32
NEAR_SCAN_MIN = 32
NEAR_SCAN_TENANTS = 2
# A queue where even the longest scan found too few (its tenants' first wake-ups
# lie behind many others, say) is read whole, without trying, for this long; so is
# one where a scan as long as reading every tenant (NEAR_SCAN_TENANTS a tenant) was
# not enough: trying again costs a full read's worth of rows, and the full read
# besides. (At 1,000 tenants with many wake-ups each, the round comes back to the
# first tenants every few passes, and each time the next tenants cannot be shown
# to go first; reading only them saved nothing there.)
NEAR_REST_SECONDS = 10.0
# A full read at least this often, per queue: it notes every tenant's reason for
# waiting (explain, the metrics), which a pass that reads the next tenants notes for
# those alone. Where a full read takes long (10,000 tenants: a sixth of a second
# and more), less often: at most FULL_READ_SHARE of the time goes to full reads.
FULL_READ_SECONDS = 1.0
FULL_READ_SHARE = 0.1
# A queue where a tenant's wake-up waited is decided whole (OUTBOX_WAKE_QUEUE) for
# this long before a pass tries the decision without fair share (OUTBOX_WAKE_PLAIN)
# again: that one's probe for tenants, when it finds one, is a statement spent.
TENANTED_SECONDS = 1.0


@dataclass
class _Seen:
    """Per queue, what the relay's last passes over it found."""

    # tenants with a backlog, as the last full read found them
    tenants: int = 1
    # the room of the last pass that read the backlog
    room: int = 0
    # when the last full read ended (time.monotonic), and how long it took
    full_at: float = float("-inf")
    full_took: float = 0.0
    # the scan of a pass that asks for the next tenants, per wake-up of room
    per_room: int = NEAR_SCAN_PER_ROOM
    # no pass asks for the next tenants before this (time.monotonic)
    resting_until: float = float("-inf")
    # when a pass last found a tenant's wake-up waiting (time.monotonic)
    tenanted_at: float = float("-inf")

    def plain(self, now: float) -> bool:
        """Whether to try the decision without fair share first."""
        return now - self.tenanted_at >= TENANTED_SECONDS

    def params(self, now: float) -> dict[str, Any]:
        every = max(FULL_READ_SECONDS, self.full_took / FULL_READ_SHARE)
        near = (
            self.tenants >= NEAR_FROM_TENANTS
            and now - self.full_at < every
            and now >= self.resting_until
        )
        return {
            "bulk": BULK_PER_TENANT * max(1, self.tenants),
            "near": near,
            "scan": max(NEAR_SCAN_MIN, min(self._scan_per_room(), self._scan_longest())),
        }

    def _scan_per_room(self) -> int:
        return self.per_room * self.room

    def _scan_longest(self) -> int:
        """The scan as long as reading every tenant: no scan is longer."""
        return NEAR_SCAN_TENANTS * self.tenants

    def read(
        self, room: int, tenants: int | None, near: bool | None, at: float, took: float = 0.0
    ) -> None:
        """Note a pass that read the backlog, ending ``at`` after ``took`` seconds:
        every tenant (``tenants`` found), or the next ones only. ``near``: whether
        the next tenants were enough, when the pass tried them (None: it did not)."""
        # whether params() asked this pass for the longest scan (nothing changes
        # what it read from until here: one pass over a queue at a time)
        longest = self._scan_per_room() >= self._scan_longest()
        self.room = room
        if tenants is not None:
            self.tenants, self.full_at = tenants, at
            if near is None:  # a full read that did not try the next tenants first
                self.full_took = took
        if near is False:  # tried, and found too few: it read every tenant
            if self.per_room >= NEAR_SCAN_MOST_PER_ROOM or longest:
                self.resting_until = at + NEAR_REST_SECONDS
            self.per_room = min(NEAR_SCAN_MOST_PER_ROOM, 2 * self.per_room)
        elif near:
            self.per_room = max(NEAR_SCAN_PER_ROOM, self.per_room - 1)


# Per pool, per queue: what its last passes found.
_seen: weakref.WeakKeyDictionary[AsyncConnectionPool[AsyncConnection], dict[str, _Seen]] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class Woken:
    """What one pass over a queue did."""

    sent: int
    messages: int
    # Another relay (or drainer) had the queue: nothing was decided here.
    busy: bool
    # Due wake-ups were held back: the window was full, a tenant capped, or a
    # tenant waiting its fair turn.
    held: bool
    room: int


@dataclass(frozen=True)
class WakeLimits:
    batch: int
    # Wake-ups in flight per queue: fixed, or None for twice the capacity of the
    # queue's live consumers, at least min_window, plus the slack (relay/pace.py).
    window: int | None
    min_window: int
    pack: int
    publish_timeout: float
    worker_ttl: float


async def due_queues(pool: AsyncConnectionPool[AsyncConnection]) -> list[str]:
    async with pool.connection() as conn:
        return [row[0] for row in await (await conn.execute(OUTBOX_DUE_QUEUES)).fetchall()]


async def wake_queue(
    pool: AsyncConnectionPool[AsyncConnection],
    publisher: Publisher,
    queue: str,
    limits: WakeLimits,
) -> Woken:
    """Raises QueueFailure for a failure of this queue alone (RabbitMQ refused its
    wake-ups, or its decision timed out), anything else for one of the relay's."""
    published: list[_Published] = []
    try:
        woken = await _wake(pool, publisher, queue, limits, published)
    except Exception:
        await _trace(pool, published)
        raise
    await _trace(pool, published)
    return woken


async def _wake(
    pool: AsyncConnectionPool[AsyncConnection],
    publisher: Publisher,
    queue: str,
    limits: WakeLimits,
    published: list[_Published],
) -> Woken:
    # Not in pipeline mode: it would save the round trip of BEGIN, but measured at
    # 200 jobs/s it cost more CPU in psycopg than it saved in waiting.
    await publisher.wait_connected(limits.publish_timeout)
    most = await pack_limit(pool, queue, limits.pack, limits.worker_ttl)
    seen = _seen.setdefault(pool, {}).setdefault(queue, _Seen())
    paced = pace(pool, queue)
    async with pool.connection() as conn, conn.transaction():
        began = time.monotonic()
        params = {
            "queue": queue,
            "limit": limits.batch,
            "window": limits.window,
            "min_window": limits.min_window,
            "slack": paced.slack(limits.batch),
            "worker_ttl": limits.worker_ttl,
        }
        try:
            rows = None
            if seen.plain(began):
                rows = await _decide(conn, OUTBOX_WAKE_PLAIN, params)
                if _summary(rows)[9]:  # a tenant's wake-up waits: decide whole
                    seen.tenanted_at, rows = began, None
            if rows is None:
                began = time.monotonic()  # the whole decision's own time, for the pace
                rows = await _decide(conn, OUTBOX_WAKE_QUEUE, params | seen.params(began))
        except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable) as exc:
            # The statement or lock timeout: something holds or bloats this queue's
            # rows; the other queues' decisions need not wait for it.
            raise QueueFailure(queue, "decision_timeout", describe_error(exc)) from exc
        decided = time.monotonic() - began
        sent = [
            (r[0], r[1], r[2])
            for r in sorted((r for r in rows if r[0] is not None), key=lambda r: r[6])
        ]
        if sent and log.isEnabledFor(logging.DEBUG):  # a trace of each wake-up
            log.debug(
                "relay.decided",
                extra={"t": time.time(), "queue": queue, "job_ids": [str(r[1]) for r in sent]},
            )
        summary = _summary(rows)
        read = summary[7] is not None or bool(summary[8])
        if read:
            seen.read(int(summary[3] or 0), summary[7], summary[8], time.monotonic(), decided)
        # only a decision that read the backlog times that read
        paced.passed(time.monotonic(), len(sent), decided if read else None)
        messages = pack(queue, sent, most)
        if messages:
            began = tracing.now_ns()
            try:
                await publisher.publish(queue, messages, limits.publish_timeout)
            except Exception as exc:
                published.append(_Published(messages, began, tracing.now_ns(), _error(exc)))
                raise
            published.append(_Published(messages, began, tracing.now_ns(), None))
            if log.isEnabledFor(logging.DEBUG):  # a trace of each wake-up, for latency work
                log.debug(
                    "relay.sent",
                    extra={"t": time.time(), "queue": queue, "job_ids": [str(r[1]) for r in sent]},
                )
            if os.environ.get(FAULT_ENV) == "kill-after-publish":
                log.warning("relay.fault_injected", extra={"count": len(sent)})
                os.kill(os.getpid(), signal.SIGKILL)
    return Woken(
        sent=len(sent),
        messages=len(messages),
        busy=not summary[4],
        held=bool(summary[5]),
        room=int(summary[3] or 0),
    )


async def _decide(conn: AsyncConnection, statement: str, params: dict[str, Any]) -> list[Any]:
    """The decision's rows: the sent wake-ups and the summary (id NULL)."""
    return await (await native(statement).execute(conn, params)).fetchall()


def _summary(rows: list[Any]) -> Any:
    # last, as the statements write it (UNION ALL promises no order: looked for)
    return next(r for r in reversed(rows) if r[0] is None)


@dataclass(frozen=True)
class _Published:
    messages: list[WakeUp]
    began: int
    ended: int
    error: tuple[str, str] | None


async def _trace(pool: AsyncConnectionPool[AsyncConnection], published: list[_Published]) -> None:
    """The publish spans, when a tracer provider records: after the wake-up's
    transaction, which tracing must neither lengthen nor fail."""
    if not published or not tracing.recording():
        return
    job_ids = [job_id for p in published for m in p.messages for job_id in m.job_ids]
    try:
        async with asyncio.timeout(TRACE_READ_SECONDS), pool.connection() as conn:
            cur = await conn.execute(JOB_TRACE_CONTEXTS, {"job_ids": job_ids})
            traced = {row[0]: row[1] for row in await cur.fetchall()}
    except Exception as exc:
        log.warning("relay.trace_contexts_unread", extra={"error": describe_error(exc)})
        traced = {}
    for p in published:
        _publish_spans(p.messages, traced, p.began, p.ended, p.error)


def _error(exc: Exception) -> tuple[str, str]:
    if isinstance(exc, QueueFailure):
        return exc.reason, exc.detail
    return type(exc).__qualname__, describe_error(exc)


def _publish_spans(
    messages: list[WakeUp],
    traced: dict[uuid.UUID, Any],
    began: int,
    ended: int,
    error: tuple[str, str] | None,
) -> None:
    """One PRODUCER span per message, linked to the trace of each job it wakes: a
    message carries several jobs, each enqueued in a trace of its own. A message of
    one job is in that job's trace too (a child of the enqueuing span)."""
    for message in messages:
        only = traced.get(message.job_ids[0]) if len(message.job_ids) == 1 else None
        tracing.record(
            f"publish {message.queue}",
            "producer",
            start_ns=began,
            end_ns=ended,
            attributes={
                tracing.MESSAGING_SYSTEM: tracing.SYSTEM,
                tracing.MESSAGING_DESTINATION_NAME: message.queue,
                tracing.MESSAGING_OPERATION_TYPE: "send",
                tracing.MESSAGING_OPERATION_NAME: "publish",
                tracing.MESSAGING_MESSAGE_ID: message.message_id,
                tracing.MESSAGING_BATCH_MESSAGE_COUNT: len(message.job_ids),
                tracing.JOB_QUEUE: message.queue,
            },
            links=[
                (traced.get(job_id), {tracing.JOB_ID: str(job_id)}) for job_id in message.job_ids
            ],
            parent=only,
            error=error,
        )
