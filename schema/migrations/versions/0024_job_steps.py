"""Resumable steps

job_steps: one row per finished step of a job (job.step(name, fn)), keyed (job_id,
name), with the step's result as JSON and the attempt and lease generation that
finished it. Written once, through the fence; a later attempt reads them and skips
those steps. The rows go with their job (ON DELETE CASCADE), so retention deletes
them with it.

A new, empty table; creating it takes only a brief lock on jobs, for the foreign key.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision: str = "0024"
down_revision: str | None = "0023"

MAX_STEP_NAME_LENGTH = 200


def upgrade() -> None:
    op.create_table(
        "job_steps",
        sa.Column(
            "job_id",
            UUID(as_uuid=True),
            sa.ForeignKey("jobs.job_id", ondelete="CASCADE", name="job_steps_job_id_fkey"),
            nullable=False,
        ),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("result", JSONB),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("lease_generation", sa.BigInteger, nullable=False),
        sa.Column(
            "finished_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.PrimaryKeyConstraint("job_id", "name", name="job_steps_pkey"),
        sa.CheckConstraint(
            f"char_length(name) BETWEEN 1 AND {MAX_STEP_NAME_LENGTH}",
            name="job_steps_name_length",
        ),
    )


def downgrade() -> None:
    op.drop_table("job_steps")
