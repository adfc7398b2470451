"""Completion webhooks: a URL called when a job ends

- jobs.webhook_url: the URL a job was enqueued with (``on_complete_url=``); NULL for
  a job without one.
- job_type_webhooks: the URL a job type's handler declares (``webhook=``), one row
  per such type, written by consumers at start-up (the last to start wins).
- webhook_deliveries: one row per call owed, written by the trigger below in the
  transaction that ends the job, so a job's end and its call commit together. The
  relay claims due rows with a lease (next_attempt_at pushed past the call's
  timeout, lease_owner, attempts as the fencing token), calls without a
  transaction open, and records the outcome: DELIVERED, a retry after a back-off,
  or GAVE_UP once the attempts are spent.
- jobs_webhook: a row trigger on an update that moves a job into a final state. A
  job enqueued with a URL owes a call to it; any other looks its type up (a probe
  of job_type_webhooks' primary key, a table with a row per type that has one).
  An update that ends no job pays for the WHEN clause, tested on the row in memory.

New tables take no lock on another. The added column is nullable, so it rewrites
nothing: ACCESS EXCLUSIVE on jobs for a moment; CREATE TRIGGER takes SHARE ROW
EXCLUSIVE on jobs for a moment.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"

# Copied, not imported: the migration keeps meaning what it meant.
_MAX_URL = 2048
_MAX_MESSAGE = 2000

_FUNCTION = f"""
CREATE FUNCTION jobs_webhook() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  target text := NEW.webhook_url;
BEGIN
  IF target IS NULL THEN
    SELECT w.url INTO target FROM job_type_webhooks AS w WHERE w.job_type = NEW.job_type;
    IF target IS NULL THEN
      RETURN NULL;
    END IF;
  END IF;
  INSERT INTO webhook_deliveries (job_id, url, endpoint, body)
  VALUES (
    NEW.job_id,
    target,
    lower(substring(target FROM '^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*')),
    jsonb_build_object(
      'event', 'job.finished',
      'job_id', NEW.job_id,
      'job_type', NEW.job_type,
      'queue', NEW.queue,
      'state', NEW.state,
      'attempts', NEW.attempt_count,
      'finished_at', coalesce(NEW.finished_at, now()),
      'error', CASE WHEN NEW.state = 'SUCCEEDED'
                     OR (NEW.last_error_code IS NULL AND NEW.last_error_message IS NULL)
                    THEN NULL
                    ELSE jsonb_build_object(
                      'code', NEW.last_error_code,
                      'message', left(NEW.last_error_message, {_MAX_MESSAGE}))
               END
    )
  );
  RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.add_column("jobs", sa.Column("webhook_url", sa.Text))
    op.create_table(
        "job_type_webhooks",
        sa.Column("job_type", sa.Text, nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("updated_by", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("job_type", name="job_type_webhooks_pkey"),
        sa.CheckConstraint(
            f"url ~* '^https?://' AND char_length(url) <= {_MAX_URL}",
            name="job_type_webhooks_url_valid",
        ),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("delivery_id", sa.BigInteger, sa.Identity(always=True), nullable=False),
        sa.Column("job_id", sa.UUID, nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("endpoint", sa.Text, nullable=False),
        sa.Column("body", sa.dialects.postgresql.JSONB, nullable=False),
        sa.Column("state", sa.Text, nullable=False, server_default=sa.text("'PENDING'")),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column(
            "next_attempt_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("lease_owner", sa.Text),
        sa.Column("last_status", sa.Integer),
        sa.Column("last_error", sa.Text),
        sa.Column("delivered_at", sa.DateTime(timezone=True)),
        sa.Column("gave_up_at", sa.DateTime(timezone=True)),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.PrimaryKeyConstraint("delivery_id", name="webhook_deliveries_pkey"),
        sa.CheckConstraint(
            "state IN ('DELIVERED', 'GAVE_UP', 'PENDING')", name="webhook_deliveries_state_valid"
        ),
        sa.CheckConstraint(
            f"url ~* '^https?://' AND char_length(url) <= {_MAX_URL}",
            name="webhook_deliveries_url_valid",
        ),
        sa.CheckConstraint("attempts >= 0", name="webhook_deliveries_attempts_non_negative"),
    )
    op.create_index(
        "webhook_deliveries_due_idx",
        "webhook_deliveries",
        ["next_attempt_at"],
        postgresql_where=sa.text("state = 'PENDING'"),
    )
    op.create_index(
        "webhook_deliveries_done_idx",
        "webhook_deliveries",
        ["updated_at"],
        postgresql_where=sa.text("state <> 'PENDING'"),
    )
    op.create_index("webhook_deliveries_job_id_idx", "webhook_deliveries", ["job_id"])
    op.execute(_FUNCTION)
    op.execute(
        "CREATE TRIGGER jobs_webhook AFTER UPDATE OF state ON jobs FOR EACH ROW "
        "WHEN (NEW.state IN ('CANCELLED', 'FAILED', 'SUCCEEDED') "
        "AND OLD.state IS DISTINCT FROM NEW.state) "
        "EXECUTE FUNCTION jobs_webhook()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_webhook ON jobs")
    op.execute("DROP FUNCTION jobs_webhook()")
    op.drop_table("webhook_deliveries")
    op.drop_table("job_type_webhooks")
    op.drop_column("jobs", "webhook_url")
