"""Periodic chores of the relay, each run by one relay at a time.

Each takes its own advisory lock, so two relays never do the same chore at once
and a long one never makes another skip its round.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from hybrid_jobs.relay.broker import Publisher
from hybrid_jobs.schema.locks import LockKey
from hybrid_jobs.schema.queries import (
    JOB_EXPIRE_WAITING,
    JOB_SWEEP_EXPIRED,
    JOB_WAKE_ORPHANS,
    MAINTENANCE_TRY_LOCK,
    OUTBOX_LOST_QUEUES,
    OUTBOX_REWAKE_LOST,
    OUTBOX_SETTLE,
    OUTBOX_WAKE_REFUSED,
    RELAY_EXPIRE,
    TENANT_USAGE_DRIFTED,
    TENANT_USAGE_LOCK,
    TENANT_USAGE_RECONCILE,
    TENANT_USAGE_REFRESH,
    WORKER_EXPIRE,
)

log = logging.getLogger("relay")


# The orphan walk starts below every job id.
_FIRST = uuid.UUID(int=0)

Pool = AsyncConnectionPool[AsyncConnection]


async def _try_lock(conn: AsyncConnection, key: int) -> bool:
    row = await (await conn.execute(MAINTENANCE_TRY_LOCK, {"key": key})).fetchone()
    return bool(row and row[0])


@asynccontextmanager
async def _chore(pool: Pool, key: int) -> AsyncIterator[AsyncConnection | None]:
    """A transaction holding the chore's lock, or None if another relay has it."""
    async with pool.connection() as conn, conn.transaction():
        yield conn if await _try_lock(conn, key) else None


async def sweep_expired(pool: Pool, *, batch: int, default_backoff: float) -> int:
    """Move jobs whose lease expired without a report on, batch by batch."""
    total = 0
    while True:
        async with _chore(pool, LockKey.SWEEP) as conn:
            if conn is None:
                return total
            cur = await conn.execute(
                JOB_SWEEP_EXPIRED, {"limit": batch, "default_backoff": default_backoff}
            )
            rows = await cur.fetchall()
        total += len(rows)
        for job_id, state, worker, run_after in rows:
            log.warning(
                "relay.lease_expired",
                extra={
                    "job_id": str(job_id),
                    "worker": worker,
                    "state": state,
                    "retry_at": run_after.isoformat() if state == "RETRY_WAIT" else None,
                    "action": "swept",
                },
            )
        if len(rows) < batch:
            break
    async with pool.connection() as conn:
        await conn.execute(OUTBOX_SETTLE, {"limit": batch})
    return total


async def expire_waiting(pool: Pool, *, batch: int) -> int:
    """End the waiting jobs past their deadline that no claim looks at (delayed,
    backed off, parked: nobody wakes them before they are due), one bounded batch
    per transaction; how many."""
    total = 0
    while True:
        async with _chore(pool, LockKey.EXPIRE) as conn:
            if conn is None:
                return total
            rows = await (await conn.execute(JOB_EXPIRE_WAITING, {"limit": batch})).fetchall()
        total += len(rows)
        if rows:
            log.info(
                "relay.jobs_expired",
                extra={
                    "count": len(rows),
                    "queues": sorted({queue for _, queue in rows}),
                    "action": "cancelled, code EXPIRED: not started by their deadline",
                },
            )
        if len(rows) < batch:
            return total


async def rewake_lost(pool: Pool, publisher: Publisher, *, grace: float, worker_ttl: float) -> int:
    """Send again the wake-ups that seem lost; how many.

    A wake-up seems lost when it was sent more than ``grace`` seconds ago, its job
    still waits untaken, and its queue holds no ready message in RabbitMQ. The last
    condition keeps a backlog (wake-ups waiting their turn) from being mistaken for
    loss; since the relay keeps at most a window of wake-ups in a queue, lost ones
    eventually leave it with none ready, so they are always found.

    The scan runs under the chore's lock, and so does the repair, each in a short
    transaction of its own (it touches at most the queues' windows); RabbitMQ is
    asked in between, with no transaction open. (Transaction-scoped locks, twice,
    rather than one session lock across: a transaction pooler such as PgBouncer
    carries no session from one transaction to the next.)
    """
    params = {"grace_seconds": grace, "worker_ttl": worker_ttl}
    async with _chore(pool, LockKey.REWAKE) as conn:
        if conn is None:
            return 0
        candidates = await (await conn.execute(OUTBOX_LOST_QUEUES, params)).fetchall()
    if not candidates:
        return 0
    ready = await publisher.ready_counts([queue for queue, _ in candidates])
    empty = [queue for queue, _ in candidates if ready.get(queue, 0) == 0]
    if not empty:
        return 0
    async with _chore(pool, LockKey.REWAKE) as conn:
        if conn is None:
            return 0
        cur = await conn.execute(OUTBOX_REWAKE_LOST, params | {"queues": empty})
        woken = cur.rowcount
    if woken:
        log.warning(
            "relay.rewoke_lost_wakeups",
            extra={"count": woken, "queues": empty, "why": "sent, never taken"},
        )
    return woken


@dataclass
class OrphanWalk:
    """Where the orphan backstop is in its walk of the jobs table by primary key:
    kept by the relay between rounds (a restarted relay starts over, which costs a
    lap, nothing else)."""

    after: uuid.UUID | None = None
    # Times the walk reached the end of the table and started over.
    laps: int = 0


async def wake_orphans(
    pool: Pool, walk: OrphanWalk, *, grace: float, size: int, worker_ttl: float
) -> list[tuple[uuid.UUID, str]]:
    """Read the next ``size`` jobs of the walk and give a wake-up to each one that
    is due, waiting, and has none at all; the (job id, queue) of each woken.

    A bounded slice per call, in its own transaction, so the backstop costs the same
    however many jobs wait, and nothing else waits for it or rolls back with it.
    """
    async with _chore(pool, LockKey.ORPHANS) as conn:
        if conn is None:
            return []
        cur = await conn.execute(
            JOB_WAKE_ORPHANS,
            {
                "after": walk.after or _FIRST,
                "slice": size,
                "grace_seconds": grace,
                "worker_ttl": worker_ttl,
            },
        )
        rows = await cur.fetchall()
    woken = [(job_id, queue) for kind, job_id, queue, _ in rows if kind == "woken"]
    ((_, last, _, read),) = [row for row in rows if row[0] == "slice"]
    if read < size:
        walk.after, walk.laps = None, walk.laps + 1
    else:
        walk.after = last
    if woken:
        log.warning(
            "relay.woke_jobs_without_wakeup",
            extra={
                "count": len(woken),
                "queues": sorted({q for _, q in woken}),
                "why": "due, waiting, and no wake-up at all",
            },
        )
    return woken


async def wake_refused(pool: Pool, *, worker_ttl: float) -> tuple[list[str], bool]:
    """Bring forward the wake-ups turned down for want of a handler, as many as
    live consumers with the handler have free slots: the queue of each, and
    whether any job refused so waits at all."""
    async with _chore(pool, LockKey.REFUSED) as conn:
        if conn is None:
            return [], False
        cur = await conn.execute(OUTBOX_WAKE_REFUSED, {"worker_ttl": worker_ttl})
        rows = await cur.fetchall()
    return [queue for (queue,) in rows if queue is not None], any(q is None for (q,) in rows)


# Tenants repaired per transaction, at most: drift is a bug, rare and small; a
# bound keeps even a large one from holding many counters locked at once.
RECONCILE_BATCH = 100
# Limited tenants whose waiting jobs one usage round counts, stalest first.
USAGE_TENANTS_PER_ROUND = 100


async def reconcile_tenant_slots(pool: Pool, *, batch: int = RECONCILE_BATCH) -> int:
    """Repair any drift between each tenant's count of held slots and the leases
    that hold one; say so when there was some (there should never be).

    The tenants that drifted are found without a lock; only theirs are locked, and
    counted again under the lock, so claims and releases of every other tenant
    never wait for the reconciler."""
    repaired = 0
    while True:
        async with _chore(pool, LockKey.RECONCILE) as conn:
            if conn is None:
                return repaired
            cur = await conn.execute(TENANT_USAGE_DRIFTED, {"limit": batch})
            drifted = [tenant for (tenant,) in await cur.fetchall()]
            rows = []
            if drifted:
                await conn.execute(TENANT_USAGE_LOCK, {"tenants": drifted})
                cur = await conn.execute(TENANT_USAGE_RECONCILE, {"tenants": drifted})
                rows = await cur.fetchall()
        for tenant, recorded, held in rows:
            log.warning(
                "relay.tenant_slots_repaired",
                extra={"tenant": tenant, "recorded": recorded, "held": held},
            )
        repaired += len(rows)
        # A tenant that moved on meanwhile was left alone; the next round looks again.
        if len(drifted) < batch or not rows:
            return repaired


async def refresh_tenant_usage(pool: Pool, *, tenants: int = USAGE_TENANTS_PER_ROUND) -> None:
    """Count the waiting jobs of the limited tenants (max_queued, backpressure)
    counted longest ago, each up to its limit."""
    async with _chore(pool, LockKey.USAGE) as conn:
        if conn is not None:
            await conn.execute(TENANT_USAGE_REFRESH, {"limit": tenants})


async def expire_workers(pool: Pool, *, ttl: float) -> int:
    """Forget consumers and relays not seen for ``ttl`` seconds."""
    async with _chore(pool, LockKey.WORKERS) as conn:
        if conn is None:
            return 0
        gone = await (await conn.execute(WORKER_EXPIRE, {"worker_ttl": ttl})).fetchall()
        relays = await (await conn.execute(RELAY_EXPIRE, {"relay_ttl": ttl})).fetchall()
    if gone:
        log.info("relay.workers_expired", extra={"workers": [w for (w,) in gone]})
    if relays:
        log.info("relay.relays_expired", extra={"relays": [r for (r,) in relays]})
    return len(gone) + len(relays)
