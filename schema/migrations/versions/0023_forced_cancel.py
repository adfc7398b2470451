"""Forced cancel requests

jobs.cancel_forced_at: when a cancel request was made with force (NULL: none was,
or only a cooperative one). The worker holding the lease reads it at its next
heartbeat and interrupts the handler instead of waiting for it to stop. A replay
clears it with cancel_requested_at.

Nullable without a default: adding it rewrites nothing.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("cancel_forced_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("jobs", "cancel_forced_at")
