"""A consumer whose lease lapsed counts as gone until it is heard from again

workers.lease_lapsed_at: when the sweeper last expired a lease of this consumer.
A consumer that lets a lease lapse was killed or is frozen; its row still looked
live until its heartbeat aged past the TTL (60 s by default), with its slots free
once the sweeper had taken its leases back. Meanwhile every consumer without the
handler that turned a job of its type down sent the job's wake-up straight back,
for that consumer's free slot: about one wake-up per waiting job per second. A
row whose lease lapsed after it was last seen is no longer live; the consumer's
next heartbeat of its row makes it live again, and wakes the jobs that waited for
it meanwhile.

Adds a nullable column without a default: a catalog change, no rewrite of the
table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0036"
down_revision: str | None = "0035"


def upgrade() -> None:
    op.add_column("workers", sa.Column("lease_lapsed_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("workers", "lease_lapsed_at")
