"""Concurrency limits per job type, across every consumer

concurrency_limits holds, per job type whose handler declares a ``global_limit``,
the most leases of its jobs that may run at once (max_running) and how many run now
(running): the claim locks the row, admits at most the free slots and takes them;
every end of a lease that held one gives it back and wakes the next job turned down
for it. Consumers write max_running at start-up from their handlers' declarations
(the last to start wins; updated_by names it). jobs.limit_held says which leases
hold a slot (the ones claimed through the limit), so an end of a lease releases
exactly what its claim took. jobs_limit_waiting_idx finds a type's next job turned
down for its limit (delay_reason CONCURRENCY_LIMIT) in one probe. The trigger
jobs_limit_hand_on passes a woken waiter's turn on when it ends without running
(cancelled, past its deadline, its parent failed), as jobs_hand_on does for keys.

Locks: the new table takes none on another. The added column has a constant
default, so it rewrites nothing: ACCESS EXCLUSIVE on jobs for a moment. The index
is built with a SHARE lock on jobs (writes to jobs wait while it is built; it
reads the whole table but holds only the rows turned down for a limit, none yet).
The trigger takes SHARE ROW EXCLUSIVE on jobs for a moment.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"

_CLAIMABLE = "'QUEUED', 'RETRY_WAIT'"
_WAITING = f"state IN ({_CLAIMABLE}) AND delay_reason = 'CONCURRENCY_LIMIT'"
_WAITING_W = f"w.state IN ({_CLAIMABLE}) AND w.delay_reason = 'CONCURRENCY_LIMIT'"

# The type's next job turned down for its limit, of a queue that runs first (one
# of a paused queue waits for the resume), when the limit has a free slot.
_HAND_ON = f"""
CREATE FUNCTION jobs_limit_hand_on() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
  SELECT w.job_id, w.queue, COALESCE(w.tenant, ''), w.priority, now()
  FROM (SELECT c.* FROM (
          (SELECT w.job_id, w.queue, w.tenant, w.priority FROM jobs AS w
           WHERE w.job_type = NEW.job_type AND {_WAITING_W}
             AND w.run_after <= now() AND w.job_id <> NEW.job_id
             AND NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.queue = w.queue AND p.paused)
           ORDER BY w.job_id LIMIT 1)
          UNION ALL
          (SELECT w.job_id, w.queue, w.tenant, w.priority FROM jobs AS w
           WHERE w.job_type = NEW.job_type AND {_WAITING_W}
             AND w.run_after <= now() AND w.job_id <> NEW.job_id
           ORDER BY w.job_id LIMIT 1)) AS c
        LIMIT 1) AS w
  WHERE NOT EXISTS (SELECT 1 FROM concurrency_limits AS c
                    WHERE c.job_type = NEW.job_type AND c.running >= c.max_running)
    AND NOT EXISTS (SELECT 1 FROM outbox AS o
                    WHERE o.job_id = w.job_id AND o.sent_at IS NULL);
  RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.create_table(
        "concurrency_limits",
        sa.Column("job_type", sa.Text, nullable=False),
        sa.Column("max_running", sa.Integer, nullable=False),
        sa.Column("running", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("updated_by", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("job_type", name="concurrency_limits_pkey"),
        sa.CheckConstraint("max_running >= 1", name="concurrency_limits_max_running_positive"),
        sa.CheckConstraint("running >= 0", name="concurrency_limits_running_not_negative"),
    )
    op.add_column(
        "jobs",
        sa.Column("limit_held", sa.Boolean, nullable=False, server_default=sa.text("false")),
    )
    op.create_index(
        "jobs_limit_waiting_idx",
        "jobs",
        ["job_type", "job_id"],
        postgresql_where=sa.text(_WAITING),
    )
    op.execute(_HAND_ON)
    op.execute(
        "CREATE TRIGGER jobs_limit_hand_on AFTER UPDATE OF state ON jobs FOR EACH ROW "
        f"WHEN (OLD.state IN ({_CLAIMABLE}) AND NEW.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
        " AND OLD.delay_reason = 'CONCURRENCY_LIMIT') "
        "EXECUTE FUNCTION jobs_limit_hand_on()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_limit_hand_on ON jobs")
    op.execute("DROP FUNCTION jobs_limit_hand_on()")
    op.drop_index("jobs_limit_waiting_idx", table_name="jobs")
    op.drop_column("jobs", "limit_held")
    op.drop_table("concurrency_limits")
