"""Handlers for the key tests: `consumer --app tests.apps.keys`.

``keyed`` writes a row to ``key_runs`` as it starts and stamps it as it ends, each
in a connection of its own that commits at once, so the intervals in which
handlers of one key ran can be checked for overlap whatever became of the
attempt. ``payload.fail_attempts``: the first attempts that raise (retried);
``payload.permanent_attempts``: the first attempts that fail for good;
``payload.seconds``: how long it runs (while not asked to cancel);
``payload.hang_once``: its first run (by this table, whatever attempt number a
give-back refunded) runs for ten minutes instead.
"""

from __future__ import annotations

import asyncio

from hybrid_jobs import consumers

RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS key_runs (
    job_id     uuid NOT NULL,
    key        text,
    attempt    int NOT NULL,
    worker     text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at   timestamptz
)
"""

# Pairs of runs of one key whose handler intervals overlap (a run still going counts
# as open-ended), from the handlers' own clock.
OVERLAPS = """
SELECT a.key, a.job_id, b.job_id
FROM key_runs AS a JOIN key_runs AS b
  ON a.key = b.key AND (a.job_id, a.attempt) < (b.job_id, b.attempt)
 AND a.started_at < COALESCE(b.ended_at, 'infinity')
 AND b.started_at < COALESCE(a.ended_at, 'infinity')
"""


@consumers.handler("keyed", max_attempts=5, backoff=consumers.Backoff(base=0.3, cap=0.5))
async def keyed(job: consumers.Job) -> None:
    payload = job.payload or {}
    async with job.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM key_runs WHERE job_id = %s", [job.id])
        row = await cur.fetchone()
        first = row is not None and row[0] == 0
        await conn.execute(
            "INSERT INTO key_runs (job_id, key, attempt, worker) VALUES (%s, %s, %s, %s)",
            [job.id, payload.get("key"), job.attempt, job.worker],
        )
    try:
        seconds = 600.0 if first and payload.get("hang_once") else payload.get("seconds", 0.05)
        deadline = asyncio.get_running_loop().time() + float(seconds)
        while asyncio.get_running_loop().time() < deadline and not job.cancel_requested:
            await asyncio.sleep(0.02)
        if job.cancel_requested:
            raise consumers.Cancel("stopped on request")
        if job.attempt <= int(payload.get("permanent_attempts", 0)):
            raise consumers.Permanent("bad input", code="BAD_INPUT")
        if job.attempt <= int(payload.get("fail_attempts", 0)):
            raise RuntimeError(f"an injected failure, attempt {job.attempt}")
    finally:
        async with job.connection() as conn:
            await conn.execute(
                "UPDATE key_runs SET ended_at = clock_timestamp()"
                " WHERE job_id = %s AND attempt = %s AND worker = %s",
                [job.id, job.attempt, job.worker],
            )
