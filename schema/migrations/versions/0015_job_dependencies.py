"""Job dependencies: enqueue(..., after=[...]) and the trigger that settles them

- job_dependencies(child_id, parent_id, position, done): one row per edge, found
  from either end;
- jobs.parents_pending (the child's count of parents not settled yet),
  jobs.on_parent_failure ('cancel' or 'run'), jobs.has_dependants (some job waits
  for this one);
- jobs_release_dependants: a row trigger on the end of a job somebody waits for.
  It settles the job's edges in the statement that ended it, whichever statement
  that was (the outcome, job.transaction(), the sweep, a cancel, an expiry), so
  none can forget: on SUCCEEDED, every child's count drops by one, and the child
  whose count reaches 0 is made due and gets its wake-up; on FAILED or CANCELLED,
  children under 'run' count it as settled the same way, and children under
  'cancel' (with, in one recursive statement, every waiting job that transitively
  depends on them under 'cancel') end CANCELLED with last_error_code
  PARENT_FAILED. Those cancellations fire the trigger again, one level down only
  (their own 'cancel' dependants are cancelled already), to settle their 'run'
  children.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"

# Copied, not imported: the migration keeps meaning what it meant.
_HOLD = "'9999-12-31 00:00:00+00'::timestamptz"

_FUNCTION = """
CREATE FUNCTION jobs_release_dependants() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.state <> 'SUCCEEDED' THEN
    -- Every waiting job reachable through 'cancel' edges not settled yet. A child
    -- still waiting for this parent has parents_pending > 0; UNION stops at jobs
    -- seen already (the graph is acyclic anyway: a job names only older ones).
    WITH RECURSIVE doomed(job_id) AS (
      SELECT d.child_id
      FROM job_dependencies AS d JOIN jobs AS c ON c.job_id = d.child_id
      WHERE d.parent_id = NEW.job_id AND NOT d.done
        AND c.on_parent_failure = 'cancel' AND c.state = 'QUEUED' AND c.parents_pending > 0
      UNION
      SELECT d.child_id
      FROM doomed AS x
      JOIN job_dependencies AS d ON d.parent_id = x.job_id AND NOT d.done
      JOIN jobs AS c ON c.job_id = d.child_id
      WHERE c.on_parent_failure = 'cancel' AND c.state = 'QUEUED' AND c.parents_pending > 0
    )
    UPDATE jobs AS c
    SET state = 'CANCELLED',
        finished_at = statement_timestamp(),
        last_error_code = 'PARENT_FAILED',
        last_error_message = 'job ' || NEW.job_id || ' it depends on ended ' || NEW.state,
        delay_reason = NULL,
        delay_since = NULL,
        updated_at = now()
    WHERE c.job_id IN (SELECT job_id FROM doomed) AND c.state = 'QUEUED';
  END IF;
  WITH settled AS (
    UPDATE job_dependencies AS d
    SET done = true
    FROM jobs AS c
    WHERE d.parent_id = NEW.job_id AND NOT d.done AND c.job_id = d.child_id
      AND (NEW.state = 'SUCCEEDED' OR c.on_parent_failure = 'run')
    RETURNING d.child_id
  ), counted AS (
    -- Under READ COMMITTED a second parent ending at the same instant waits for
    -- this row's lock and then counts down from the value this one left: exactly
    -- one of them sees 1 here, and it alone makes the child due.
    UPDATE jobs AS c
    SET parents_pending = c.parents_pending - 1,
        run_after = CASE WHEN c.parents_pending = 1 AND c.state = 'QUEUED'
                         THEN now() ELSE c.run_after END,
        delay_reason = CASE WHEN c.parents_pending = 1 AND c.state = 'QUEUED'
                            THEN NULL ELSE c.delay_reason END,
        delay_since = CASE WHEN c.parents_pending = 1 AND c.state = 'QUEUED'
                           THEN NULL ELSE c.delay_since END,
        updated_at = now()
    FROM settled AS s
    WHERE c.job_id = s.child_id
    RETURNING c.job_id, c.queue, c.tenant, c.priority, c.run_after, c.parents_pending, c.state
  )
  INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
  SELECT job_id, queue, COALESCE(tenant, ''), priority, run_after FROM counted
  WHERE parents_pending = 0 AND state = 'QUEUED';
  RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("parents_pending", sa.Integer, nullable=False, server_default="0")
    )
    op.add_column("jobs", sa.Column("on_parent_failure", sa.Text))
    op.add_column(
        "jobs",
        sa.Column("has_dependants", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_check_constraint("jobs_parents_pending_non_negative", "jobs", "parents_pending >= 0")
    op.create_check_constraint(
        "jobs_on_parent_failure_valid", "jobs", "on_parent_failure IN ('cancel', 'run')"
    )
    op.create_check_constraint(
        "jobs_dependency_held",
        "jobs",
        f"parents_pending = 0 OR state <> 'QUEUED' OR run_after = {_HOLD}",
    )
    op.create_table(
        "job_dependencies",
        sa.Column(
            "child_id",
            sa.UUID(as_uuid=True),
            sa.ForeignKey("jobs.job_id", ondelete="CASCADE", name="job_dependencies_child_id_fkey"),
            nullable=False,
        ),
        sa.Column(
            "parent_id",
            sa.UUID(as_uuid=True),
            sa.ForeignKey(
                "jobs.job_id", ondelete="CASCADE", name="job_dependencies_parent_id_fkey"
            ),
            nullable=False,
        ),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("done", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.PrimaryKeyConstraint("child_id", "parent_id", name="job_dependencies_pkey"),
    )
    op.create_index("job_dependencies_parent_idx", "job_dependencies", ["parent_id", "child_id"])
    op.execute(_FUNCTION)
    # WHEN in C: the end of a job nobody waits for never enters the function.
    op.execute(
        "CREATE TRIGGER jobs_release_dependants AFTER UPDATE OF state ON jobs "
        "FOR EACH ROW WHEN (NEW.has_dependants "
        "AND NEW.state IN ('CANCELLED', 'FAILED', 'SUCCEEDED') "
        "AND OLD.state IS DISTINCT FROM NEW.state) "
        "EXECUTE FUNCTION jobs_release_dependants()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_release_dependants ON jobs")
    op.execute("DROP FUNCTION jobs_release_dependants()")
    op.drop_table("job_dependencies")
    op.drop_constraint("jobs_dependency_held", "jobs")
    op.drop_constraint("jobs_on_parent_failure_valid", "jobs")
    op.drop_constraint("jobs_parents_pending_non_negative", "jobs")
    op.drop_column("jobs", "has_dependants")
    op.drop_column("jobs", "on_parent_failure")
    op.drop_column("jobs", "parents_pending")
