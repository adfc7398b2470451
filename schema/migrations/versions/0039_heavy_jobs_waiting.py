"""The jobs turned down as heavier than their consumer, found when a larger one starts

A job heavier than the whole concurrency of the consumer that claimed it is turned
down (WEIGHT_OVER_CONCURRENCY) and asks again after the refusal backstop. A consumer
that starts (or comes back) with room for it now brings its wake-up forward at once
(JOB_WAKE_HEAVY); jobs_too_heavy_idx finds those jobs of the consumer's queues and
job types without reading the others. Only such jobs have an entry.

Locks: the index is built with a SHARE lock on jobs (writes to jobs wait while it
is built; it reads the whole table).
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0039"
down_revision: str | None = "0038"


def upgrade() -> None:
    op.create_index(
        "jobs_too_heavy_idx",
        "jobs",
        ["queue", "job_type"],
        postgresql_where=sa.text(
            "delay_reason = 'WEIGHT_OVER_CONCURRENCY' AND state IN ('QUEUED', 'RETRY_WAIT')"
        ),
    )


def downgrade() -> None:
    op.drop_index("jobs_too_heavy_idx", table_name="jobs")
