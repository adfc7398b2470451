"""The backlog of tenants' wake-ups in the order they go, across tenants

outbox_turn_idx holds, per queue, the unsent wake-ups of jobs that have a tenant, by
priority (highest first), then age. Where a queue has many tenants with a backlog,
the relay's decision reads the first few of them from it and so finds the tenants
whose turn comes next, instead of every tenant's first wake-up at every pass. Jobs
of no tenant are left out: a queue without tenants never reads it, and a plain
enqueue writes no entry to it.

Locks: the index is built with a SHARE lock on outbox (enqueues and the relay's
marks wait while it is built; it reads the whole table, which holds the backlog and
the wake-ups in flight).
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0038"
down_revision: str | None = "0037"


def upgrade() -> None:
    op.create_index(
        "outbox_turn_idx",
        "outbox",
        ["queue", sa.text("priority DESC"), "available_at", "id"],
        postgresql_include=["tenant"],
        postgresql_where=sa.text("sent_at IS NULL AND tenant <> ''"),
    )


def downgrade() -> None:
    op.drop_index("outbox_turn_idx", table_name="outbox")
