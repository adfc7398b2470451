"""a job's end is announced at its commit; approvals

- jobs_finished_notify: a trigger that notifies channel 'job_finished' with the
  job's id whenever an update moves a job into a final state (SUCCEEDED, FAILED,
  CANCELLED), whichever statement did it, so ``outbox.wait_for`` hears of the end
  at the commit that made it (PostgreSQL delivers notifications only at commit).

Revision ID: 0015
Revises: 0010
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
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
    op.execute("DROP TRIGGER jobs_finished_notify ON jobs")
    op.execute("DROP FUNCTION jobs_finished_notify()")
