"""Handlers for the job weight tests: `consumer --app tests.apps.weights`.

``weighed`` writes a row to ``weight_runs`` (with the job's weight and the worker)
as it starts and stamps it as it ends, each in a connection of its own that commits
at once, so the most slots a worker's running jobs took at once can be read from the
handlers' own clock. ``payload.seconds``: how long it runs (while not asked to
cancel); ``payload.hang_once``: its first run (by this table) runs for ten minutes.
``weighed_sync`` is a plain function (it runs on a thread) that sleeps
``payload.seconds``.
"""

from __future__ import annotations

import asyncio
import time

from hybrid_jobs import consumers

RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS weight_runs (
    job_id     uuid NOT NULL,
    attempt    int NOT NULL,
    worker     text NOT NULL,
    weight     int NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at   timestamptz
)
"""

# The most slots one worker's runs held at once, from the handlers' own clock (a
# run still going counts as open-ended): at each start, the weights of that
# worker's runs open then.
MOST_SLOTS_AT_ONCE = """
SELECT COALESCE(max(n), 0) FROM (
    SELECT sum(b.weight) AS n
    FROM weight_runs AS a JOIN weight_runs AS b
      ON b.worker = a.worker
     AND b.started_at <= a.started_at AND a.started_at < COALESCE(b.ended_at, 'infinity')
    GROUP BY a.job_id, a.attempt, a.worker
) AS s
"""


@consumers.handler("weighed", max_attempts=3)
async def weighed(job: consumers.Job) -> None:
    payload = job.payload or {}
    async with job.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM weight_runs WHERE job_id = %s", [job.id])
        row = await cur.fetchone()
        first = row is not None and row[0] == 0
        await conn.execute(
            "INSERT INTO weight_runs (job_id, attempt, worker, weight) VALUES (%s, %s, %s, %s)",
            [job.id, job.attempt, job.worker, job.weight],
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
                "UPDATE weight_runs SET ended_at = clock_timestamp()"
                " WHERE job_id = %s AND attempt = %s AND worker = %s",
                [job.id, job.attempt, job.worker],
            )


@consumers.handler("weighed_sync", max_attempts=3)
def weighed_sync(job: consumers.Job) -> None:
    time.sleep(float((job.payload or {}).get("seconds", 0.05)))
