"""A job's weight: the slots one lease of it takes

jobs.weight is how many slots a lease of the job takes of its consumer's
concurrency, of its tenant's cap (tenant_usage.running now counts slots, not
leases) and of its type's concurrency limit (concurrency_limits.running likewise).
NULL is one: a plain job's row is as it was, and its statements never read the
column. jobs_weight_range keeps it between 2 and MAX_WEIGHT (one is stored as
NULL). The trigger jobs_limit_hand_on, which passes a woken waiter's turn on when
it ends without running, now passes it to the oldest waiter that fits the limit's
free slots: the oldest of all might weigh more, and would be turned down again
while a lighter one that fits waited with no wake-up.

Locks: the column has no default, so adding it rewrites nothing: ACCESS EXCLUSIVE
on jobs for a moment. The check is added NOT VALID (ACCESS EXCLUSIVE for a moment,
no scan) and then validated, which reads the whole table under SHARE UPDATE
EXCLUSIVE only: reads and writes of jobs go on meanwhile. CREATE OR REPLACE
FUNCTION writes the catalog and takes no lock on a table.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"

# defaults.MAX_WEIGHT when this was written; a migration keeps its own figures.
_MAX_WEIGHT = 100

_CLAIMABLE = "'QUEUED', 'RETRY_WAIT'"
_WAITING_W = f"w.state IN ({_CLAIMABLE}) AND w.delay_reason = 'CONCURRENCY_LIMIT'"


def _hand_on(fits: str) -> str:
    """jobs_limit_hand_on: the type's next job turned down for its limit that
    ``fits`` (of a queue that runs first; one of a paused queue waits for the
    resume), when the limit has a free slot."""
    return f"""
CREATE OR REPLACE FUNCTION jobs_limit_hand_on() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
  SELECT w.job_id, w.queue, COALESCE(w.tenant, ''), w.priority, now()
  FROM (SELECT c.* FROM (
          (SELECT w.job_id, w.queue, w.tenant, w.priority FROM jobs AS w
           WHERE w.job_type = NEW.job_type AND {_WAITING_W}
             AND w.run_after <= now() AND w.job_id <> NEW.job_id{fits}
             AND NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.queue = w.queue AND p.paused)
           ORDER BY w.job_id LIMIT 1)
          UNION ALL
          (SELECT w.job_id, w.queue, w.tenant, w.priority FROM jobs AS w
           WHERE w.job_type = NEW.job_type AND {_WAITING_W}
             AND w.run_after <= now() AND w.job_id <> NEW.job_id{fits}
           ORDER BY w.job_id LIMIT 1)) AS c
        LIMIT 1) AS w
  WHERE NOT EXISTS (SELECT 1 FROM concurrency_limits AS c
                    WHERE c.job_type = NEW.job_type AND c.running >= c.max_running)
    AND NOT EXISTS (SELECT 1 FROM outbox AS o
                    WHERE o.job_id = w.job_id AND o.sent_at IS NULL);
  RETURN NULL;
END $$
"""


# A waiter that fits the slots its type's limit has free now.
_FITS = """
             AND COALESCE(w.weight, 1) <= (SELECT c.max_running - c.running
                                           FROM concurrency_limits AS c
                                           WHERE c.job_type = NEW.job_type)"""


def upgrade() -> None:
    op.add_column("jobs", sa.Column("weight", sa.Integer))
    op.execute(
        "ALTER TABLE jobs ADD CONSTRAINT jobs_weight_range"
        f" CHECK (weight IS NULL OR weight BETWEEN 2 AND {_MAX_WEIGHT}) NOT VALID"
    )
    op.execute("ALTER TABLE jobs VALIDATE CONSTRAINT jobs_weight_range")
    op.execute(_hand_on(_FITS))


def downgrade() -> None:
    op.execute(_hand_on(""))
    op.drop_constraint("jobs_weight_range", "jobs", type_="check")
    op.drop_column("jobs", "weight")
