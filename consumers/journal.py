"""The line a person watches: one INFO line per job that succeeded, as Celery's
worker prints one per task (failed attempts have their own lines, in the reporter).

Bounded: a line costs about a tenth of a millisecond to format and write, which at
thousands of jobs a second would cost more than the jobs. Past ``LINES_PER_SECOND``
lines in a second, the rest are counted by job type and told in one line when the
second is over.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from hybrid_jobs.consumers.job import Job

log = logging.getLogger("consumer")

LINES_PER_SECOND = 20


class Journal:
    def __init__(self) -> None:
        self.second_began = 0.0
        self.lines = 0
        self.untold: Counter[str] = Counter()
        self._summary: asyncio.TimerHandle | None = None

    def succeeded(self, job: Job) -> None:
        now = time.monotonic()
        if now - self.second_began >= 1.0:
            self.second_began, self.lines = now, 0
        if self.lines < LINES_PER_SECOND:
            self.lines += 1
            log.info(
                "consumer.job_succeeded",
                extra={
                    "job_id": str(job.id),
                    "job_type": job.job_type,
                    "queue": job.queue,
                    "attempt": job.attempt,
                    "ran_ms": None if job.ran_seconds is None else round(job.ran_seconds * 1e3, 1),
                },
            )
            return
        self.untold[job.job_type] += 1
        if self._summary is None:
            wait = self.second_began + 1.0 - now
            self._summary = asyncio.get_running_loop().call_later(wait, self.tell_untold)

    def tell_untold(self) -> None:
        self._summary = None
        if self.untold:
            log.info(
                "consumer.jobs_succeeded",
                extra={
                    "count": sum(self.untold.values()),
                    "job_types": dict(self.untold),
                    "why": f"more than {LINES_PER_SECOND} a second: counted, not listed",
                },
            )
            self.untold.clear()
