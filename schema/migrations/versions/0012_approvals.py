"""a job's end is announced at its commit; approvals

- jobs_finished_notify: a trigger that notifies channel 'job_finished' with the
  job's id whenever an update moves a job into a final state (SUCCEEDED, FAILED,
  CANCELLED), whichever statement did it, so ``outbox.wait_for`` hears of the end
  at the commit that made it (PostgreSQL delivers notifications only at commit);
- jobs.approval, approval_by, approval_at: a job enqueued with needs_approval
  waits (REQUIRED, held never due) until approved or rejected, and who decided
  when is kept.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"


# Copied, not imported: the migration keeps meaning what it meant.
_HOLD = "'9999-12-31 00:00:00+00'::timestamptz"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("approval", sa.Text))
    op.add_column("jobs", sa.Column("approval_by", sa.Text))
    op.add_column("jobs", sa.Column("approval_at", sa.DateTime(timezone=True)))
    op.create_check_constraint(
        "jobs_approval_valid", "jobs", "approval IN ('APPROVED', 'REJECTED', 'REQUIRED')"
    )
    op.create_check_constraint(
        "jobs_unapproved_held",
        "jobs",
        "approval IS DISTINCT FROM 'REQUIRED'"
        f" OR (state IN ('QUEUED', 'CANCELLED') AND run_after = {_HOLD})",
    )
    op.create_check_constraint(
        "jobs_approval_decided_at",
        "jobs",
        "(approval IN ('APPROVED', 'REJECTED')) = (approval_at IS NOT NULL)",
    )
    # A row trigger with a WHEN clause: the condition is checked in C on every update
    # (heartbeats included), and the function runs only for the row that ends a job.
    # A trigger rather than a line in every statement that can end a job (outcome,
    # sweep, give-back, cancel, rejection, and what later statements add): none can
    # forget it.
    op.execute(
        """
        CREATE FUNCTION jobs_finished_notify() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
          PERFORM pg_notify('job_finished', NEW.job_id::text);
          RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER jobs_finished_notify AFTER UPDATE OF state ON jobs "
        "FOR EACH ROW WHEN (NEW.state IN ('CANCELLED', 'FAILED', 'SUCCEEDED') "
        "AND OLD.state IS DISTINCT FROM NEW.state) "
        "EXECUTE FUNCTION jobs_finished_notify()"
    )


def downgrade() -> None:
    op.drop_constraint("jobs_approval_decided_at", "jobs")
    op.drop_constraint("jobs_unapproved_held", "jobs")
    op.drop_constraint("jobs_approval_valid", "jobs")
    op.drop_column("jobs", "approval_at")
    op.drop_column("jobs", "approval_by")
    op.drop_column("jobs", "approval")
    op.execute("DROP TRIGGER jobs_finished_notify ON jobs")
    op.execute("DROP FUNCTION jobs_finished_notify()")
