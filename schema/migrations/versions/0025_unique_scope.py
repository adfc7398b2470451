"""The scope of a dedup key: held while the job waits, while it is active, or for a period

enqueue(..., dedup_key=K) holds K for its job type until retention deletes the job
(jobs.dedup_key, jobs_dedup_idx), and still does by default. With unique= the key
goes to jobs.unique_key instead, with its scope in jobs.unique_scope ('waiting',
'active' or 'period') and, for a period, the end of the clock's window it was
enqueued in (jobs.unique_until). jobs_unique_idx holds the key only while its
predicate is true of the row (not started yet; not ended yet; always, the window
being part of the key), so the claim, every end and every other statement that moves
a job out of its scope frees the key without writing it; a replay, the only way back
into a scope, clears it. Rows already there keep their dedup_key: 'forever', as
before.

Adding the nullable columns rewrites nothing. The CHECK and the index each read the
table once, under the ACCESS EXCLUSIVE lock the added columns take until the
migration commits: writes and reads of jobs wait for those two scans.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"

MAX_DEDUP_KEY_LENGTH = 500
HELD = (
    "unique_key IS NOT NULL AND CASE unique_scope"
    " WHEN 'waiting' THEN state = 'QUEUED' AND started_at IS NULL"
    " WHEN 'active' THEN state IN ('CANCEL_REQUESTED', 'QUEUED', 'RETRY_WAIT', 'RUNNING')"
    " ELSE true END"
)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("unique_key", sa.Text))
    op.add_column("jobs", sa.Column("unique_scope", sa.Text))
    op.add_column("jobs", sa.Column("unique_until", sa.DateTime(timezone=True)))
    op.create_check_constraint(
        "jobs_unique_valid",
        "jobs",
        "(unique_key IS NULL) = (unique_scope IS NULL)"
        " AND (unique_scope IS NULL OR unique_scope IN ('waiting', 'active', 'period'))"
        " AND (unique_scope IS NOT DISTINCT FROM 'period') = (unique_until IS NOT NULL)"
        " AND (unique_key IS NULL"
        f" OR char_length(unique_key) BETWEEN 1 AND {MAX_DEDUP_KEY_LENGTH})",
    )
    op.create_index(
        "jobs_unique_idx",
        "jobs",
        ["job_type", "unique_key", "unique_until"],
        unique=True,
        postgresql_nulls_not_distinct=True,
        postgresql_where=sa.text(HELD),
    )


def downgrade() -> None:
    op.drop_index("jobs_unique_idx", table_name="jobs")
    op.drop_constraint("jobs_unique_valid", "jobs", type_="check")
    op.drop_column("jobs", "unique_until")
    op.drop_column("jobs", "unique_scope")
    op.drop_column("jobs", "unique_key")
