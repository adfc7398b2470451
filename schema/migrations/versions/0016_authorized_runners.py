"""Authorized runners: a tenant served only by the consumers that name it

tenant_limits.runners is 'shared' (any consumer of the queue takes its jobs, the
default) or 'dedicated' (only consumers started with ``--tenant`` naming it);
workers.tenants is what a consumer names. A dedicated tenant's job turned down by
another consumer waits as NO_AUTHORIZED_RUNNER, found through
jobs_no_runner_idx when a consumer naming its tenant starts. The claim reads the
dedicated tenants through tenant_limits_dedicated_idx: one probe of an empty index
while no tenant is dedicated.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision: str = "0016"
down_revision: str | None = "0015"

CLAIMABLE = "'QUEUED', 'RETRY_WAIT'"


def upgrade() -> None:
    op.add_column(
        "tenant_limits",
        sa.Column("runners", sa.Text, nullable=False, server_default=sa.text("'shared'")),
    )
    op.create_check_constraint(
        "tenant_limits_runners", "tenant_limits", "runners IN ('shared', 'dedicated')"
    )
    op.create_index(
        "tenant_limits_dedicated_idx",
        "tenant_limits",
        ["tenant"],
        postgresql_where=sa.text("runners = 'dedicated'"),
    )
    op.add_column(
        "workers",
        sa.Column(
            "tenants", ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")
        ),
    )
    op.create_index(
        "jobs_no_runner_idx",
        "jobs",
        ["tenant", "queue"],
        postgresql_where=sa.text(
            f"delay_reason = 'NO_AUTHORIZED_RUNNER' AND state IN ({CLAIMABLE})"
        ),
    )


def downgrade() -> None:
    op.drop_index("jobs_no_runner_idx", table_name="jobs")
    op.drop_column("workers", "tenants")
    op.drop_index("tenant_limits_dedicated_idx", table_name="tenant_limits")
    op.drop_constraint("tenant_limits_runners", "tenant_limits")
    op.drop_column("tenant_limits", "runners")
