"""tenants, fair order, workers, pause, replay, progress; attempts keyed by generation"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"

# Frozen copies of the names in schema/tables.py (see 0001).
CLAIMABLE = "'QUEUED', 'RETRY_WAIT'"
LEASED = "'CANCEL_REQUESTED', 'RUNNING'"
TERMINAL = "'CANCELLED', 'FAILED', 'SUCCEEDED'"
OUTCOMES_BEFORE = "'CANCELLED', 'FAILED', 'RETRY_WAIT', 'SUCCEEDED'"
OUTCOMES = "'CANCELLED', 'FAILED', 'QUEUED', 'RETRY_WAIT', 'SUCCEEDED'"
NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$"

NOW = sa.text("now()")


def _ts(name: str, *, nullable: bool = True, default: bool = False) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(
        name, sa.DateTime(timezone=True), nullable=nullable, server_default=NOW if default else None
    )


def upgrade() -> None:
    # ---------------------------------------------------------------- jobs
    op.add_column("jobs", sa.Column("tenant", sa.Text))
    op.add_column(
        "jobs", sa.Column("holds_slot", sa.Boolean, nullable=False, server_default=sa.false())
    )
    op.add_column("jobs", sa.Column("expiry_backoff", sa.Float))
    op.add_column("jobs", sa.Column("delay_reason", sa.Text))
    op.add_column("jobs", _ts("delay_since"))
    op.add_column("jobs", _ts("cancel_requested_at"))
    op.add_column("jobs", sa.Column("progress", postgresql.JSONB))
    op.add_column("jobs", _ts("progress_at"))
    op.add_column("jobs", sa.Column("result", postgresql.JSONB))
    op.create_check_constraint(
        "jobs_tenant_name_valid", "jobs", f"tenant IS NULL OR tenant ~ '{NAME}'"
    )
    op.create_check_constraint(
        "jobs_slot_only_leased", "jobs", f"NOT holds_slot OR state IN ({LEASED})"
    )

    op.drop_index("jobs_claimable_idx", table_name="jobs")
    op.create_index(
        "jobs_claimable_idx",
        "jobs",
        ["queue", "state", "run_after"],
        postgresql_where=sa.text(f"state IN ({CLAIMABLE})"),
    )
    op.drop_index("jobs_leased_idx", table_name="jobs")
    op.create_index(
        "jobs_leased_idx",
        "jobs",
        ["queue", "state"],
        postgresql_where=sa.text(f"state IN ({LEASED})"),
    )
    op.create_index(
        "jobs_finished_idx",
        "jobs",
        ["finished_at"],
        postgresql_where=sa.text(f"state IN ({TERMINAL})"),
    )
    op.create_index(
        "jobs_unsuccessful_idx",
        "jobs",
        ["queue", "finished_at"],
        postgresql_where=sa.text("state IN ('CANCELLED', 'FAILED')"),
    )
    op.create_index(
        "jobs_tenant_waiting_idx",
        "jobs",
        ["tenant", "created_at"],
        postgresql_where=sa.text(f"state IN ({CLAIMABLE}) AND tenant IS NOT NULL"),
    )
    op.create_index(
        "jobs_no_handler_idx",
        "jobs",
        ["queue", "job_type"],
        postgresql_where=sa.text(f"delay_reason = 'NO_HANDLER' AND state IN ({CLAIMABLE})"),
    )

    # ---------------------------------------------------------------- job_attempts
    op.drop_constraint("job_attempts_pkey", "job_attempts", type_="primary")
    op.create_primary_key("job_attempts_pkey", "job_attempts", ["job_id", "lease_generation"])
    op.add_column("job_attempts", _ts("ready_at"))
    op.add_column("job_attempts", sa.Column("traceback", sa.Text))
    op.drop_constraint("job_attempts_outcome_valid", "job_attempts", type_="check")
    op.create_check_constraint(
        "job_attempts_outcome_valid", "job_attempts", f"outcome IN ({OUTCOMES})"
    )
    op.create_index("job_attempts_finished_idx", "job_attempts", ["finished_at"])

    # ---------------------------------------------------------------- outbox
    op.add_column(
        "outbox", sa.Column("tenant", sa.Text, nullable=False, server_default=sa.text("''"))
    )
    op.add_column(
        "outbox",
        sa.Column("priority", sa.SmallInteger, nullable=False, server_default=sa.text("0")),
    )
    op.execute(
        "UPDATE outbox AS o SET tenant = COALESCE(j.tenant, ''), priority = j.priority"
        " FROM jobs AS j WHERE j.job_id = o.job_id"
    )
    op.drop_index("outbox_unsent_idx", table_name="outbox")
    op.drop_index("outbox_sent_idx", table_name="outbox")
    op.execute(
        "CREATE INDEX outbox_pending_idx ON outbox (queue, tenant, priority DESC, available_at, id)"
        " WHERE sent_at IS NULL"
    )
    op.create_index(
        "outbox_due_idx",
        "outbox",
        ["available_at", "queue"],
        postgresql_where=sa.text("sent_at IS NULL"),
    )
    op.create_index(
        "outbox_inflight_idx",
        "outbox",
        ["queue", "tenant"],
        postgresql_where=sa.text("sent_at IS NOT NULL"),
    )
    op.create_index("job_effects_job_id_idx", "job_effects", ["job_id"])

    # The relay learns which queues a commit added due wake-ups to, and wakes just
    # those (no query to find them). Queue names never contain a comma; a payload
    # too long for NOTIFY says nothing, which the relay takes as "look everywhere".
    op.execute(
        """
        CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
          queues text;
        BEGIN
          SELECT string_agg(DISTINCT queue, ',') INTO queues FROM added WHERE available_at <= now();
          IF queues IS NOT NULL THEN
            PERFORM pg_notify('outbox', CASE WHEN length(queues) < 7000 THEN queues ELSE '' END);
          END IF;
          RETURN NULL;
        END $$
        """
    )

    # ---------------------------------------------------------------- operator state
    op.create_table(
        "queues",
        sa.Column("queue", sa.Text, primary_key=True),
        sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()),
        _ts("paused_at"),
        sa.Column("paused_by", sa.Text),
        _ts("updated_at", nullable=False, default=True),
        sa.CheckConstraint(f"queue ~ '{NAME}'", name="queues_name_valid"),
    )
    op.create_table(
        "tenant_limits",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("max_running", sa.Integer),
        sa.Column("weight", sa.Float, nullable=False, server_default=sa.text("1")),
        sa.Column("max_queued", sa.Integer),
        _ts("created_at", nullable=False, default=True),
        _ts("updated_at", nullable=False, default=True),
        sa.CheckConstraint(f"tenant ~ '{NAME}'", name="tenant_limits_name_valid"),
        sa.CheckConstraint("max_running IS NULL OR max_running >= 0", name="tenant_limits_running"),
        sa.CheckConstraint("weight > 0 AND weight <= 1000", name="tenant_limits_weight"),
        sa.CheckConstraint("max_queued IS NULL OR max_queued >= 0", name="tenant_limits_queued"),
    )
    op.create_table(
        "tenant_usage",
        sa.Column(
            "tenant",
            sa.Text,
            sa.ForeignKey(
                "tenant_limits.tenant", ondelete="CASCADE", name="tenant_usage_tenant_fkey"
            ),
            primary_key=True,
        ),
        sa.Column("running", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("queued", sa.Integer, nullable=False, server_default=sa.text("0")),
        _ts("queued_at"),
        sa.Column("drain_per_s", sa.Float),
        sa.Column("claimed", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("claimed_seen", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.CheckConstraint("running >= 0", name="tenant_usage_running_non_negative"),
    )
    # A freed slot lets the relay wake the tenant's next job: tell it at once rather
    # than at its next poll. Statement-level, so a batch that frees many slots sends
    # one notification (and PostgreSQL folds repeats within a transaction anyway).
    op.execute(
        """
        CREATE FUNCTION tenant_usage_notify() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
          IF EXISTS (SELECT 1 FROM before_rows b JOIN after_rows a USING (tenant)
                     WHERE a.running < b.running) THEN
            PERFORM pg_notify('outbox', '');
          END IF;
          RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER tenant_usage_notify AFTER UPDATE ON tenant_usage "
        "REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION tenant_usage_notify()"
    )
    op.create_table(
        "fair_shares",
        sa.Column("queue", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("vpass", sa.Float, nullable=False, server_default=sa.text("0")),
        sa.Column("held_reason", sa.Text),
        _ts("held_since"),
        sa.PrimaryKeyConstraint("queue", "tenant", name="fair_shares_pkey"),
    )
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.Text, primary_key=True),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text), nullable=False),
        sa.Column("job_types", postgresql.ARRAY(sa.Text), nullable=False),
        sa.Column("concurrency", sa.Integer, nullable=False),
        sa.Column("prefetch", sa.Integer, nullable=False),
        _ts("started_at", nullable=False, default=True),
        _ts("last_seen_at", nullable=False, default=True),
        sa.Column("stopping", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column(
            "counts", postgresql.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")
        ),
    )
    op.create_table(
        "job_replays",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column(
            "job_id",
            postgresql.UUID(as_uuid=True),
            sa.ForeignKey("jobs.job_id", ondelete="CASCADE", name="job_replays_job_id_fkey"),
            nullable=False,
        ),
        _ts("replayed_at", nullable=False, default=True),
        sa.Column("replayed_by", sa.Text, nullable=False),
        sa.Column("from_state", sa.Text, nullable=False),
        sa.Column("attempts_before", sa.Integer, nullable=False),
    )
    op.create_index("job_replays_job_id_idx", "job_replays", ["job_id"])


def downgrade() -> None:
    op.execute(
        """
        CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
          IF EXISTS (SELECT 1 FROM added WHERE available_at <= now()) THEN
            PERFORM pg_notify('outbox', '');
          END IF;
          RETURN NULL;
        END $$
        """
    )
    op.drop_table("job_replays")
    op.drop_table("workers")
    op.drop_table("fair_shares")
    op.execute("DROP TRIGGER tenant_usage_notify ON tenant_usage")
    op.execute("DROP FUNCTION tenant_usage_notify()")
    op.drop_table("tenant_usage")
    op.drop_table("tenant_limits")
    op.drop_table("queues")

    op.drop_index("job_effects_job_id_idx", table_name="job_effects")
    op.drop_index("outbox_inflight_idx", table_name="outbox")
    op.drop_index("outbox_due_idx", table_name="outbox")
    op.drop_index("outbox_pending_idx", table_name="outbox")
    op.create_index(
        "outbox_unsent_idx",
        "outbox",
        ["available_at", "id"],
        postgresql_where=sa.text("sent_at IS NULL"),
    )
    op.create_index(
        "outbox_sent_idx", "outbox", ["sent_at"], postgresql_where=sa.text("sent_at IS NOT NULL")
    )
    op.drop_column("outbox", "priority")
    op.drop_column("outbox", "tenant")

    op.drop_index("job_attempts_finished_idx", table_name="job_attempts")
    # Give-back rows reuse an attempt number; the old key cannot hold them.
    op.execute("DELETE FROM job_attempts WHERE outcome = 'QUEUED'")
    op.drop_constraint("job_attempts_outcome_valid", "job_attempts", type_="check")
    op.create_check_constraint(
        "job_attempts_outcome_valid", "job_attempts", f"outcome IN ({OUTCOMES_BEFORE})"
    )
    op.drop_column("job_attempts", "traceback")
    op.drop_column("job_attempts", "ready_at")
    op.drop_constraint("job_attempts_pkey", "job_attempts", type_="primary")
    op.create_primary_key("job_attempts_pkey", "job_attempts", ["job_id", "attempt"])

    for index in (
        "jobs_no_handler_idx",
        "jobs_tenant_waiting_idx",
        "jobs_unsuccessful_idx",
        "jobs_finished_idx",
        "jobs_leased_idx",
        "jobs_claimable_idx",
    ):
        op.drop_index(index, table_name="jobs")
    op.create_index(
        "jobs_claimable_idx",
        "jobs",
        ["run_after"],
        postgresql_where=sa.text(f"state IN ({CLAIMABLE})"),
    )
    op.create_index(
        "jobs_leased_idx", "jobs", ["lease_owner"], postgresql_where=sa.text(f"state IN ({LEASED})")
    )
    op.drop_constraint("jobs_slot_only_leased", "jobs", type_="check")
    op.drop_constraint("jobs_tenant_name_valid", "jobs", type_="check")
    for column in (
        "result",
        "progress_at",
        "progress",
        "cancel_requested_at",
        "delay_since",
        "delay_reason",
        "expiry_backoff",
        "holds_slot",
        "tenant",
    ):
        op.drop_column("jobs", column)
