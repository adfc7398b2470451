"""An enqueue with after= holds no lock on a running parent until it commits

Under 0015 the producer locked each parent FOR NO KEY UPDATE (and marked it
has_dependants) until it committed, so that a parent ending meanwhile waited and
then saw the new edge. A running parent's heartbeats and outcome wait on the same
lock: a long producer transaction cost the worker its lease.

Now the producer locks its parents FOR KEY SHARE only (retention cannot delete them;
their leases go on), and each new edge is checked at the producer's commit by a
deferred constraint trigger, job_dependencies_check. It locks the parent's row for
that instant and marks it has_dependants: a parent ending at the same time either
committed first, and the check settles the edge as the parent's end would have (done
and counted, the child made due and woken once its last parent is done; or the child
cancelled, PARENT_FAILED), or waits for this commit, and its own trigger then sees
the edge. Exactly one of them settles it.
"""

from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"

_CHECK = """
CREATE FUNCTION job_dependencies_check() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  parent_state text;
  marked boolean;
  policy text;
BEGIN
  SELECT state, has_dependants INTO parent_state, marked
  FROM jobs WHERE job_id = NEW.parent_id
  FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;  -- deleted with its edges
  END IF;
  IF NOT marked THEN
    UPDATE jobs SET has_dependants = true WHERE job_id = NEW.parent_id;
  END IF;
  IF parent_state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED') THEN
    RETURN NULL;  -- its end, after this commit, settles the edge
  END IF;
  -- The parent ended after the producer read its state: settle the edge here.
  SELECT on_parent_failure INTO policy FROM jobs WHERE job_id = NEW.child_id
  FOR NO KEY UPDATE;
  IF parent_state = 'SUCCEEDED' OR policy = 'run' THEN
    UPDATE job_dependencies SET done = true, counted = true
    WHERE child_id = NEW.child_id AND parent_id = NEW.parent_id AND NOT done;
    IF FOUND THEN
      WITH counted AS (
        UPDATE jobs AS c
        SET parents_pending = c.parents_pending - 1,
            run_after = CASE WHEN c.parents_pending = 1 AND c.state = 'QUEUED'
                             THEN now() ELSE c.run_after END,
            delay_reason = CASE WHEN c.parents_pending = 1 AND c.state = 'QUEUED'
                                THEN NULL ELSE c.delay_reason END,
            delay_since = CASE WHEN c.parents_pending = 1 AND c.state = 'QUEUED'
                               THEN NULL ELSE c.delay_since END,
            updated_at = now()
        WHERE c.job_id = NEW.child_id
        RETURNING c.job_id, c.queue, c.tenant, c.priority, c.run_after, c.parents_pending,
                  c.state
      )
      INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
      SELECT job_id, queue, COALESCE(tenant, ''), priority, run_after FROM counted
      WHERE parents_pending = 0 AND state = 'QUEUED';
    END IF;
  ELSE
    UPDATE jobs AS c
    SET state = 'CANCELLED',
        finished_at = statement_timestamp(),
        last_error_code = 'PARENT_FAILED',
        last_error_message = 'job ' || NEW.parent_id || ' it depends on ended ' || parent_state,
        delay_reason = NULL,
        delay_since = NULL,
        updated_at = now()
    WHERE c.job_id = NEW.child_id AND c.state = 'QUEUED';
  END IF;
  RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.execute(_CHECK)
    op.execute(
        "CREATE CONSTRAINT TRIGGER job_dependencies_check AFTER INSERT ON job_dependencies "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NOT NEW.done) "
        "EXECUTE FUNCTION job_dependencies_check()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER job_dependencies_check ON job_dependencies")
    op.execute("DROP FUNCTION job_dependencies_check()")
