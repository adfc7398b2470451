"""Count a child's parents down once per statement, not once per parent

Under 0015 the end of each parent updated its child's row (parents_pending - 1) in
its own row trigger: an outcome of 50 parents of one callback wrote the child's row
50 times in one statement. Those versions cannot be pruned before the commit, so the
child's page fills, the updates stop being HOT and each one writes every index of
jobs: a fan-in outcome cost 3 to 5 times a plain one (45-120 ms for 50 parents
against 14-22 ms), paid at the last parent's end too, before its callback's
wake-up.

Now the row trigger (jobs_release_dependants) only settles the edges (done) and
cancels what a failure dooms; a statement trigger (jobs_count_dependants), which
PostgreSQL fires after every row trigger of the statement, counts the edges the
statement settled (done, not yet counted) per child and updates each child once,
making due and waking the one whose count reaches 0. A second statement ending
another parent of the same child at once waits for the child's row and counts down
from the value the first left, as before: exactly one of them brings it to 0.

The statement trigger runs after each UPDATE that sets jobs.state (claims,
outcomes, sweeps); one that settled no edge stops at a flag of the transaction the
row trigger sets (hybrid_jobs.edges_settled), and the count reads only the index of
edges settled and not counted, empty outside the statement that fills it.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"

_SETTLE = """
CREATE OR REPLACE FUNCTION jobs_release_dependants() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.state <> 'SUCCEEDED' THEN
    -- Every waiting job reachable through 'cancel' edges not settled yet. A child
    -- still waiting for this parent has parents_pending > 0; UNION stops at jobs
    -- seen already (the graph is acyclic anyway: a job names only older ones).
    WITH RECURSIVE doomed(job_id) AS (
      SELECT d.child_id
      FROM job_dependencies AS d JOIN jobs AS c ON c.job_id = d.child_id
      WHERE d.parent_id = NEW.job_id AND NOT d.done
        AND c.on_parent_failure = 'cancel' AND c.state = 'QUEUED' AND c.parents_pending > 0
      UNION
      SELECT d.child_id
      FROM doomed AS x
      JOIN job_dependencies AS d ON d.parent_id = x.job_id AND NOT d.done
      JOIN jobs AS c ON c.job_id = d.child_id
      WHERE c.on_parent_failure = 'cancel' AND c.state = 'QUEUED' AND c.parents_pending > 0
    )
    UPDATE jobs AS c
    SET state = 'CANCELLED',
        finished_at = statement_timestamp(),
        last_error_code = 'PARENT_FAILED',
        last_error_message = 'job ' || NEW.job_id || ' it depends on ended ' || NEW.state,
        delay_reason = NULL,
        delay_since = NULL,
        updated_at = now()
    WHERE c.job_id IN (SELECT job_id FROM doomed) AND c.state = 'QUEUED';
  END IF;
  -- Settled here, counted once for the whole statement by jobs_count_dependants,
  -- which the flag (this transaction's only) tells that there is work.
  UPDATE job_dependencies AS d
  SET done = true
  FROM jobs AS c
  WHERE d.parent_id = NEW.job_id AND NOT d.done AND c.job_id = d.child_id
    AND (NEW.state = 'SUCCEEDED' OR c.on_parent_failure = 'run');
  IF FOUND THEN
    PERFORM set_config('hybrid_jobs.edges_settled', 'yes', true);
  END IF;
  RETURN NULL;
END $$
"""

_COUNT = """
CREATE FUNCTION jobs_count_dependants() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  -- Most statements that set a state (every claim) settle no edge: they stop
  -- here, without reading a table.
  IF current_setting('hybrid_jobs.edges_settled', true) IS DISTINCT FROM 'yes' THEN
    RETURN NULL;
  END IF;
  PERFORM set_config('hybrid_jobs.edges_settled', '', true);
  WITH settled AS (
    UPDATE job_dependencies AS d
    SET counted = true
    WHERE d.done AND NOT d.counted
    RETURNING d.child_id
  ), per_child AS (
    SELECT child_id, count(*)::int AS n FROM settled GROUP BY child_id
  ), locked AS MATERIALIZED (
    -- in id order, as every statement here takes them: two that share children
    -- never wait for each other in a circle
    SELECT c.job_id, p.n
    FROM jobs AS c JOIN per_child AS p ON p.child_id = c.job_id
    ORDER BY c.job_id
    FOR NO KEY UPDATE OF c
  ), counted AS (
    -- Under READ COMMITTED a second statement ending another parent at the same
    -- instant waits for this row's lock and then counts down from the value this
    -- one left: exactly one of them sees its own n here, and it alone makes the
    -- child due.
    UPDATE jobs AS c
    SET parents_pending = c.parents_pending - l.n,
        run_after = CASE WHEN c.parents_pending = l.n AND c.state = 'QUEUED'
                         THEN now() ELSE c.run_after END,
        delay_reason = CASE WHEN c.parents_pending = l.n AND c.state = 'QUEUED'
                            THEN NULL ELSE c.delay_reason END,
        delay_since = CASE WHEN c.parents_pending = l.n AND c.state = 'QUEUED'
                           THEN NULL ELSE c.delay_since END,
        updated_at = now()
    FROM locked AS l
    WHERE c.job_id = l.job_id
    RETURNING c.job_id, c.queue, c.tenant, c.priority, c.run_after, c.parents_pending, c.state
  )
  INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
  SELECT job_id, queue, COALESCE(tenant, ''), priority, run_after FROM counted
  WHERE parents_pending = 0 AND state = 'QUEUED';
  RETURN NULL;
END $$
"""

# 0015's function, to go back to.
_PER_ROW = """
CREATE OR REPLACE FUNCTION jobs_release_dependants() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.state <> 'SUCCEEDED' THEN
    WITH RECURSIVE doomed(job_id) AS (
      SELECT d.child_id
      FROM job_dependencies AS d JOIN jobs AS c ON c.job_id = d.child_id
      WHERE d.parent_id = NEW.job_id AND NOT d.done
        AND c.on_parent_failure = 'cancel' AND c.state = 'QUEUED' AND c.parents_pending > 0
      UNION
      SELECT d.child_id
      FROM doomed AS x
      JOIN job_dependencies AS d ON d.parent_id = x.job_id AND NOT d.done
      JOIN jobs AS c ON c.job_id = d.child_id
      WHERE c.on_parent_failure = 'cancel' AND c.state = 'QUEUED' AND c.parents_pending > 0
    )
    UPDATE jobs AS c
    SET state = 'CANCELLED',
        finished_at = statement_timestamp(),
        last_error_code = 'PARENT_FAILED',
        last_error_message = 'job ' || NEW.job_id || ' it depends on ended ' || NEW.state,
        delay_reason = NULL,
        delay_since = NULL,
        updated_at = now()
    WHERE c.job_id IN (SELECT job_id FROM doomed) AND c.state = 'QUEUED';
  END IF;
  WITH settled AS (
    UPDATE job_dependencies AS d
    SET done = true
    FROM jobs AS c
    WHERE d.parent_id = NEW.job_id AND NOT d.done AND c.job_id = d.child_id
      AND (NEW.state = 'SUCCEEDED' OR c.on_parent_failure = 'run')
    RETURNING d.child_id
  ), counted AS (
    UPDATE jobs AS c
    SET parents_pending = c.parents_pending - 1,
        run_after = CASE WHEN c.parents_pending = 1 AND c.state = 'QUEUED'
                         THEN now() ELSE c.run_after END,
        delay_reason = CASE WHEN c.parents_pending = 1 AND c.state = 'QUEUED'
                            THEN NULL ELSE c.delay_reason END,
        delay_since = CASE WHEN c.parents_pending = 1 AND c.state = 'QUEUED'
                           THEN NULL ELSE c.delay_since END,
        updated_at = now()
    FROM settled AS s
    WHERE c.job_id = s.child_id
    RETURNING c.job_id, c.queue, c.tenant, c.priority, c.run_after, c.parents_pending, c.state
  )
  INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
  SELECT job_id, queue, COALESCE(tenant, ''), priority, run_after FROM counted
  WHERE parents_pending = 0 AND state = 'QUEUED';
  RETURN NULL;
END $$
"""


def upgrade() -> None:
    # Edges settled before this revision were counted by their own row trigger.
    op.add_column(
        "job_dependencies",
        sa.Column("counted", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.execute("UPDATE job_dependencies SET counted = true WHERE done")
    op.create_index(
        "job_dependencies_uncounted_idx",
        "job_dependencies",
        ["child_id"],
        postgresql_where=sa.text("done AND NOT counted"),
    )
    op.execute(_SETTLE)
    op.execute(_COUNT)
    op.execute(
        "CREATE TRIGGER jobs_count_dependants AFTER UPDATE OF state ON jobs "
        "FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_dependants()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_count_dependants ON jobs")
    op.execute("DROP FUNCTION jobs_count_dependants()")
    op.execute(_PER_ROW)
    op.drop_index("job_dependencies_uncounted_idx", table_name="job_dependencies")
    op.drop_column("job_dependencies", "counted")
