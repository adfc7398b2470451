"""Handlers for the job weight tests: `consumer --app tests.apps.weights`.

``weighed`` records its runs in ``weight_runs`` with the job's weight
(tests/apps/recorded.py), so the most slots a worker's running jobs took at once can
be read from the handlers' own clock.
``weighed_sync`` is a plain function (it runs on a thread) that sleeps
``payload.seconds``.
"""

from __future__ import annotations

import time

from hybrid_jobs import consumers
from tests.apps.recorded import recorded_run, runs_table

RUNS_TABLE = runs_table("weight_runs", "weight int NOT NULL,")

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
    await recorded_run(job, "weight_runs", {"weight": job.weight})


@consumers.handler("weighed_sync", max_attempts=3)
def weighed_sync(job: consumers.Job) -> None:
    time.sleep(float((job.payload or {}).get("seconds", 0.05)))
