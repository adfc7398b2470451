"""a job's trace context

- jobs.trace_context: the W3C trace context (traceparent, tracestate) of the code
  that enqueued the job, so the relay's publish, the claim and the handler's run
  join its trace (the otel extra); NULL without it.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0011"
down_revision: str | None = "0010"


def upgrade() -> None:
    # Nullable without a default: adding it rewrites nothing.
    op.add_column("jobs", sa.Column("trace_context", JSONB))


def downgrade() -> None:
    op.drop_column("jobs", "trace_context")
