"""A handler's run recorded from inside it, for the tests that count how many ran at
once (tests/apps/concurrency.py, queue_limit.py, weights.py).

A run writes a row to its table as it starts and stamps it as it ends, each in a
connection of its own that commits at once, so what ran at once can be read from
the handlers' own clock whatever became of the attempt. ``payload.seconds``: how
long it runs (while not asked to cancel); ``payload.hang_once``: its first run (by
the table) runs for ten minutes instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from psycopg import sql

from hybrid_jobs import consumers


def runs_table(table: str, extra_columns: str = "") -> str:
    """The table's DDL: a row per run, with ``extra_columns`` ("weight int NOT NULL,")."""
    return f"""
CREATE TABLE IF NOT EXISTS {table} (
    job_id     uuid NOT NULL,
    attempt    int NOT NULL,
    worker     text NOT NULL,
    {extra_columns}
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at   timestamptz
)
"""


def most_at_once(table: str) -> str:
    """The most runs whose handler intervals overlap, from the handlers' own clock (a
    run still going counts as open-ended): at each start, the runs open then."""
    return f"""
SELECT COALESCE(max(n), 0) FROM (
    SELECT count(*) AS n
    FROM {table} AS a JOIN {table} AS b
      ON b.started_at <= a.started_at AND a.started_at < COALESCE(b.ended_at, 'infinity')
    GROUP BY a.job_id, a.attempt, a.worker
) AS s
"""


async def recorded_run(
    job: consumers.Job, table: str, extra: Mapping[str, object] | None = None
) -> None:
    """Run ``job`` as the payload says, its start and end written to ``table`` (with
    the ``extra`` columns' values)."""
    payload = job.payload or {}
    name = sql.Identifier(table)
    values = {"job_id": job.id, "attempt": job.attempt, "worker": job.worker, **(extra or {})}
    async with job.connection() as conn:
        cur = await conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE job_id = %s").format(name), [job.id]
        )
        row = await cur.fetchone()
        first = row is not None and row[0] == 0
        await conn.execute(
            sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                name,
                sql.SQL(", ").join(map(sql.Identifier, values)),
                sql.SQL(", ").join(sql.Placeholder() * len(values)),
            ),
            list(values.values()),
        )
    try:
        hang = first and payload.get("hang_once")
        seconds = 600.0 if hang else float(payload.get("seconds", 0.05))
        deadline = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < deadline and not job.cancel_requested:
            await asyncio.sleep(0.02)
        if job.cancel_requested:
            raise consumers.Cancel("stopped on request")
    finally:
        async with job.connection() as conn:
            await conn.execute(
                sql.SQL(
                    "UPDATE {} SET ended_at = clock_timestamp()"
                    " WHERE job_id = %s AND attempt = %s AND worker = %s"
                ).format(name),
                [job.id, job.attempt, job.worker],
            )
