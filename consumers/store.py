"""The consumer's side of the jobs table: every read and write goes through here,
by name, to the statements in schema/queries.py."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from consumers.outcome import Outcome
from schema import queries as q
from schema.states import LEASED, TERMINAL, JobState


@dataclass(frozen=True)
class Claimed:
    job_id: uuid.UUID
    job_type: str
    queue: str
    payload: Any
    attempt: int
    max_attempts: int | None
    generation: int
    lease_expires_at: datetime
    created_at: datetime


Fence = tuple[uuid.UUID, int]  # (job_id, lease_generation)


def _fences(held: Sequence[Fence]) -> str:
    return json.dumps([{"job_id": str(i), "generation": g} for i, g in held])


def finish_params(worker: str, batch: Sequence[tuple[uuid.UUID, int, Outcome]]) -> dict[str, str]:
    """Parameters of JOB_FINISH_MANY for these (job_id, generation, outcome) triples."""
    outcomes = json.dumps(
        [
            {
                "job_id": str(job_id),
                "generation": generation,
                "kind": o.kind,
                "error_code": o.error_code,
                "error_message": o.error_message,
                "delay_seconds": o.delay_seconds,
            }
            for job_id, generation, o in batch
        ],
        ensure_ascii=False,
    )
    return {"outcomes": outcomes, "worker": worker}


async def finish_on(
    conn: AsyncConnection, worker: str, batch: Sequence[tuple[uuid.UUID, int, Outcome]]
) -> dict[uuid.UUID, JobState]:
    """Apply outcomes on ``conn`` (in the caller's transaction); returns the applied
    ones' new states. An outcome missing from the result was stale."""
    cur = await conn.execute(q.JOB_FINISH_MANY, finish_params(worker, batch))
    return {row[0]: JobState(row[1]) for row in await cur.fetchall()}


class JobStore:
    def __init__(
        self, pool: AsyncConnectionPool[AsyncConnection], worker: str, lease_seconds: float
    ) -> None:
        self.pool = pool
        self.worker = worker
        self.lease_seconds = lease_seconds

    async def claim(
        self, job_ids: Sequence[uuid.UUID], budgets: list[dict[str, Any]]
    ) -> list[Claimed]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                q.JOB_CLAIM_MANY,
                {
                    "job_ids": list(job_ids),
                    "budgets": json.dumps(budgets),
                    "worker": self.worker,
                    "lease_seconds": self.lease_seconds,
                },
            )
            return [Claimed(*row) for row in await cur.fetchall()]

    async def held_by_me(self, job_ids: Sequence[uuid.UUID]) -> list[Claimed]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                q.JOB_HELD_BY, {"job_ids": list(job_ids), "worker": self.worker}
            )
            return [Claimed(*row) for row in await cur.fetchall()]

    async def explain_misses(self, job_ids: Sequence[uuid.UUID]) -> Counter[str]:
        """Why each of these deliveries claimed nothing, counted by reason."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(q.JOB_EXPLAIN_MISSES, {"job_ids": list(job_ids)})
            rows = await cur.fetchall()
        reasons: Counter[str] = Counter()
        for _, state, early in rows:
            if state in LEASED:
                reasons["running"] += 1
            elif state in TERMINAL:
                reasons["finished"] += 1
            elif early:
                reasons["early"] += 1
            else:  # claimable and due: a concurrent claim took it between our two looks
                reasons["running"] += 1
        reasons["missing"] = len(set(job_ids)) - len(rows)
        return +reasons

    async def heartbeat(self, held: Sequence[Fence]) -> dict[uuid.UUID, JobState]:
        """Extend the leases still ours; returns their states (CANCEL_REQUESTED shows
        here). A job absent from the result has lost its lease."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                q.JOB_HEARTBEAT_MANY,
                {"jobs": _fences(held), "worker": self.worker, "lease_seconds": self.lease_seconds},
            )
            return {row[0]: JobState(row[1]) for row in await cur.fetchall()}

    async def finish(
        self, batch: Sequence[tuple[uuid.UUID, int, Outcome]]
    ) -> tuple[dict[uuid.UUID, JobState], set[uuid.UUID]]:
        """Record outcomes; returns (applied: new states, stale ids).

        Safe to call again after a failure: an outcome that did commit makes its
        repeat match nothing, and is then recognised by its attempt row, not
        reported as stale.
        """
        async with self.pool.connection() as conn:
            applied = await finish_on(conn, self.worker, batch)
            missing = [(job_id, gen) for job_id, gen, _ in batch if job_id not in applied]
            recorded: set[uuid.UUID] = set()
            if missing:
                cur = await conn.execute(
                    q.JOB_ATTEMPTS_RECORDED, {"jobs": _fences(missing), "worker": self.worker}
                )
                recorded = {row[0] for row in await cur.fetchall()}
        return applied, {job_id for job_id, _ in missing} - recorded

    async def give_back(self, held: Sequence[Fence]) -> dict[uuid.UUID, JobState]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                q.JOB_GIVE_BACK_MANY, {"jobs": _fences(held), "worker": self.worker}
            )
            return {row[0]: JobState(row[1]) for row in await cur.fetchall()}

    async def ping(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute("SELECT 1")
