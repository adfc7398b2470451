"""Exclusive resources and the uncertain target

jobs.resource names a target at most one lease may act on at once (a deploy
environment, a device). resource_holds has a row per resource while one is held:
the claim inserts it for the lease it starts, a clean end of that lease deletes it,
and a lease that expires leaves it marked uncertain_since, so no job of the resource
starts until outbox.resolve_resource (recorded in resource_resolutions) frees it.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision: str = "0017"
down_revision: str | None = "0016"

CLAIMABLE = "'QUEUED', 'RETRY_WAIT'"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("resource", sa.Text))
    op.create_check_constraint(
        "jobs_resource_length",
        "jobs",
        "resource IS NULL OR char_length(resource) BETWEEN 1 AND 500",
    )
    op.create_check_constraint("jobs_key_or_resource", "jobs", "key IS NULL OR resource IS NULL")
    op.create_index(
        "jobs_resource_waiting_idx",
        "jobs",
        ["resource", "job_id"],
        postgresql_where=sa.text(f"resource IS NOT NULL AND state IN ({CLAIMABLE})"),
    )
    op.create_table(
        "resource_holds",
        sa.Column("resource", sa.Text, primary_key=True),
        sa.Column("job_id", UUID(as_uuid=True), nullable=False),
        sa.Column("lease_generation", sa.BigInteger, nullable=False),
        sa.Column(
            "held_since",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("uncertain_since", sa.DateTime(timezone=True)),
    )
    op.create_table(
        "resource_resolutions",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("resource", sa.Text, nullable=False),
        sa.Column("job_id", UUID(as_uuid=True), nullable=False),
        sa.Column("uncertain_since", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "resolved_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("resolved_by", sa.Text, nullable=False),
        sa.Column("outcome", sa.Text),
    )
    op.create_index(
        "resource_resolutions_resource_idx",
        "resource_resolutions",
        ["resource", "resolved_at"],
    )


def downgrade() -> None:
    op.drop_index("resource_resolutions_resource_idx", table_name="resource_resolutions")
    op.drop_table("resource_resolutions")
    op.drop_table("resource_holds")
    op.drop_index("jobs_resource_waiting_idx", table_name="jobs")
    op.drop_constraint("jobs_key_or_resource", "jobs")
    op.drop_constraint("jobs_resource_length", "jobs")
    op.drop_column("jobs", "resource")
