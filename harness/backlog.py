"""A backlog of waiting jobs, each with its unsent wake-up, in two statements: for the
test and the benchmark of the re-waker and the orphan backstop, at sizes that would
take minutes to enqueue one by one."""

from __future__ import annotations

import psycopg

# Ids in creation order, as UUIDv7 are; created and due an hour ago, so nothing is
# early and every job is old enough for the re-waker's and the backstop's grace.
BACKLOG = (
    """
    INSERT INTO jobs (job_id, job_type, queue, created_at, run_after)
    SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(i), 12, '0'))::uuid, %(job_type)s,
           %(queue)s, now() - interval '1 hour', now() - interval '1 hour'
    FROM generate_series(1, %(n)s) AS i
    """,
    """
    INSERT INTO outbox (job_id, queue, available_at)
    SELECT job_id, queue, run_after FROM jobs WHERE queue = %(queue)s
    """,
)


def build_backlog(
    conn: psycopg.Connection, n: int, queue: str = "default", job_type: str = "noop"
) -> None:
    """Insert ``n`` waiting jobs of ``job_type`` on ``queue``, a queue with no jobs yet
    (the ids are 1 to n, and every job of it gets a wake-up), and their wake-ups."""
    for statement in BACKLOG:
        conn.execute(statement, {"n": n, "queue": queue, "job_type": job_type})
