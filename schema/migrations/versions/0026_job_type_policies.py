"""What a job type allows: replay, cancelling a running job, what a cancel promises

job_type_policies holds, per job type whose handler declares one, whether its failed
and cancelled jobs may be replayed (replay), whether a running job of it may be asked
to stop (cancel_running), and what its cancellation promises (on_cancel, text shown
to operators). Consumers write it at start-up from their handlers' declarations
(the last to start wins; updated_by names it), because the operators and producers
who replay and cancel do not load the handler registry: the statements read it. A
type without a row allows everything, as before.

job_replays.forced records a replay that overrode its type's policy, and
jobs.cancel_override_by who asked a running job to stop against its type's policy
(the request's time is cancel_requested_at).

The new table takes no lock on another. Each added column is nullable or has a
constant default, so it rewrites nothing: ACCESS EXCLUSIVE on job_replays and on
jobs for a moment each.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"


def upgrade() -> None:
    op.create_table(
        "job_type_policies",
        sa.Column("job_type", sa.Text, nullable=False),
        sa.Column("replay", sa.Boolean, nullable=False, server_default=sa.text("true")),
        sa.Column("cancel_running", sa.Boolean, nullable=False, server_default=sa.text("true")),
        sa.Column("on_cancel", sa.Text),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("updated_by", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("job_type", name="job_type_policies_pkey"),
    )
    op.add_column(
        "job_replays",
        sa.Column("forced", sa.Boolean, nullable=False, server_default=sa.text("false")),
    )
    op.add_column("jobs", sa.Column("cancel_override_by", sa.Text))


def downgrade() -> None:
    op.drop_column("jobs", "cancel_override_by")
    op.drop_column("job_replays", "forced")
    op.drop_table("job_type_policies")
