"""queues.resumed_*, job_requests keyed by Idempotency-Key, dashboard_sessions

- queues: who resumed a queue and when (resume_queue(..., by=...)); the last
  pause's paused_at/paused_by now stay after a resume.
- job_requests: an API Idempotency-Key has its own namespace. It was stored as the
  job's dedup key "api:<key>", scoped by job type and shared with producers' dedup
  keys; now the key is the table's primary key, for one request whatever its job
  type. Existing rows take their key from their job's dedup key; where one key made
  several jobs (of different types, as the old rule allowed), the oldest keeps it.
- dashboard_sessions: server-side sessions of the dashboard, so signing out revokes
  one; the cookie holds a random secret whose hash is the key.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"

# As jobctl.service.jobs wrote it before this revision.
OLD_PREFIX = "api:"


def upgrade() -> None:
    op.add_column("queues", sa.Column("resumed_at", sa.DateTime(timezone=True)))
    op.add_column("queues", sa.Column("resumed_by", sa.Text()))

    op.add_column("job_requests", sa.Column("idempotency_key", sa.Text()))
    op.execute(
        sa.text(
            """
            UPDATE job_requests AS r
            SET idempotency_key = substr(j.dedup_key, :skip)
            FROM jobs AS j
            WHERE j.job_id = r.job_id AND starts_with(j.dedup_key, :prefix)
            """
        ).bindparams(skip=len(OLD_PREFIX) + 1, prefix=OLD_PREFIX)
    )
    op.execute(
        """
        DELETE FROM job_requests AS r
        WHERE r.idempotency_key IS NULL
           OR EXISTS (SELECT 1 FROM job_requests AS o
                      WHERE o.idempotency_key = r.idempotency_key
                        AND (o.created_at, o.job_id) < (r.created_at, r.job_id))
        """
    )
    op.alter_column("job_requests", "idempotency_key", nullable=False)
    op.drop_constraint("job_requests_pkey", "job_requests", type_="primary")
    op.create_primary_key("job_requests_pkey", "job_requests", ["idempotency_key"])
    op.create_index("job_requests_job_id_idx", "job_requests", ["job_id"])

    op.create_table(
        "dashboard_sessions",
        sa.Column("session_hash", sa.Text(), nullable=False),
        sa.Column("token_digest", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("session_hash", name="dashboard_sessions_pkey"),
    )
    op.create_index("dashboard_sessions_expires_at_idx", "dashboard_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("dashboard_sessions_expires_at_idx", table_name="dashboard_sessions")
    op.drop_table("dashboard_sessions")

    op.drop_index("job_requests_job_id_idx", table_name="job_requests")
    op.drop_constraint("job_requests_pkey", "job_requests", type_="primary")
    # The old key was the job: keep one request per job.
    op.execute(
        """
        DELETE FROM job_requests AS r
        WHERE EXISTS (SELECT 1 FROM job_requests AS o
                      WHERE o.job_id = r.job_id
                        AND (o.created_at, o.idempotency_key) < (r.created_at, r.idempotency_key))
        """
    )
    op.create_primary_key("job_requests_pkey", "job_requests", ["job_id"])
    op.drop_column("job_requests", "idempotency_key")

    op.drop_column("queues", "resumed_by")
    op.drop_column("queues", "resumed_at")
