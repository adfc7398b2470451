"""Handlers for tests that run a real `consumer --app tests.apps.snooze` process."""

from __future__ import annotations

from hybrid_jobs import consumers

# How many times the job was snoozed so far: its history keeps one row per snooze.
SNOOZES = "SELECT count(*) FROM job_attempts WHERE job_id = %s AND error_code = 'SNOOZED'"


@consumers.handler("snooze_once", max_attempts=1)
async def snooze_once(job: consumers.Job) -> None:
    """Snoozes for ``seconds`` the first time it runs, then succeeds."""
    async with job.connection() as conn:
        cur = await conn.execute(SNOOZES, [job.id])
        row = await cur.fetchone()
    if row is not None and row[0] == 0:
        raise consumers.Snooze(float(job.payload.get("seconds", 1)))
