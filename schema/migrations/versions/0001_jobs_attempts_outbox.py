"""jobs, job_attempts and outbox"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None

# Frozen copies of the names in schema/tables.py: a migration must keep meaning what
# it meant when it was written, whatever the module says later.
STATES = "'CANCELLED', 'CANCEL_REQUESTED', 'FAILED', 'QUEUED', 'RETRY_WAIT', 'RUNNING', 'SUCCEEDED'"
CLAIMABLE = "'QUEUED', 'RETRY_WAIT'"
LEASED = "'CANCEL_REQUESTED', 'RUNNING'"
OUTCOMES = "'CANCELLED', 'FAILED', 'RETRY_WAIT', 'SUCCEEDED'"
QUEUE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$"

NOW = sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("job_id", postgresql.UUID(as_uuid=True), primary_key=True),
        sa.Column("job_type", sa.Text, nullable=False),
        sa.Column("queue", sa.Text, nullable=False, server_default=sa.text("'default'")),
        sa.Column("state", sa.Text, nullable=False, server_default=sa.text("'QUEUED'")),
        sa.Column("priority", sa.SmallInteger, nullable=False, server_default=sa.text("0")),
        sa.Column(
            "payload", postgresql.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")
        ),
        sa.Column("dedup_key", sa.Text),
        sa.Column("attempt_count", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("max_attempts", sa.Integer),
        sa.Column("run_after", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("lease_owner", sa.Text),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True)),
        sa.Column("lease_generation", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("last_error_code", sa.Text),
        sa.Column("last_error_message", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint(f"state IN ({STATES})", name="jobs_state_valid"),
        sa.CheckConstraint(
            f"(state IN ({LEASED})) = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)",
            name="jobs_lease_iff_leased",
        ),
        sa.CheckConstraint(
            "attempt_count >= 0 AND (max_attempts IS NULL OR attempt_count <= max_attempts)",
            name="jobs_attempts_within_budget",
        ),
        sa.CheckConstraint(
            "max_attempts IS NULL OR max_attempts >= 1", name="jobs_max_attempts_positive"
        ),
        sa.CheckConstraint("lease_generation >= 0", name="jobs_generation_non_negative"),
        sa.CheckConstraint("char_length(job_type) BETWEEN 1 AND 200", name="jobs_job_type_length"),
        sa.CheckConstraint(f"queue ~ '{QUEUE_NAME_PATTERN}'", name="jobs_queue_name_valid"),
        sa.CheckConstraint(
            "dedup_key IS NULL OR char_length(dedup_key) BETWEEN 1 AND 500",
            name="jobs_dedup_key_length",
        ),
    )
    op.create_index(
        "jobs_claimable_idx",
        "jobs",
        ["run_after"],
        postgresql_where=sa.text(f"state IN ({CLAIMABLE})"),
    )
    op.create_index(
        "jobs_dedup_idx",
        "jobs",
        ["job_type", "dedup_key"],
        unique=True,
        postgresql_where=sa.text("dedup_key IS NOT NULL"),
    )
    op.create_index(
        "jobs_leased_idx", "jobs", ["lease_owner"], postgresql_where=sa.text(f"state IN ({LEASED})")
    )

    op.create_table(
        "job_attempts",
        sa.Column(
            "job_id",
            postgresql.UUID(as_uuid=True),
            sa.ForeignKey("jobs.job_id", ondelete="CASCADE", name="job_attempts_job_id_fkey"),
            nullable=False,
        ),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("lease_generation", sa.BigInteger, nullable=False),
        sa.Column("worker", sa.Text, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("error_code", sa.Text),
        sa.Column("error_message", sa.Text),
        sa.PrimaryKeyConstraint("job_id", "attempt", name="job_attempts_pkey"),
        sa.CheckConstraint(f"outcome IN ({OUTCOMES})", name="job_attempts_outcome_valid"),
        sa.CheckConstraint("attempt >= 1", name="job_attempts_attempt_positive"),
    )
    # The history is append-only: an attempt row is written once, when the attempt
    # ends, and the database refuses to rewrite it.
    op.execute(
        """
        CREATE FUNCTION job_attempts_append_only() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
          RAISE EXCEPTION 'job_attempts is append-only (job %, attempt %)', OLD.job_id, OLD.attempt
            USING ERRCODE = 'integrity_constraint_violation';
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER job_attempts_append_only BEFORE UPDATE ON job_attempts "
        "FOR EACH ROW EXECUTE FUNCTION job_attempts_append_only()"
    )

    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column(
            "job_id",
            postgresql.UUID(as_uuid=True),
            sa.ForeignKey("jobs.job_id", ondelete="CASCADE", name="outbox_job_id_fkey"),
            nullable=False,
        ),
        sa.Column("queue", sa.Text, nullable=False),
        sa.Column("available_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("sent_at", sa.DateTime(timezone=True)),
    )
    op.create_index(
        "outbox_unsent_idx",
        "outbox",
        ["available_at", "id"],
        postgresql_where=sa.text("sent_at IS NULL"),
    )
    op.create_index("outbox_job_id_idx", "outbox", ["job_id"])
    op.create_index(
        "outbox_sent_idx", "outbox", ["sent_at"], postgresql_where=sa.text("sent_at IS NOT NULL")
    )
    # A statement that adds wake-ups due now pokes the relay. PostgreSQL delivers the
    # notification only when the transaction commits, and folds repeats into one.
    # Later wake-ups (delayed jobs, retries) are found by the relay's poll; not
    # notifying for them, or for statements that added nothing, spares the relay a
    # pointless claim on every outcome commit.
    op.execute(
        """
        CREATE FUNCTION outbox_notify() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
          IF EXISTS (SELECT 1 FROM added WHERE available_at <= now()) THEN
            PERFORM pg_notify('outbox', '');
          END IF;
          RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER outbox_notify AFTER INSERT ON outbox "
        "REFERENCING NEW TABLE AS added "
        "FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER outbox_notify ON outbox")
    op.execute("DROP FUNCTION outbox_notify()")
    op.drop_table("outbox")
    op.execute("DROP TRIGGER job_attempts_append_only ON job_attempts")
    op.execute("DROP FUNCTION job_attempts_append_only()")
    op.drop_table("job_attempts")
    op.drop_table("jobs")
