"""Any end of a waiting job passes its key's or resource's turn on

A freed key or resource wakes its next waiting job, and only that one. If that job
then ended without running (cancelled, past its deadline, rejected, cancelled by its
parent's failure, replaced by a debounce), nobody else was woken until the relay's
orphan walk, a lap of which is the jobs table's rows / 5,000 seconds. The same held
for an ordered key's head ending before it ran: the next in order waited for the walk.

jobs_hand_on is a row trigger on exactly those rows (a waiting job with a key or a
resource that ends): it wakes the key's next waiting job, and the resource's if no
hold stands, unless that job has a wake-up pending. It runs after the statement, and
reads with a snapshot of its own, so the job it picks is the one waiting now. A
statement that ends no such job pays for a WHEN clause, tested on the row in memory.

jobs_resource_refused_idx holds the jobs turned down for their resource, oldest
first: the job a freed resource wakes is its first entry, however many wait.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"

CLAIMABLE = "'QUEUED', 'RETRY_WAIT'"
REFUSALS = "'RESOURCE_BUSY', 'RESOURCE_UNCERTAIN'"

_HAND_ON = """
CREATE FUNCTION jobs_hand_on() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.key IS NOT NULL THEN
    -- the key's next waiting job, in key order (jobs_key_waiting_idx), if the key
    -- has room; a key at its limit wakes its next at the end of a lease
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT w.job_id, w.queue, COALESCE(w.tenant, ''), w.priority, now()
    FROM (SELECT w.job_id, w.queue, w.tenant, w.priority
          FROM jobs AS w
          WHERE w.key = NEW.key AND w.state IN ('QUEUED', 'RETRY_WAIT') AND w.run_after <= now()
          ORDER BY w.key_seq, w.job_id
          LIMIT 1) AS w
    WHERE NOT EXISTS (SELECT 1 FROM key_usage AS u
                      WHERE u.key = NEW.key AND u.running >= u.key_limit)
      AND NOT EXISTS (SELECT 1 FROM outbox AS o
                      WHERE o.job_id = w.job_id AND o.sent_at IS NULL);
  END IF;
  IF NEW.resource IS NOT NULL THEN
    -- the resource's oldest job turned down for it, else its oldest waiting, if no
    -- hold stands
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT w.job_id, w.queue, COALESCE(w.tenant, ''), w.priority, now()
    FROM (SELECT c.* FROM (
            (SELECT w.job_id, w.queue, w.tenant, w.priority
             FROM jobs AS w
             WHERE w.resource = NEW.resource AND w.state IN ('QUEUED', 'RETRY_WAIT')
               AND w.delay_reason IN ('RESOURCE_BUSY', 'RESOURCE_UNCERTAIN') AND w.run_after <= now()
             ORDER BY w.job_id LIMIT 1)
            UNION ALL
            (SELECT w.job_id, w.queue, w.tenant, w.priority
             FROM jobs AS w
             WHERE w.resource = NEW.resource AND w.state IN ('QUEUED', 'RETRY_WAIT')
               AND w.run_after <= now()
             ORDER BY w.job_id LIMIT 1)) AS c
          LIMIT 1) AS w
    WHERE NOT EXISTS (SELECT 1 FROM resource_holds AS h WHERE h.resource = NEW.resource)
      AND NOT EXISTS (SELECT 1 FROM outbox AS o
                      WHERE o.job_id = w.job_id AND o.sent_at IS NULL);
  END IF;
  RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.create_index(
        "jobs_resource_refused_idx",
        "jobs",
        ["resource", "job_id"],
        postgresql_where=sa.text(
            f"resource IS NOT NULL AND state IN ({CLAIMABLE}) AND delay_reason IN ({REFUSALS})"
        ),
    )
    op.execute(_HAND_ON)
    op.execute(
        "CREATE TRIGGER jobs_hand_on AFTER UPDATE OF state ON jobs FOR EACH ROW "
        f"WHEN (OLD.state IN ({CLAIMABLE}) AND NEW.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
        " AND (NEW.key IS NOT NULL OR NEW.resource IS NOT NULL)) "
        "EXECUTE FUNCTION jobs_hand_on()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_hand_on ON jobs")
    op.execute("DROP FUNCTION jobs_hand_on()")
    op.drop_index("jobs_resource_refused_idx", table_name="jobs")
