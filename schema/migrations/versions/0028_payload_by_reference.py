"""Payloads by reference: job_inputs, and jobs.payload_ref

A large or sensitive input is stored once in job_inputs (its JSON content, its size,
whether it is sensitive) and a job names it in jobs.payload_ref instead of carrying
it in jobs.payload, so the hot table stays narrow and several jobs can share one
input. Redaction empties content and records when, by whom and why
(redacted_at, redacted_by, redaction_reason); the CHECK keeps content and
redacted_at exclusive.

The reference is kept by two triggers rather than a foreign key, whose check would
be queued for every job inserted, a NULL reference too: jobs_payload_ref_check, whose
WHEN clause passes over a job without a reference, refuses (SQLSTATE 23503, as a
foreign key would) a job naming an input that does not exist, and holds the input
FOR KEY SHARE, as a foreign key's check does, until the inserting transaction ends;
job_inputs_keep_named refuses the delete of an input a job still names, looking
with a fresh snapshot, so a job committed after the deleting statement began is
seen. jobs_payload_ref_idx, partial, finds the jobs that name an input; a job
without one adds nothing to it. Both functions run with the search_path the
migration ran with.

The new table takes no lock on another. Adding the nullable column rewrites nothing;
the partial index reads jobs once (every payload_ref is NULL), under the ACCESS
EXCLUSIVE lock the added column takes until the migration commits: writes and reads
of jobs wait for that scan. CREATE TRIGGER takes SHARE ROW EXCLUSIVE on jobs and on
job_inputs, for a moment each.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision: str = "0028"
down_revision: str | None = "0027"

CHECK_FUNCTION = """
CREATE FUNCTION jobs_payload_ref_check() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  PERFORM 1 FROM job_inputs WHERE input_id = NEW.payload_ref FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'job % names stored input %, which does not exist',
                    NEW.job_id, NEW.payload_ref
      USING ERRCODE = 'foreign_key_violation';
  END IF;
  RETURN NULL;
END
$$
"""

KEEP_FUNCTION = """
CREATE FUNCTION job_inputs_keep_named() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  named uuid;
BEGIN
  SELECT job_id INTO named FROM jobs WHERE payload_ref = OLD.input_id LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'stored input % is named by job %', OLD.input_id, named
      USING ERRCODE = 'foreign_key_violation';
  END IF;
  RETURN OLD;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "job_inputs",
        sa.Column("input_id", UUID(as_uuid=True), nullable=False),
        sa.Column("content", JSONB),
        sa.Column("size_bytes", sa.Integer, nullable=False),
        sa.Column("sensitive", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("redacted_at", sa.DateTime(timezone=True)),
        sa.Column("redacted_by", sa.Text),
        sa.Column("redaction_reason", sa.Text),
        sa.PrimaryKeyConstraint("input_id", name="job_inputs_pkey"),
        sa.CheckConstraint(
            "(content IS NULL) = (redacted_at IS NOT NULL)", name="job_inputs_content_or_redacted"
        ),
        sa.CheckConstraint("size_bytes >= 0", name="job_inputs_size_non_negative"),
    )
    op.create_index("job_inputs_created_idx", "job_inputs", ["created_at"])
    op.add_column("jobs", sa.Column("payload_ref", UUID(as_uuid=True)))
    op.create_index(
        "jobs_payload_ref_idx",
        "jobs",
        ["payload_ref"],
        postgresql_where=sa.text("payload_ref IS NOT NULL"),
    )
    op.execute(CHECK_FUNCTION)
    op.execute(
        "CREATE TRIGGER jobs_payload_ref_check AFTER INSERT OR UPDATE OF payload_ref ON jobs"
        " FOR EACH ROW WHEN (NEW.payload_ref IS NOT NULL)"
        " EXECUTE FUNCTION jobs_payload_ref_check()"
    )
    op.execute(KEEP_FUNCTION)
    op.execute(
        "CREATE TRIGGER job_inputs_keep_named BEFORE DELETE ON job_inputs"
        " FOR EACH ROW EXECUTE FUNCTION job_inputs_keep_named()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER job_inputs_keep_named ON job_inputs")
    op.execute("DROP FUNCTION job_inputs_keep_named()")
    op.execute("DROP TRIGGER jobs_payload_ref_check ON jobs")
    op.execute("DROP FUNCTION jobs_payload_ref_check()")
    op.drop_index("jobs_payload_ref_idx", table_name="jobs")
    op.drop_column("jobs", "payload_ref")
    op.drop_index("job_inputs_created_idx", table_name="job_inputs")
    op.drop_table("job_inputs")
