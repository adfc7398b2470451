"""schedules and schedule_fires: recurring schedules and their occurrence ledger"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"

# Frozen copies of the names in schema/tables.py: a migration must keep meaning what
# it meant when it was written, whatever the module says later.
QUEUE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$"
CATCHUP_MODES = "'all', 'latest', 'skip'"
FIRE_OUTCOMES = "'enqueued', 'skipped'"

NOW = sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("job_type", sa.Text, nullable=False),
        sa.Column(
            "payload", postgresql.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")
        ),
        sa.Column("cron", sa.Text),
        sa.Column("every_seconds", postgresql.DOUBLE_PRECISION),
        sa.Column("timezone", sa.Text, nullable=False, server_default=sa.text("'UTC'")),
        sa.Column("queue", sa.Text, nullable=False, server_default=sa.text("'default'")),
        sa.Column("tenant", sa.Text),
        sa.Column("priority", sa.SmallInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("max_attempts", sa.Integer),
        sa.Column("catchup", sa.Text, nullable=False, server_default=sa.text("'latest'")),
        sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("next_fire_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_fire_at", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.CheckConstraint("char_length(name) BETWEEN 1 AND 200", name="schedules_name_length"),
        sa.CheckConstraint(
            "char_length(job_type) BETWEEN 1 AND 200", name="schedules_job_type_length"
        ),
        sa.CheckConstraint(
            "(cron IS NULL) <> (every_seconds IS NULL)", name="schedules_cron_xor_every"
        ),
        sa.CheckConstraint(
            "every_seconds IS NULL OR every_seconds >= 1", name="schedules_every_at_least_1s"
        ),
        sa.CheckConstraint(f"queue ~ '{QUEUE_NAME_PATTERN}'", name="schedules_queue_name_valid"),
        sa.CheckConstraint(
            f"tenant IS NULL OR tenant ~ '{QUEUE_NAME_PATTERN}'", name="schedules_tenant_valid"
        ),
        sa.CheckConstraint(
            "max_attempts IS NULL OR max_attempts >= 1", name="schedules_max_attempts_positive"
        ),
        sa.CheckConstraint(f"catchup IN ({CATCHUP_MODES})", name="schedules_catchup_valid"),
    )
    op.create_index(
        "schedules_due_idx",
        "schedules",
        ["next_fire_at"],
        postgresql_where=sa.text("NOT paused"),
    )
    op.create_table(
        "schedule_fires",
        sa.Column(
            "schedule_name",
            sa.Text,
            sa.ForeignKey(
                "schedules.name", ondelete="CASCADE", name="schedule_fires_schedule_name_fkey"
            ),
            nullable=False,
        ),
        sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=False),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("delay_seconds", postgresql.DOUBLE_PRECISION, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("skip_reason", sa.Text),
        sa.Column("job_id", postgresql.UUID(as_uuid=True)),
        sa.PrimaryKeyConstraint("schedule_name", "scheduled_for", name="schedule_fires_pkey"),
        sa.CheckConstraint(f"outcome IN ({FIRE_OUTCOMES})", name="schedule_fires_outcome_valid"),
        sa.CheckConstraint(
            "(outcome = 'enqueued') = (job_id IS NOT NULL AND skip_reason IS NULL)",
            name="schedule_fires_job_iff_enqueued",
        ),
    )


def downgrade() -> None:
    op.drop_table("schedule_fires")
    op.drop_index("schedules_due_idx", table_name="schedules")
    op.drop_table("schedules")
