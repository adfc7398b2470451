"""Tags and metadata on jobs, and the table the search by tag reads

jobs.tags (a few short names, '{}' when none) and jobs.meta (a small JSON object,
NULL when none) are given at enqueue and shown by every surface; a schedule stores
them for the jobs it fires. job_tags holds each tag of each job as a row, keyed
(tag, job_id), so the newest jobs with a tag are a backward walk of its primary key,
as long as a page whatever the tag's share of the history; its rows go with their
job (ON DELETE CASCADE).

Adding the columns rewrites nothing (constant defaults); the CHECKs read the table
once, under the lock the migration holds anyway.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

revision: str = "0022"
down_revision: str | None = "0021"

MAX_TAGS = 16
TAG = "[A-Za-z0-9][A-Za-z0-9_.:/=-]{0,63}"
MAX_META_STORED_BYTES = 65536


def upgrade() -> None:
    for table in ("jobs", "schedules"):
        op.add_column(
            table,
            sa.Column(
                "tags", ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")
            ),
        )
        op.add_column(table, sa.Column("meta", JSONB))
    op.create_check_constraint(
        "jobs_tags_valid",
        "jobs",
        f"cardinality(tags) = 0 OR (cardinality(tags) <= {MAX_TAGS} AND array_ndims(tags) = 1"
        f" AND array_position(tags, NULL) IS NULL"
        f" AND array_to_string(tags, ',') ~ '^{TAG}(,{TAG})*$')",
    )
    op.create_check_constraint(
        "jobs_meta_valid",
        "jobs",
        "meta IS NULL OR (jsonb_typeof(meta) = 'object'"
        f" AND pg_column_size(meta) <= {MAX_META_STORED_BYTES})",
    )
    op.create_table(
        "job_tags",
        sa.Column("tag", sa.Text, nullable=False),
        sa.Column(
            "job_id",
            UUID(as_uuid=True),
            sa.ForeignKey("jobs.job_id", ondelete="CASCADE", name="job_tags_job_id_fkey"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("tag", "job_id", name="job_tags_pkey"),
    )
    # hash: the search must not be offered a walk of job_tags in job_id order
    op.create_index("job_tags_job_id_idx", "job_tags", ["job_id"], postgresql_using="hash")


def downgrade() -> None:
    op.drop_index("job_tags_job_id_idx", table_name="job_tags")
    op.drop_table("job_tags")
    op.drop_constraint("jobs_meta_valid", "jobs")
    op.drop_constraint("jobs_tags_valid", "jobs")
    for table in ("schedules", "jobs"):
        op.drop_column(table, "meta")
        op.drop_column(table, "tags")
