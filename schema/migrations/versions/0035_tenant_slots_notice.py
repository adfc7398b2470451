"""A freed tenant slot tells the relay so, not "look everywhere"

tenant_usage_notify notified the relay's channel with an empty payload when a
statement lowered a tenant's running count, which the relay reads as "any queue may
have wake-ups due": it scanned for due queues again. Under tenant caps every end
of a lease lowers one, so a drain of capped tenants made that scan once per
outcome statement (719 scans of 4.6 ms each in a drain of 20,000 jobs over 10,000
tenants). The payload is now ``*``, which no queue name can be (they start with a
letter or a digit): the relay looks again at the queues whose last pass held
wake-ups back, which are those a freed slot can matter to, and scans only when it
knows of none.

Takes no lock on any table: CREATE OR REPLACE FUNCTION writes the catalog.
"""

from __future__ import annotations

from alembic import op

revision: str = "0035"
down_revision: str | None = "0034"


def _function(payload: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION tenant_usage_notify() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM before_rows b JOIN after_rows a USING (tenant)
             WHERE a.running < b.running) THEN
    PERFORM pg_notify(left(TG_TABLE_SCHEMA, 48) || '.outbox', '{payload}');
  END IF;
  RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.execute(_function("*"))


def downgrade() -> None:
    op.execute(_function(""))
