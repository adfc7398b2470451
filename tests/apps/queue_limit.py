"""Handlers for the queue limit tests: `consumer --app tests.apps.queue_limit
--queue-limit reports=3`.

``report`` and ``chart``, two types of queue ``reports``, write a row to
``queue_limit_runs`` as they start and stamp it as they end, each in a connection of
its own that commits at once, so the most runs of the queue at once can be read from
the handlers' own clock whatever became of the attempt. ``payload.seconds``: how
long it runs (while not asked to cancel); ``payload.hang_once``: its first run (by
this table) runs for ten minutes instead. ``free`` is of queue ``default``.
"""

from __future__ import annotations

import asyncio

from hybrid_jobs import consumers

QUEUE = "reports"
LIMIT = 3

RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS queue_limit_runs (
    job_id     uuid NOT NULL,
    attempt    int NOT NULL,
    worker     text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at   timestamptz
)
"""

# The most runs whose handler intervals overlap, from the handlers' own clock (a run
# still going counts as open-ended): at each start, the runs open then.
MOST_AT_ONCE = """
SELECT COALESCE(max(n), 0) FROM (
    SELECT count(*) AS n
    FROM queue_limit_runs AS a JOIN queue_limit_runs AS b
      ON b.started_at <= a.started_at AND a.started_at < COALESCE(b.ended_at, 'infinity')
    GROUP BY a.job_id, a.attempt, a.worker
) AS s
"""


async def _run(job: consumers.Job) -> None:
    payload = job.payload or {}
    async with job.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM queue_limit_runs WHERE job_id = %s", [job.id]
        )
        row = await cur.fetchone()
        first = row is not None and row[0] == 0
        await conn.execute(
            "INSERT INTO queue_limit_runs (job_id, attempt, worker) VALUES (%s, %s, %s)",
            [job.id, job.attempt, job.worker],
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
                "UPDATE queue_limit_runs SET ended_at = clock_timestamp()"
                " WHERE job_id = %s AND attempt = %s AND worker = %s",
                [job.id, job.attempt, job.worker],
            )


@consumers.handler("report", queue=QUEUE, max_attempts=3)
async def report(job: consumers.Job) -> None:
    await _run(job)


@consumers.handler("chart", queue=QUEUE, max_attempts=3)
async def chart(job: consumers.Job) -> None:
    await _run(job)


@consumers.handler("unlimited")
async def unlimited(job: consumers.Job) -> None:
    await asyncio.sleep(float((job.payload or {}).get("seconds", 0.01)))
