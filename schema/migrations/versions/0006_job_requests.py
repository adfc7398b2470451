"""job_requests (Idempotency-Key fingerprints) and jobs_unsuccessful_finished_idx

job_requests holds the fingerprint of the API request that created a job, so a
repeated Idempotency-Key with a different request is refused;
jobs_unsuccessful_finished_idx lists failed and cancelled jobs, newest finished first.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"


def upgrade() -> None:
    op.create_table(
        "job_requests",
        sa.Column("job_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.job_id"], name="job_requests_job_id_fkey", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name="job_requests_pkey"),
    )
    # Only failed and cancelled jobs have entries, so building it reads the table
    # once and writes little; CONCURRENTLY is not possible inside the migration's
    # transaction, and a big deployment may create it by hand first (IF NOT EXISTS).
    op.create_index(
        "jobs_unsuccessful_finished_idx",
        "jobs",
        ["finished_at", "job_id"],
        postgresql_where=sa.text("state IN ('CANCELLED', 'FAILED')"),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("jobs_unsuccessful_finished_idx", table_name="jobs")
    op.drop_table("job_requests")
