"""schedule_fires_fired_idx: the metrics collector reads new fires by fired_at

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # schedule_fires is pruned to a bounded ledger per schedule, so a plain CREATE
    # INDEX locks a small table for a moment.
    op.create_index(
        "schedule_fires_fired_idx",
        "schedule_fires",
        ["fired_at"],
        postgresql_where=sa.text("outcome = 'enqueued'"),
    )


def downgrade() -> None:
    op.drop_index("schedule_fires_fired_idx", table_name="schedule_fires")
