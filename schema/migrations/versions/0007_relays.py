"""relays: each relay's presence, kept fresh by its heartbeat

The outbox holds the backlog beyond each queue's window by design, so the age of its
oldest unsent row says nothing about whether a relay is working. A row per relay,
with whether it is connected to RabbitMQ and how much it published, does.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"


def _ts(name: str) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(
        name, sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
    )


def upgrade() -> None:
    op.create_table(
        "relays",
        sa.Column("relay_id", sa.Text, primary_key=True),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        _ts("started_at"),
        _ts("last_seen_at"),
        sa.Column("broker_connected", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("published", sa.BigInteger, nullable=False, server_default=sa.text("0")),
    )


def downgrade() -> None:
    op.drop_table("relays")
