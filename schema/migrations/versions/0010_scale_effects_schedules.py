"""effect keys kept apart from jobs; a job's scheduled occurrence; failing schedules back off

- job_effects: retention no longer deletes a job's effect keys with the job (they
  have a retention of their own, by age), so the index by job goes and one by
  created_at comes;
- jobs.scheduled_for: the nominal instant of the occurrence that fired the job;
- schedules.failures, last_error, last_error_at, retry_at: a schedule whose firing
  keeps failing says why and is retried after a backoff, so it holds no other back;
- fair_shares: fillfactor 50, so the relay's updates of passes and held reasons
  stay HOT.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"


def _ts(name: str) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, sa.DateTime(timezone=True))


def upgrade() -> None:
    op.drop_index("job_effects_job_id_idx", table_name="job_effects")
    op.create_index("job_effects_created_idx", "job_effects", ["created_at"])
    op.add_column("jobs", _ts("scheduled_for"))
    op.add_column(
        "schedules",
        sa.Column("failures", sa.Integer, nullable=False, server_default=sa.text("0")),
    )
    op.add_column("schedules", sa.Column("last_error", sa.Text))
    op.add_column("schedules", _ts("last_error_at"))
    op.add_column("schedules", _ts("retry_at"))
    op.execute("ALTER TABLE fair_shares SET (fillfactor = 50)")


def downgrade() -> None:
    op.execute("ALTER TABLE fair_shares RESET (fillfactor)")
    op.drop_column("schedules", "retry_at")
    op.drop_column("schedules", "last_error_at")
    op.drop_column("schedules", "last_error")
    op.drop_column("schedules", "failures")
    op.drop_column("jobs", "scheduled_for")
    op.drop_index("job_effects_created_idx", table_name="job_effects")
    op.create_index("job_effects_job_id_idx", "job_effects", ["job_id"])
