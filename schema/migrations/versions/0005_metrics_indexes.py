"""schedule_fires_fired_idx: the metrics collector reads new fires by fired_at"""

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"


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
