"""relays.failing_queues: the queues a relay cannot publish to right now, and why

A failure that belongs to one queue (RabbitMQ refuses its wake-ups or its
declaration, confirms none in time, its decision times out) backs that queue off
alone in the relay that meets it. That state is the relay process's own, so it goes
on the relay's row, written by the heartbeat that already writes the row, and read
by jobctl: {queue: {reason, detail, since, failures}}.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0009"
down_revision: str | None = "0008"


def upgrade() -> None:
    op.add_column(
        "relays",
        sa.Column("failing_queues", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    )


def downgrade() -> None:
    op.drop_column("relays", "failing_queues")
