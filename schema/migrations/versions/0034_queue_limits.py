"""Concurrency limits per queue, across every consumer

queue_limits holds, per queue given a limit (``consumer --queue-limit QUEUE=N``, or
an operator's ``jobctl limits --queue-limit``), the most leases of its jobs that may
run at once (max_running) and how many run now (running): the claim locks the row,
admits at most the free slots and takes them; every end of a lease that held one
gives it back and wakes the next job turned down for it. The last to write the
limit wins; updated_by names it. A limit removed keeps its row, max_running NULL:
the leases that hold a slot still give it back there as they end, so a limit set
again later counts them (a new row would start at 0 and let the queue run over it).

queues.limited marks a queue that has a row there, written in the same statement
as the row. Every claim already reads its job's queue row (is it paused?): the
mark in that row sends a limited queue's jobs to the claim composed with the limit,
so a job of a queue without one reads nothing more than before.

jobs.queue_limit_held says which leases hold a slot (the ones claimed through the
limit), so an end of a lease gives back exactly what its claim took.
jobs_queue_limit_waiting_idx finds a queue's next job turned down for its limit
(delay_reason QUEUE_CONCURRENCY_LIMIT) in one probe; queue_limit_waiters reads
them, as concurrency_limit_waiters does (migration 0033), with a snapshot taken
after the end of the lease locked the queue's row. The trigger
jobs_queue_limit_hand_on passes a woken waiter's turn on when it ends without
running (cancelled, past its deadline, its parent failed). The trigger
jobs_limit_turn_passed passes a limit's turn on when a job woken for it is turned
down for something else and waits on: a job woken for its queue's freed slot that
its type's limit (or its key, its tenant...) turns down, or one woken for its
type's freed slot that its queue's limit turns down, would hold the turn while the
slot stayed free and the next job that could use it slept.

Locks: the new table takes none on another. The added columns have a constant
default, so they rewrite nothing: ACCESS EXCLUSIVE on jobs and on queues for a
moment. The index is built with a SHARE lock on jobs (writes to jobs wait while it
is built; it reads the whole table but holds only the rows turned down for a queue
limit, none yet). The triggers take SHARE ROW EXCLUSIVE on jobs for a moment.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0034"
down_revision: str | None = "0033"

_CLAIMABLE = "'QUEUED', 'RETRY_WAIT'"
_WAITING = f"state IN ({_CLAIMABLE}) AND delay_reason = 'QUEUE_CONCURRENCY_LIMIT'"
_WAITING_W = f"w.state IN ({_CLAIMABLE}) AND w.delay_reason = 'QUEUE_CONCURRENCY_LIMIT'"

# The queue is matched as a range of one value and named in the order, where an
# equality would do: given an equality, the planner takes the queue for a constant,
# orders by job_id alone, and may walk the primary key from its start (every job of
# every queue, finished ones first) expecting to meet a waiter soon. Ordered by
# (queue, job_id), only jobs_queue_limit_waiting_idx gives that order, and the
# walk starts at the queue's oldest waiter.
_THE_QUEUE = "w.queue >= {q} AND w.queue <= {q}"

# The p_n oldest jobs of the queue turned down for its limit that fit p_free slots,
# leaving out the leases p_ending; p_free NULL (the limit removed): every one,
# whatever it weighs. VOLATILE with SET: never inlined, so its query
# takes its own snapshot, after the caller locked the queue's row (see 0033).
_WAITERS = f"""
CREATE FUNCTION queue_limit_waiters(
    p_queue text, p_n int, p_free int, p_ending uuid[]
) RETURNS TABLE (job_id uuid, queue text, tenant text, priority smallint)
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
AS $$
SELECT w.job_id, w.queue, w.tenant, w.priority
FROM jobs AS w
WHERE {_THE_QUEUE.format(q="p_queue")} AND {_WAITING_W}
  AND w.run_after <= now() AND (p_free IS NULL OR COALESCE(w.weight, 1) <= p_free)
  AND w.job_id <> ALL (p_ending)
ORDER BY w.queue, w.job_id
LIMIT p_n
$$
"""

# The queue's next job turned down for its limit that fits the slots it has free.
_HAND_ON = f"""
CREATE FUNCTION jobs_queue_limit_hand_on() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
  SELECT w.job_id, w.queue, COALESCE(w.tenant, ''), w.priority, now()
  FROM (SELECT w.job_id, w.queue, w.tenant, w.priority FROM jobs AS w
        WHERE {_THE_QUEUE.format(q="NEW.queue")} AND {_WAITING_W}
          AND w.run_after <= now() AND w.job_id <> NEW.job_id
          AND COALESCE(w.weight, 1) <= (SELECT c.max_running - c.running
                                        FROM queue_limits AS c WHERE c.queue = NEW.queue)
        ORDER BY w.queue, w.job_id LIMIT 1) AS w
  WHERE NOT EXISTS (SELECT 1 FROM outbox AS o
                    WHERE o.job_id = w.job_id AND o.sent_at IS NULL);
  RETURN NULL;
END $$
"""


# A waiting job's reason changed from a limit's to another while it still waits:
# the limit's next job that fits its free slots is woken in its place. (Only the
# type's turn given up to its queue's limit: a type's waiter held by a key, a
# resource or a tenant carries the turn as before.)
_TURN_PASSED = f"""
CREATE FUNCTION jobs_limit_turn_passed() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  IF OLD.delay_reason = 'QUEUE_CONCURRENCY_LIMIT' THEN
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT w.job_id, w.queue, COALESCE(w.tenant, ''), w.priority, now()
    FROM (SELECT w.job_id, w.queue, w.tenant, w.priority FROM jobs AS w
          WHERE {_THE_QUEUE.format(q="NEW.queue")} AND {_WAITING_W}
            AND w.run_after <= now() AND w.job_id <> NEW.job_id
            AND COALESCE(w.weight, 1) <= (SELECT c.max_running - c.running
                                          FROM queue_limits AS c WHERE c.queue = NEW.queue)
          ORDER BY w.queue, w.job_id LIMIT 1) AS w
    WHERE NOT EXISTS (SELECT 1 FROM outbox AS o
                      WHERE o.job_id = w.job_id AND o.sent_at IS NULL);
  ELSE
    -- the type's next waiter that fits its free slots, one of a queue that runs
    -- first (concurrency_limit_waiters, migration 0033, as the end of a lease
    -- wakes them): a paused queue's would take the turn and hold it while paused
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT w.job_id, w.queue, COALESCE(w.tenant, ''), w.priority, now()
    FROM concurrency_limit_waiters(
        NEW.job_type, 1,
        (SELECT c.max_running - c.running FROM concurrency_limits AS c
         WHERE c.job_type = NEW.job_type),
        ARRAY[NEW.job_id]) AS w
    WHERE NOT EXISTS (SELECT 1 FROM outbox AS o
                      WHERE o.job_id = w.job_id AND o.sent_at IS NULL);
  END IF;
  RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.create_table(
        "queue_limits",
        sa.Column("queue", sa.Text, nullable=False),
        sa.Column("max_running", sa.Integer, nullable=True),
        sa.Column("running", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("updated_by", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("queue", name="queue_limits_pkey"),
        sa.CheckConstraint("max_running >= 1", name="queue_limits_max_running_positive"),
        sa.CheckConstraint("running >= 0", name="queue_limits_running_not_negative"),
    )
    op.add_column(
        "queues",
        sa.Column("limited", sa.Boolean, nullable=False, server_default=sa.text("false")),
    )
    op.add_column(
        "jobs",
        sa.Column("queue_limit_held", sa.Boolean, nullable=False, server_default=sa.text("false")),
    )
    op.create_index(
        "jobs_queue_limit_waiting_idx",
        "jobs",
        ["queue", "job_id"],
        postgresql_where=sa.text(_WAITING),
    )
    op.execute(_WAITERS)
    op.execute(_HAND_ON)
    op.execute(
        "CREATE TRIGGER jobs_queue_limit_hand_on AFTER UPDATE OF state ON jobs FOR EACH ROW "
        f"WHEN (OLD.state IN ({_CLAIMABLE}) AND NEW.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
        " AND OLD.delay_reason = 'QUEUE_CONCURRENCY_LIMIT') "
        "EXECUTE FUNCTION jobs_queue_limit_hand_on()"
    )
    op.execute(_TURN_PASSED)
    op.execute(
        "CREATE TRIGGER jobs_limit_turn_passed AFTER UPDATE OF delay_reason ON jobs"
        f" FOR EACH ROW WHEN (NEW.state IN ({_CLAIMABLE})"
        " AND (OLD.delay_reason = 'QUEUE_CONCURRENCY_LIMIT'"
        "      AND NEW.delay_reason IS DISTINCT FROM 'QUEUE_CONCURRENCY_LIMIT'"
        "   OR OLD.delay_reason = 'CONCURRENCY_LIMIT'"
        "      AND NEW.delay_reason = 'QUEUE_CONCURRENCY_LIMIT')) "
        "EXECUTE FUNCTION jobs_limit_turn_passed()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_limit_turn_passed ON jobs")
    op.execute("DROP FUNCTION jobs_limit_turn_passed()")
    op.execute("DROP TRIGGER jobs_queue_limit_hand_on ON jobs")
    op.execute("DROP FUNCTION jobs_queue_limit_hand_on()")
    op.execute("DROP FUNCTION queue_limit_waiters(text, int, int, uuid[])")
    op.drop_index("jobs_queue_limit_waiting_idx", table_name="jobs")
    op.drop_column("jobs", "queue_limit_held")
    op.drop_column("queues", "limited")
    op.drop_table("queue_limits")
