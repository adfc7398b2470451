"""Entity keys: at most key_limit leases per key at once, and order per key

jobs.key names the thing a job is about; key_usage counts the leases each key holds
now, one row per key only while it holds one (the claim upserts it, the end of the
last lease deletes it), so millions of keys cost nothing while idle. An ordered job
(key_order 'ordered' or 'strict') carries key_seq, taken from jobs_key_seq under a
transaction-scoped advisory lock on its key, so two producers' jobs of one key are
numbered in the order their transactions commit.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"

CLAIMABLE = "'QUEUED', 'RETRY_WAIT'"
LEASED = "'CANCEL_REQUESTED', 'RUNNING'"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("key", sa.Text))
    op.add_column("jobs", sa.Column("key_limit", sa.Integer))
    op.add_column("jobs", sa.Column("key_order", sa.Text))
    op.add_column("jobs", sa.Column("key_seq", sa.BigInteger))
    op.create_check_constraint(
        "jobs_key_length", "jobs", "key IS NULL OR char_length(key) BETWEEN 1 AND 500"
    )
    op.create_check_constraint(
        "jobs_key_limit_valid",
        "jobs",
        "(key IS NULL) = (key_limit IS NULL) AND (key_limit IS NULL OR key_limit >= 1)",
    )
    op.create_check_constraint(
        "jobs_key_order_valid",
        "jobs",
        "key_order IS NULL OR (key_order IN ('ordered', 'strict') AND key IS NOT NULL"
        " AND key_seq IS NOT NULL)",
    )
    op.execute("CREATE SEQUENCE jobs_key_seq AS bigint")
    op.create_index(
        "jobs_key_waiting_idx",
        "jobs",
        ["key", "key_seq", "job_id"],
        postgresql_where=sa.text(f"key IS NOT NULL AND state IN ({CLAIMABLE})"),
    )
    op.create_index(
        "jobs_key_order_idx",
        "jobs",
        ["key", "key_seq"],
        postgresql_where=sa.text(
            f"key_seq IS NOT NULL AND (state IN ({CLAIMABLE}, {LEASED})"
            " OR (state = 'FAILED' AND key_order = 'strict'))"
        ),
    )
    op.create_index(
        "jobs_key_leased_idx",
        "jobs",
        ["key"],
        postgresql_where=sa.text(f"key IS NOT NULL AND state IN ({LEASED})"),
    )
    op.create_table(
        "key_usage",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("running", sa.Integer, nullable=False),
        sa.Column("key_limit", sa.Integer, nullable=False),
        sa.CheckConstraint("running >= 0", name="key_usage_running_non_negative"),
    )


def downgrade() -> None:
    op.drop_table("key_usage")
    op.drop_index("jobs_key_leased_idx", table_name="jobs")
    op.drop_index("jobs_key_order_idx", table_name="jobs")
    op.drop_index("jobs_key_waiting_idx", table_name="jobs")
    op.execute("DROP SEQUENCE jobs_key_seq")
    op.drop_constraint("jobs_key_order_valid", "jobs")
    op.drop_constraint("jobs_key_limit_valid", "jobs")
    op.drop_constraint("jobs_key_length", "jobs")
    op.drop_column("jobs", "key_seq")
    op.drop_column("jobs", "key_order")
    op.drop_column("jobs", "key_limit")
    op.drop_column("jobs", "key")
