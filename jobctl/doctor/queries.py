"""Every statement ``jobctl doctor`` runs: each reads, none writes.

What the daemons also read is taken from where they read it: the schema's revision
(``schema.revisions``), the relays' liveness and failing queues
(``schema.queries``), what a live consumer is (``LIVE_WORKER``, as explain and the
claim judge it). The backlog read costs what the backlog costs (jobs_claimable_idx,
a partial index of the waiting jobs), never the history of finished jobs.
"""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.queries import (
    LEASE_LAPSED,
    LIVE_WORKER,
    RELAY_FAILING_QUEUES,
    RELAY_LIVE_SECONDS,
)
from hybrid_jobs.schema.tables import CLAIMABLE_SQL

# The server's settings as this session has them: the configuration file, then the
# database's and the role's ALTER ... SET, then the client's startup options
# (PGOPTIONS), as a producer's or a consumer's session gets them.
DOCTOR_SETTINGS: Final = """
SELECT name, setting, source FROM pg_settings WHERE name = ANY(%(names)s::text[])
"""

# Tables whose own storage options turn autovacuum off.
DOCTOR_TABLE_OPTIONS: Final = """
SELECT t.name, o.value
FROM unnest(%(tables)s::text[]) AS t(name)
JOIN pg_class AS c ON c.oid = to_regclass(t.name)
CROSS JOIN LATERAL pg_options_to_table(c.reloptions) AS o(option, value)
WHERE o.option = 'autovacuum_enabled'
ORDER BY t.name
"""

# Client connections open now, for the figures next to max_connections.
DOCTOR_CONNECTIONS_IN_USE: Final = """
SELECT count(*)::int FROM pg_stat_activity WHERE backend_type = 'client backend'
"""

# The database's clock as the statement runs (not the transaction's start).
DOCTOR_CLOCK: Final = "SELECT clock_timestamp()"

# The named CHECK constraints of these tables (alembic's comparison leaves CHECK
# constraints out).
DOCTOR_CHECK_CONSTRAINTS: Final = """
SELECT c.relname, k.conname
FROM pg_constraint AS k
JOIN pg_class AS c ON c.oid = k.conrelid
WHERE k.contype = 'c' AND c.relname = ANY(%(tables)s::text[])
  AND c.relnamespace = current_schema()::regnamespace
"""

# Every consumer with a row (the relay forgets one silent past its --worker-ttl):
# whether it is live as the claim and explain judge it, and how long since it was
# heard from, by the database's clock (the row holds no clock of the process).
DOCTOR_WORKERS: Final = f"""
SELECT w.worker_id, w.host, w.pid, w.queues, w.concurrency, w.stopping,
       {LIVE_WORKER} AS live,
       EXTRACT(EPOCH FROM now() - w.last_seen_at)::float8 AS silent_s,
       {LEASE_LAPSED} AS lapsed
FROM workers AS w
ORDER BY w.host, w.pid, w.worker_id
"""

# Every relay with a row: live when seen within RELAY_LIVE_SECONDS, as jobctl
# stats and the metrics count them (RELAY_LIVE_LIST).
DOCTOR_RELAYS: Final = f"""
SELECT r.relay_id, r.host, r.pid, r.broker_connected,
       r.last_seen_at > now() - make_interval(secs => {RELAY_LIVE_SECONDS}) AS live,
       EXTRACT(EPOCH FROM now() - r.last_seen_at)::float8 AS silent_s
FROM relays AS r
ORDER BY r.host, r.pid, r.relay_id
"""

DOCTOR_PUBLISH_FAILING: Final = RELAY_FAILING_QUEUES

# Due waiting jobs per queue and type, with how many live consumers serve the
# queue and how many of those have the type's handler: outbox.explain's
# NO_CONSUMER and NO_HANDLER, for every kind at once (JOB_EXPLAIN counts the same
# workers for one job). Jobs held for approval or their parents are not due.
DOCTOR_WAITING_KINDS: Final = f"""
SELECT k.queue, k.job_type, k.waiting, k.oldest_s, COALESCE(q.paused, false),
       (SELECT count(*) FROM workers AS w
        WHERE k.queue = ANY(w.queues) AND {LIVE_WORKER})::int AS workers_on_queue,
       (SELECT count(*) FROM workers AS w
        WHERE k.queue = ANY(w.queues) AND k.job_type = ANY(w.job_types)
          AND {LIVE_WORKER})::int AS handlers_on_queue
FROM (SELECT queue, job_type, count(*)::int AS waiting,
             EXTRACT(EPOCH FROM now() - min(run_after))::float8 AS oldest_s
      FROM jobs
      WHERE state IN ({CLAIMABLE_SQL}) AND run_after <= now()
      GROUP BY queue, job_type) AS k
LEFT JOIN queues AS q ON q.queue = k.queue
ORDER BY k.queue, k.job_type
"""
