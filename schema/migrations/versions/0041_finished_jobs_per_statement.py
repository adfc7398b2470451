"""The end of a job notifies its waiters and owes its webhook call once per statement

Two row triggers ran for every job that reached a final state: jobs_finished_notify
(the NOTIFY ``outbox.wait_for`` listens for) and jobs_webhook (the call owed to the
job's or its type's webhook, looked up in job_type_webhooks even where no type has
one). A consumer ends its jobs in batches, so a batch of 50 paid 100 PL/pgSQL calls,
each with the instance's search_path set and reset, and 50 lookups.

One statement trigger, jobs_finished, now does both for every job the statement
moved into a final state, read from the statement's transition tables: a NOTIFY per
job, with the same channel and payload as before (a waiter of an older version hears
the same thing), and one INSERT of the calls owed. Every statement that can end a
job still runs it (outcome, sweep, give-back, cancel, rejection, expiry, a parent's
failure), as a trigger none of them can forget.

A trigger with transition tables cannot name columns (``UPDATE OF state``), so every
UPDATE of jobs copies its rows into them and runs the function once, a claim and a
heartbeat too: there it finds no job that ended, in one join of the statement's
rows. Measured by EXPLAIN ANALYZE's trigger times (a scratch database, 40 rounds,
medians; two runs alternated with the two row triggers): the outcome of 50 jobs
spent 1.09-1.18 ms in the row triggers and 0.34-0.35 ms in this one; a claim of 50
pays 0.12 ms for it, a heartbeat of 50 0.14-0.15 ms and a one-row update (progress,
a cancel) 0.11 ms, where the row triggers cost them nothing. A batch's claim and
outcome together spend 0.47 ms in it, where they spent 1.1 ms.

Locks: DROP TRIGGER takes ACCESS EXCLUSIVE on jobs until the migration commits.
Nothing is read or rewritten, so it is held for a moment, but it waits for (and
meanwhile holds up every statement behind) any transaction using jobs.
"""

from alembic import op

revision: str = "0041"
down_revision: str | None = "0040"

_FINAL = "('CANCELLED', 'FAILED', 'SUCCEEDED')"
_MAX_MESSAGE = 2000


def _call(row: str, url: str) -> str:
    """The endpoint and the body of the call owed for the job ``row`` at ``url``: the
    same in the new function and in the old one the downgrade restores."""
    return f"""lower(substring({url} FROM '^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*')),
         jsonb_build_object(
           'event', 'job.finished',
           'job_id', {row}.job_id,
           'job_type', {row}.job_type,
           'queue', {row}.queue,
           'state', {row}.state,
           'attempts', {row}.attempt_count,
           'finished_at', coalesce({row}.finished_at, now()),
           'error', CASE WHEN {row}.state = 'SUCCEEDED'
                          OR ({row}.last_error_code IS NULL AND {row}.last_error_message IS NULL)
                         THEN NULL
                         ELSE jsonb_build_object(
                           'code', {row}.last_error_code,
                           'message', left({row}.last_error_message, {_MAX_MESSAGE}))
                    END)"""


_FUNCTION = f"""
CREATE FUNCTION jobs_finished() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  -- one join of the statement's rows. Each job that ended is notified as its row is
  -- made: the CTE is materialized and the INSERT reads all of it (no LIMIT, no
  -- early stop), so every row, and its NOTIFY, is made exactly once.
  WITH ended AS MATERIALIZED (
    SELECT n.job_id, n.job_type, n.queue, n.state, n.attempt_count, n.finished_at,
           n.last_error_code, n.last_error_message,
           -- the job's own webhook, else its type's
           COALESCE(n.webhook_url, w.url) AS url,
           pg_notify(left(TG_TABLE_SCHEMA, 48) || '.job_finished', n.job_id::text)
    FROM new_rows AS n
    JOIN old_rows AS o USING (job_id)
    LEFT JOIN job_type_webhooks AS w ON w.job_type = n.job_type
    WHERE n.state IN {_FINAL} AND o.state IS DISTINCT FROM n.state
  )
  INSERT INTO webhook_deliveries (job_id, url, endpoint, body)
  SELECT e.job_id, e.url, {_call("e", "e.url")}
  FROM ended AS e
  WHERE e.url IS NOT NULL;
  RETURN NULL;
END $$
"""

# As migrations 0012, 0030 and 0031 left them, for the downgrade.
_OLD_NOTIFY = """
CREATE FUNCTION jobs_finished_notify() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  PERFORM pg_notify(left(TG_TABLE_SCHEMA, 48) || '.job_finished', NEW.job_id::text);
  RETURN NULL;
END $$
"""
_OLD_WEBHOOK = f"""
CREATE FUNCTION jobs_webhook() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  target text := NEW.webhook_url;
BEGIN
  IF target IS NULL THEN
    SELECT w.url INTO target FROM job_type_webhooks AS w WHERE w.job_type = NEW.job_type;
    IF target IS NULL THEN
      RETURN NULL;
    END IF;
  END IF;
  INSERT INTO webhook_deliveries (job_id, url, endpoint, body)
  VALUES (NEW.job_id, target, {_call("NEW", "target")});
  RETURN NULL;
END $$
"""
_OLD_WHEN = f"WHEN (NEW.state IN {_FINAL} AND OLD.state IS DISTINCT FROM NEW.state)"


def upgrade() -> None:
    op.execute("DROP TRIGGER jobs_finished_notify ON jobs")
    op.execute("DROP TRIGGER jobs_webhook ON jobs")
    op.execute("DROP FUNCTION jobs_finished_notify()")
    op.execute("DROP FUNCTION jobs_webhook()")
    op.execute(_FUNCTION)
    op.execute(
        "CREATE TRIGGER jobs_finished AFTER UPDATE ON jobs "
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION jobs_finished()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_finished ON jobs")
    op.execute("DROP FUNCTION jobs_finished()")
    op.execute(_OLD_NOTIFY)
    op.execute(_OLD_WEBHOOK)
    op.execute(
        f"CREATE TRIGGER jobs_finished_notify AFTER UPDATE OF state ON jobs FOR EACH ROW "
        f"{_OLD_WHEN} EXECUTE FUNCTION jobs_finished_notify()"
    )
    op.execute(
        f"CREATE TRIGGER jobs_webhook AFTER UPDATE OF state ON jobs FOR EACH ROW "
        f"{_OLD_WHEN} EXECUTE FUNCTION jobs_webhook()"
    )
