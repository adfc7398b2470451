"""Each instance in its own schema: functions pinned to it, NOTIFY channels named by it

Several instances can share a database, each in its own schema
(HYBRID_JOBS_SCHEMA). The triggers' functions now run with the search_path this
migration runs with (the instance's schema), as hybrid_jobs_enqueue already did: a
trigger fired by a statement from a connection that looks elsewhere (a producer's
engine that appends the instance's schema to its own, a caller of
``<schema>.hybrid_jobs_enqueue``) still finds its instance's tables, never another
instance's. And the triggers notify channels named after their table's schema
(``<schema>.outbox``, ``<schema>.job_finished``), so two instances do not wake each
other's relay and waiters.

The functions are named here, not found: an install in ``public`` shares that schema
with the application's own functions, which this must not touch. A notifying
function is rewritten from its current definition, whatever a later migration made
of the rest of its body.

Takes no lock on any table: ALTER and CREATE OR REPLACE FUNCTION write the catalog.
"""

from alembic import op

revision: str = "0031"
down_revision: str | None = "0030"

# The trigger functions of migrations 0001-0027 (hybrid_jobs_enqueue, 0027, has had
# its search_path from the start).
_TRIGGER_FUNCTIONS = (
    "job_attempts_append_only",
    "outbox_notify",
    "tenant_usage_notify",
    "jobs_finished_notify",
    "jobs_release_dependants",
    "jobs_count_dependants",
    "jobs_hand_on",
    "job_dependencies_check",
)
_CHANNELS = "outbox|job_finished"


def _each_function(body: str) -> str:
    """A DO block running ``body`` for each function of the list that exists in the
    instance's schema (where the search_path finds the jobs table), as ``f``."""
    names = ", ".join(f"'{name}'" for name in _TRIGGER_FUNCTIONS)
    return f"""
DO $migration$
DECLARE
  f record;
BEGIN
  FOR f IN
    SELECT p.oid, p.oid::regprocedure AS signature, pg_get_functiondef(p.oid) AS definition
    FROM pg_catalog.pg_proc AS p
    WHERE p.pronamespace = (SELECT relnamespace FROM pg_catalog.pg_class
                            WHERE oid = 'jobs'::regclass)
      AND p.proname IN ({names}) AND p.pronargs = 0
  LOOP
    {body}
  END LOOP;
END
$migration$
"""


def upgrade() -> None:
    op.execute(
        _each_function(
            f"""EXECUTE regexp_replace(f.definition, 'pg_notify\\(\\s*''({_CHANNELS})''',
                           'pg_notify(left(TG_TABLE_SCHEMA, 48) || ''.\\1''', 'g');
    EXECUTE format('ALTER FUNCTION %s SET search_path FROM CURRENT', f.signature);"""
        )
    )


def downgrade() -> None:
    op.execute(
        _each_function(
            f"""EXECUTE regexp_replace(f.definition,
                           'pg_notify\\(left\\(TG_TABLE_SCHEMA, 48\\) \\|\\| ''\\.({_CHANNELS})''',
                           'pg_notify(''\\1''', 'g');
    EXECUTE format('ALTER FUNCTION %s RESET search_path', f.signature);"""
        )
    )
