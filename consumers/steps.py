"""Resumable steps: the finished steps of a job, read once per attempt, and the
fenced record of each new one (``job.step`` in consumers/job.py is the handler's
side)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from hybrid_jobs.consumers.errors import LeaseLost
from hybrid_jobs.consumers.outcome import encode_result
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.tables import MAX_STEP_NAME_LENGTH


def step_name(name: object) -> str:
    """``name`` if it can name a step, else a TypeError / ValueError saying why (at the
    call, before the step runs)."""
    if not isinstance(name, str):
        raise TypeError(f"a step's name must be a str, not {type(name).__name__}")
    if not 1 <= len(name) <= MAX_STEP_NAME_LENGTH:
        raise ValueError(f"a step's name must be 1 to {MAX_STEP_NAME_LENGTH} characters")
    if "\x00" in name or not name.isprintable():
        raise ValueError("a step's name must be printable text (no NUL, no control characters)")
    return name


def step_result(name: str, value: Any) -> tuple[str | None, Any]:
    """The step's result as stored (JSON text, None for None) and as every attempt
    gets it back (the JSON decoded: a tuple comes back as a list). A value that
    cannot be stored is refused with a ValueError: a job's result is replaced by a
    note, but a step's is what later attempts resume with."""
    encoded, refused = encode_result(value)
    if refused is not None:
        raise ValueError(f"step {name!r} returned a result that cannot be recorded: {refused}")
    return encoded, None if encoded is None else json.loads(encoded)


class StepLog:
    """One attempt's view of its job's steps: those finished (by this attempt or
    earlier ones), read at the first call and kept; new ones recorded through the
    fence, on the consumer's pool."""

    def __init__(
        self,
        job_id: uuid.UUID,
        generation: int,
        worker: str,
        pool: AsyncConnectionPool[AsyncConnection],
    ) -> None:
        self._job_id, self._generation, self._worker = job_id, generation, worker
        self._pool = pool
        self._finished: dict[str, Any] | None = None

    async def finished(self) -> dict[str, Any]:
        """Step name → its recorded result."""
        if self._finished is None:
            async with self._pool.connection() as conn:
                cur = await conn.execute(q.JOB_STEP_LIST, {"job_id": self._job_id})
                rows = await cur.fetchall()
            self._finished = {
                name: None if result is None else json.loads(result) for name, result in rows
            }
        return self._finished

    async def record(self, name: str, encoded: str | None) -> Any:
        """Records the step's result (JSON text) and returns the result recorded:
        this one, or the first of two runs of the same step at once. LeaseLost if
        this worker no longer holds the job: nothing was recorded."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                q.JOB_STEP_RECORD,
                {
                    "job_id": self._job_id,
                    "generation": self._generation,
                    "worker": self._worker,
                    "name": name,
                    "result": encoded,
                },
            )
            row = await cur.fetchone()
        if row is None:
            raise LeaseLost(
                f"job {self._job_id} generation {self._generation} is no longer held by"
                f" {self._worker}: step {name!r} was not recorded"
            )
        value = None if row[0] is None else json.loads(row[0])
        if self._finished is not None:
            self._finished[name] = value
        return value
