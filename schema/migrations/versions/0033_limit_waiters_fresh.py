"""The waiters a freed concurrency-limit slot wakes, read as they are now

concurrency_limit_waiters(job_type, n, free, ending): the ``n`` oldest jobs of the
type turned down for its limit (CONCURRENCY_LIMIT) that fit ``free`` slots, those
of a queue that runs first, leaving out the leases ``ending``. An end of a lease
calls it once it holds the type's concurrency_limits row. Read in the ending
statement itself, the waiters were those of the statement's snapshot, taken before
it waited for that row: a claim holding the row then turned a job down for the full
limit and committed, and the job, not turned down yet in that snapshot, was not
found. It waited with no wake-up and the slot free, until the orphan walk. A
VOLATILE function's query takes a snapshot of its own, when it runs: after the lock,
so it sees what the claim committed. (VOLATILE and SET keep it from being inlined
into the statement, which would read the statement's snapshot again.)

Takes no lock on any table: CREATE FUNCTION writes the catalog only.
"""

from __future__ import annotations

from alembic import op

revision: str = "0033"
down_revision: str | None = "0032"

_CLAIMABLE = "'QUEUED', 'RETRY_WAIT'"


def _pass(number: int, queue_runs: bool) -> str:
    runs = (
        "\n       AND NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.queue = w.queue AND p.paused)"
        if queue_runs
        else ""
    )
    return f"""(SELECT w.job_id, w.queue, w.tenant, w.priority, {number} AS pass
     FROM jobs AS w
     WHERE w.job_type = p_job_type AND w.state IN ({_CLAIMABLE})
       AND w.delay_reason = 'CONCURRENCY_LIMIT'
       AND w.run_after <= now() AND COALESCE(w.weight, 1) <= p_free
       AND w.job_id <> ALL (p_ending){runs}
     ORDER BY w.job_id
     LIMIT p_n)"""


_FUNCTION = f"""
CREATE FUNCTION concurrency_limit_waiters(
    p_job_type text, p_n int, p_free int, p_ending uuid[]
) RETURNS TABLE (job_id uuid, queue text, tenant text, priority smallint)
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
AS $$
SELECT c.job_id, c.queue, c.tenant, c.priority
FROM (
    SELECT DISTINCT ON (c.job_id) c.*
    FROM (
    {_pass(1, True)}
    UNION ALL
    {_pass(2, False)}
    ) AS c
    ORDER BY c.job_id, c.pass
) AS c
ORDER BY c.pass, c.job_id
LIMIT p_n
$$
"""


def upgrade() -> None:
    op.execute(_FUNCTION)


def downgrade() -> None:
    op.execute("DROP FUNCTION concurrency_limit_waiters(text, int, int, uuid[])")
