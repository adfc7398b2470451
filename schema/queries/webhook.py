"""Completion webhooks: the URLs jobs and job types name, and the calls owed to them.

Trigger ``jobs_finished`` (migration 0041) writes a ``webhook_deliveries`` row in
the transaction that ends a job that has a URL (its own, else its type's). A relay
claims due rows with a lease (:data:`WEBHOOK_DELIVERY_CLAIM`), calls each URL with
no transaction open, and records the outcome through the fence ``lease_owner`` and
``attempts`` (:data:`WEBHOOK_DELIVERY_DELIVERED`, :data:`WEBHOOK_DELIVERY_FAILED`):
a relay whose lease ran out, and whose row another relay claimed since, changes
nothing.
"""

from __future__ import annotations

from typing import Final

# The jobs an enqueue just inserted with on_complete_url=: their URL, in the
# producer's transaction. Only a batch with such a job runs it; the column is in no
# index, so the update stays on the row's page.
JOB_WEBHOOK_SET_MANY: Final = """
UPDATE jobs AS j
SET webhook_url = w.url
FROM jsonb_to_recordset(%(webhooks)s::jsonb) AS w(job_id uuid, url text)
WHERE j.job_id = w.job_id
"""

# A consumer at start-up, for every handler it has: a type whose handler declares a
# webhook gets its row (created, or changed when the URL differs: updated_by is the
# consumer that last changed it); a type that declares none loses its row. The last
# consumer to start wins. Rows are locked in job-type order, so consumers starting
# together wait for each other, never deadlock. Returns the types whose row changed.
JOB_TYPE_WEBHOOK_RECORD_MANY: Final = """
WITH given AS (
    SELECT g.job_type, g.url
    FROM jsonb_to_recordset(%(webhooks)s::jsonb) AS g(job_type text, url text)
), dropping AS (
    SELECT w.job_type FROM job_type_webhooks AS w JOIN given AS g ON g.job_type = w.job_type
    WHERE g.url IS NULL
    ORDER BY w.job_type
    FOR UPDATE OF w
), dropped AS (
    DELETE FROM job_type_webhooks AS w USING dropping AS d
    WHERE w.job_type = d.job_type
    RETURNING w.job_type
), written AS (
    INSERT INTO job_type_webhooks AS w (job_type, url, updated_by)
    SELECT g.job_type, g.url, %(worker)s FROM given AS g
    WHERE g.url IS NOT NULL
    ORDER BY g.job_type
    ON CONFLICT (job_type) DO UPDATE
    SET url = excluded.url, updated_by = excluded.updated_by, updated_at = now()
    WHERE w.url IS DISTINCT FROM excluded.url
    RETURNING w.job_type
)
SELECT job_type FROM dropped UNION ALL SELECT job_type FROM written
"""

# The relay's claim of due calls: the oldest due first, at most ``per_endpoint`` of
# one endpoint counting the relay's calls to it in flight (``in_flight``, a JSON
# object of endpoint: count), so one slow endpoint cannot take every slot; none of
# an endpoint the relay is backing off or calls at its limit (``resting``), which
# the look at the oldest ``scan`` due calls leaves out before it chooses. The lease is
# next_attempt_at moved past the call's timeout: a relay killed mid-call leaves the
# row due again then. attempts counts the claim (the fence of its outcome), so a
# call whose relay died counts too, and a delivery cannot be retried for ever.
WEBHOOK_DELIVERY_CLAIM: Final = """
WITH due AS (
    SELECT d.delivery_id, d.endpoint, d.next_attempt_at,
           row_number() OVER (PARTITION BY d.endpoint
                              ORDER BY d.next_attempt_at, d.delivery_id) AS n
    FROM (
        SELECT delivery_id, endpoint, next_attempt_at
        FROM webhook_deliveries
        WHERE state = 'PENDING' AND next_attempt_at <= now()
          AND attempts < %(max_attempts)s
          AND endpoint <> ALL (%(resting)s::text[])
        ORDER BY next_attempt_at
        LIMIT %(scan)s
    ) AS d
), picked AS (
    SELECT w.delivery_id
    FROM webhook_deliveries AS w
    JOIN due ON due.delivery_id = w.delivery_id
    LEFT JOIN jsonb_each_text(%(in_flight)s::jsonb) AS f(endpoint, calls)
           ON f.endpoint = due.endpoint
    WHERE due.n + coalesce(f.calls::int, 0) <= %(per_endpoint)s
      AND w.state = 'PENDING' AND w.next_attempt_at <= now()
    ORDER BY due.next_attempt_at, w.delivery_id
    LIMIT %(limit)s
    FOR UPDATE OF w SKIP LOCKED
)
UPDATE webhook_deliveries AS w
SET attempts = w.attempts + 1,
    lease_owner = %(relay)s,
    next_attempt_at = now() + make_interval(secs => %(lease_seconds)s),
    updated_at = now()
FROM picked
WHERE w.delivery_id = picked.delivery_id
  AND w.state = 'PENDING' AND w.next_attempt_at <= now()
RETURNING w.delivery_id, w.job_id, w.url, w.endpoint, w.body::text, w.attempts
"""

# The fence of a claimed call: still pending, still this relay's, and not claimed
# again since (attempts).
_FENCE = """delivery_id = %(delivery_id)s AND state = 'PENDING'
  AND lease_owner = %(relay)s AND attempts = %(attempt)s"""

# The endpoint answered 2xx: delivered.
WEBHOOK_DELIVERY_DELIVERED: Final = f"""
UPDATE webhook_deliveries
SET state = 'DELIVERED', delivered_at = now(), last_status = %(status)s,
    last_error = NULL, lease_owner = NULL, updated_at = now()
WHERE {_FENCE}
RETURNING delivery_id
"""

# The call failed (a status outside 2xx, a timeout, a refused connection): due again
# after an exponential back-off with jitter, or GAVE_UP once its attempts are spent.
# Both keep what went wrong.
WEBHOOK_DELIVERY_FAILED: Final = f"""
UPDATE webhook_deliveries
SET state = CASE WHEN attempts >= %(max_attempts)s THEN 'GAVE_UP' ELSE 'PENDING' END,
    gave_up_at = CASE WHEN attempts >= %(max_attempts)s THEN now() END,
    next_attempt_at = now() + make_interval(secs =>
        LEAST(%(backoff_cap)s::float8,
              %(backoff_base)s::float8 * power(2, LEAST(attempts - 1, 30)))
        * (1 + %(backoff_jitter)s::float8 * (2 * random() - 1))),
    last_status = %(status)s, last_error = %(error)s,
    lease_owner = NULL, updated_at = now()
WHERE {_FENCE}
RETURNING state, next_attempt_at
"""

# Calls whose last attempt's lease ran out unrecorded (its relay was killed) and
# that have no attempt left: GAVE_UP, saying so.
WEBHOOK_DELIVERY_GIVE_UP_SPENT: Final = """
UPDATE webhook_deliveries AS w
SET state = 'GAVE_UP', gave_up_at = now(), lease_owner = NULL, updated_at = now(),
    last_error = 'the last attempt''s relay stopped before recording its outcome'
                 || coalesce(' (before: ' || w.last_error || ')', '')
WHERE w.delivery_id IN (
        SELECT delivery_id FROM webhook_deliveries
        WHERE state = 'PENDING' AND next_attempt_at <= now()
          AND attempts >= %(max_attempts)s
        ORDER BY next_attempt_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED)
  AND w.state = 'PENDING' AND w.next_attempt_at <= now()
RETURNING w.delivery_id, w.job_id, w.endpoint, w.attempts
"""

# Retention: delivered and given-up calls older than the relay's --keep-finished.
WEBHOOK_DELIVERY_RETENTION_DELETE: Final = """
WITH gone AS (
    DELETE FROM webhook_deliveries
    WHERE delivery_id IN (
        SELECT delivery_id FROM webhook_deliveries
        WHERE state <> 'PENDING'
          AND updated_at < now() - make_interval(secs => %(keep_seconds)s)
        ORDER BY updated_at
        LIMIT %(limit)s)
    RETURNING 1
)
SELECT count(*) FROM gone
"""

# An operator's look at the calls: the newest first, of one state and/or one job,
# or the one named. The endpoint only, not the URL: a URL's path or query often
# carries a token (a chat service's incoming hook), which no operator needs to see.
WEBHOOK_DELIVERY_LIST: Final = """
SELECT delivery_id, job_id, endpoint, state, attempts, next_attempt_at, last_status,
       last_error, delivered_at, gave_up_at, created_at
FROM webhook_deliveries
WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(job_id)s::uuid IS NULL OR job_id = %(job_id)s::uuid)
  AND (%(delivery_id)s::bigint IS NULL OR delivery_id = %(delivery_id)s::bigint)
ORDER BY delivery_id DESC
LIMIT %(limit)s
"""

# An operator's redelivery of a call that was given up: due now, with its attempts
# counted afresh. Returns nothing for a call that is not GAVE_UP.
WEBHOOK_DELIVERY_RETRY: Final = """
UPDATE webhook_deliveries
SET state = 'PENDING', attempts = 0, next_attempt_at = now(), gave_up_at = NULL,
    lease_owner = NULL, updated_at = now()
WHERE delivery_id = %(delivery_id)s AND state = 'GAVE_UP'
RETURNING delivery_id
"""

# Per state, how many calls there are and how many of their attempts failed (a
# delivered call's last attempt succeeded), for the metrics. Settled calls are kept
# only for the relay's --keep-finished, so this reads what retention keeps.
WEBHOOK_DELIVERY_COUNTS: Final = """
SELECT state, count(*),
       coalesce(sum(CASE WHEN state = 'DELIVERED' THEN attempts - 1 ELSE attempts END), 0)
FROM webhook_deliveries
GROUP BY state
"""

# How many calls wait to be made (at most 1,000 counted), for a relay that has no
# secret and so makes none: it says so only when a call is owed.
WEBHOOK_DELIVERY_OWED: Final = """
SELECT count(*) FROM (
    SELECT 1 FROM webhook_deliveries WHERE state = 'PENDING' LIMIT 1000
) AS owed
"""
