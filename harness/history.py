"""A long history of finished jobs and a small backlog, written in one statement,
for the tests and the benchmark of the operator surface's reads; the job lists they
plan over it, and a page's token from the middle of it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import psycopg

from hybrid_jobs.jobctl.service import queries
from hybrid_jobs.jobctl.service.queries import JobList
from hybrid_jobs.schema.states import JobState

# Jobs i = 1..history finished over the span (UUIDv7 ids, in creation order),
# mostly succeeded: failed when i % 100 is in [94, 98), cancelled in [98, 100),
# the failures only among the oldest `failures_until` of them (an incident long
# ago, none since: the case a planner that assumes an even spread gets wrong).
# Jobs history+1..history+backlog wait or run, newer than all of them.
FILL = """
INSERT INTO jobs (job_id, job_type, queue, tenant, state, attempt_count, max_attempts,
                  run_after, created_at, started_at, finished_at, last_error_code,
                  lease_owner, lease_expires_at)
SELECT (lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7'
        || substr(md5(i::text), 1, 3) || '8' || substr(md5(i::text), 4, 15))::uuid,
       'type' || mod(i, 10), 'q' || mod(i, 4),
       CASE WHEN mod(i, 3) = 0 THEN 't' || mod(i, 7) END, s.state,
       CASE WHEN s.state = 'QUEUED' THEN 0 ELSE 1 END, 5, at, at,
       CASE WHEN s.state <> 'QUEUED' THEN at END,
       CASE WHEN s.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') THEN at + interval '1 s' END,
       CASE WHEN s.state = 'FAILED' THEN 'Boom' END,
       CASE WHEN s.state = 'RUNNING' THEN 'w1' END,
       CASE WHEN s.state = 'RUNNING' THEN now() + interval '1 min' END
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i
CROSS JOIN LATERAL (
    SELECT CASE WHEN i > %(history)s THEN (CASE WHEN mod(i, 3) = 0 THEN 'RUNNING' ELSE 'QUEUED' END)
                WHEN i > %(failures_until)s OR mod(i, 100) < 94 THEN 'SUCCEEDED'
                WHEN mod(i, 100) < 98 THEN 'FAILED' ELSE 'CANCELLED' END AS state,
           now() - make_interval(secs => %(span)s)
               + make_interval(secs => %(span)s * i / (%(history)s + %(backlog)s + 1)) AS at
) AS s
"""

CHUNK = 200_000


def fill(
    conn: psycopg.Connection,
    history: int,
    backlog: int,
    *,
    span_seconds: float = 86_400,
    failures_until: int | None = None,
) -> None:
    total = history + backlog
    for first in range(1, total + 1, CHUNK):
        conn.execute(
            FILL,
            {
                "first": first,
                "last": min(total, first + CHUNK - 1),
                "history": history,
                "backlog": backlog,
                "span": span_seconds,
                "failures_until": history if failures_until is None else failures_until,
            },
        )


def middle_of_the_failed(conn: psycopg.Connection) -> dict[str, Any]:
    """A later page's token (``after_id``, ``after_finished``) from the middle of the
    failed jobs: a page deep in the history."""
    row = conn.execute(
        "SELECT job_id, finished_at FROM jobs WHERE state = 'FAILED'"
        " ORDER BY finished_at LIMIT 1"
        " OFFSET (SELECT count(*) / 2 FROM jobs WHERE state = 'FAILED')"
    ).fetchone()
    assert row is not None
    return {"after_id": row[0], "after_finished": row[1]}


def job_lists(
    state: JobState | None, filter_sets: Iterable[tuple[str, ...]]
) -> Iterator[tuple[tuple[str, ...], bool, JobList]]:
    """The list statement of ``state`` for each set of filters present (of queue,
    job_type, tenant), first page and later page."""
    for filters in filter_sets:
        for after in (False, True):
            yield (
                filters,
                after,
                queries.job_list(
                    state,
                    queue="queue" in filters,
                    job_type="job_type" in filters,
                    tenant="tenant" in filters,
                    after=after,
                ),
            )
