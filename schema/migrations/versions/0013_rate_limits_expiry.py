"""deadlines, debounce, rate limits, a tenant's enqueue rate

- jobs.expires_at: a job not started by then never starts (the claim and the
  relay's sweep end it CANCELLED, code EXPIRED); jobs_expiring_idx is the sweep's;
- jobs.debounce_key, debounce_until: a debounced job, replaced by a new enqueue
  with its key while it has not started (jobs_debounce_idx holds the key only then),
  and the latest its start may be moved to;
- jobs.rate_limit: the rate limit a job takes a token of at claim;
  jobs_rate_limited_idx and jobs_expired_idx: what the metrics' gauges count;
- rate_limits: the limits (a name ending ':*' covers every name with that prefix);
- rate_buckets: one token bucket per name in use, taken from by the claim;
- tenant_limits.max_enqueue_rate, enqueue_tokens, enqueue_refilled_at: the
  tenant's enqueue bucket, taken from by the enqueue.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"

CLAIMABLE = "'QUEUED', 'RETRY_WAIT'"
NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}(:\*)?$"


def _ts(name: str, **kw: object) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, sa.DateTime(timezone=True), **kw)  # type: ignore[arg-type]


def upgrade() -> None:
    op.add_column("jobs", _ts("expires_at"))
    op.add_column("jobs", sa.Column("debounce_key", sa.Text))
    op.add_column("jobs", _ts("debounce_until"))
    op.add_column("jobs", sa.Column("rate_limit", sa.Text))
    op.create_index(
        "jobs_expiring_idx",
        "jobs",
        ["expires_at"],
        postgresql_where=sa.text(f"expires_at IS NOT NULL AND state IN ({CLAIMABLE})"),
    )
    op.create_index(
        "jobs_rate_limited_idx",
        "jobs",
        ["queue"],
        postgresql_where=sa.text(f"delay_reason = 'RATE_LIMITED' AND state IN ({CLAIMABLE})"),
    )
    op.create_index(
        "jobs_expired_idx",
        "jobs",
        ["queue"],
        postgresql_where=sa.text("state = 'CANCELLED' AND last_error_code = 'EXPIRED'"),
    )
    op.create_index(
        "jobs_debounce_idx",
        "jobs",
        ["job_type", "debounce_key"],
        unique=True,
        postgresql_where=sa.text(
            "debounce_key IS NOT NULL AND state = 'QUEUED' AND started_at IS NULL"
        ),
    )
    op.create_table(
        "rate_limits",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("rate", sa.Float, nullable=False),
        sa.Column("per_seconds", sa.Float, nullable=False),
        sa.Column("burst", sa.Float, nullable=False),
        _ts("created_at", nullable=False, server_default=sa.text("now()")),
        _ts("updated_at", nullable=False, server_default=sa.text("now()")),
        sa.CheckConstraint(f"name ~ '{NAME}'", name="rate_limits_name_valid"),
        sa.CheckConstraint("rate > 0 AND per_seconds > 0", name="rate_limits_rate_positive"),
        sa.CheckConstraint("burst >= 1", name="rate_limits_burst_positive"),
    )
    op.create_table(
        "rate_buckets",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("tokens", sa.Float, nullable=False),
        sa.Column("taken", sa.Integer, nullable=False, server_default=sa.text("0")),
        _ts("refilled_at", nullable=False, server_default=sa.text("now()")),
    )
    op.add_column("tenant_limits", sa.Column("max_enqueue_rate", sa.Float))
    op.add_column("tenant_limits", sa.Column("enqueue_tokens", sa.Float))
    op.add_column("tenant_limits", _ts("enqueue_refilled_at"))
    op.create_check_constraint(
        "tenant_limits_enqueue_rate",
        "tenant_limits",
        "max_enqueue_rate IS NULL OR max_enqueue_rate > 0",
    )


def downgrade() -> None:
    op.drop_constraint("tenant_limits_enqueue_rate", "tenant_limits")
    op.drop_column("tenant_limits", "enqueue_refilled_at")
    op.drop_column("tenant_limits", "enqueue_tokens")
    op.drop_column("tenant_limits", "max_enqueue_rate")
    op.drop_table("rate_buckets")
    op.drop_table("rate_limits")
    op.drop_index("jobs_debounce_idx", table_name="jobs")
    op.drop_index("jobs_expired_idx", table_name="jobs")
    op.drop_index("jobs_rate_limited_idx", table_name="jobs")
    op.drop_index("jobs_expiring_idx", table_name="jobs")
    op.drop_column("jobs", "rate_limit")
    op.drop_column("jobs", "debounce_until")
    op.drop_column("jobs", "debounce_key")
    op.drop_column("jobs", "expires_at")
