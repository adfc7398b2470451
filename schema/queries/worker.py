"""Consumers and relays announcing themselves, and being forgotten; the lock every
periodic chore takes."""

from __future__ import annotations

from typing import Final

from hybrid_jobs import defaults
from hybrid_jobs.schema.locks import INSTANCE_SPACE
from hybrid_jobs.schema.queries.fragments import LEASE_LAPSED, LIVE_WORKER

# A consumer announces itself at start and at every heartbeat: which queues, job
# types and dedicated tenants it serves, with what capacity, and its counters.
# Upsert, so a worker whose row expired while it was frozen comes back. Returns
# whether it comes back: its row was gone (expired), silent past the TTL, or a
# lease of it lapsed since it was last seen. Either way it was not live
# (LIVE_WORKER) meanwhile, and the jobs that only it could run waited for a consumer
# to come (JOB_WAKE_PARKED).
WORKER_SEEN: Final = f"""
WITH before AS (
    SELECT {LEASE_LAPSED}
           OR w.last_seen_at <= now() - make_interval(secs => %(worker_ttl)s) AS lapsed
    FROM workers AS w WHERE w.worker_id = %(worker)s
)
INSERT INTO workers AS w (worker_id, host, pid, queues, job_types, concurrency, prefetch,
                          stopping, counts, tenants)
VALUES (%(worker)s, %(host)s, %(pid)s, %(queues)s, %(job_types)s, %(concurrency)s,
        %(prefetch)s, %(stopping)s, %(counts)s::jsonb, %(tenants)s::text[])
ON CONFLICT (worker_id) DO UPDATE
SET last_seen_at = now(), stopping = EXCLUDED.stopping, counts = EXCLUDED.counts,
    job_types = EXCLUDED.job_types, prefetch = EXCLUDED.prefetch
RETURNING COALESCE((SELECT lapsed FROM before), true) AS back
"""

WORKER_GONE: Final = "DELETE FROM workers WHERE worker_id = %(worker)s"

# Consumers that stopped heartbeating (killed, frozen, partitioned) are forgotten.
WORKER_EXPIRE: Final = """
DELETE FROM workers
WHERE last_seen_at < now() - make_interval(secs => %(worker_ttl)s)
RETURNING worker_id
"""

# The most job ids the relay should pack into one message to a queue: half the
# smallest prefetch (in ids) among the queue's live consumers, as their rows say it
# now (it grows while their jobs are short: consumers/prefetch.py), since each
# consumer takes two messages at a time (consumers/settings.py); NULL when none is
# live. So a burst spreads over every consumer, rather than piling up at the first
# ones.
WORKER_PACK_LIMIT: Final = f"""
SELECT min(GREATEST(1, w.prefetch / 2))::int
FROM workers AS w
WHERE %(queue)s = ANY(w.queues) AND {LIVE_WORKER}
"""

# ------------------------------------------------------------------------- relays

# A relay announces itself at start and at every heartbeat: whether it is connected
# to RabbitMQ, how many wake-ups it has published, and the queues it cannot publish
# to right now, with why. Upsert, so a relay whose row expired while it was frozen
# comes back.
RELAY_SEEN: Final = """
INSERT INTO relays AS r (relay_id, host, pid, broker_connected, published, failing_queues)
VALUES (%(relay)s, %(host)s, %(pid)s, %(connected)s, %(published)s, %(failing)s)
ON CONFLICT (relay_id) DO UPDATE
SET last_seen_at = now(), broker_connected = EXCLUDED.broker_connected,
    published = EXCLUDED.published, failing_queues = EXCLUDED.failing_queues
"""

RELAY_GONE: Final = "DELETE FROM relays WHERE relay_id = %(relay)s"

# Relays that stopped heartbeating (killed, frozen) are forgotten, like consumers.
RELAY_EXPIRE: Final = """
DELETE FROM relays
WHERE last_seen_at < now() - make_interval(secs => %(relay_ttl)s)
RETURNING relay_id
"""

RELAY_LIVE_SECONDS: Final = defaults.RELAY_LIVE_SECONDS

# How many relays are live, and how many of those are connected to RabbitMQ.
RELAY_LIVE_LIST: Final = f"""
SELECT count(*)::int, (count(*) FILTER (WHERE broker_connected))::int
FROM relays
WHERE last_seen_at > now() - make_interval(secs => {RELAY_LIVE_SECONDS})
"""

# The queues live relays cannot publish to right now (RabbitMQ refuses them, their
# decision times out...), one row per queue and reason: how many relays say so,
# since when (the earliest), failures counted, and one relay's detail.
RELAY_FAILING_QUEUES: Final = f"""
SELECT f.key AS queue, f.value->>'reason' AS reason, count(*)::int AS relays,
       min((f.value->>'since')::timestamptz) AS since,
       sum((f.value->>'failures')::bigint)::bigint AS failures,
       min(f.value->>'detail') AS detail
FROM relays AS r CROSS JOIN LATERAL jsonb_each(r.failing_queues) AS f
WHERE r.last_seen_at > now() - make_interval(secs => {RELAY_LIVE_SECONDS})
GROUP BY f.key, f.value->>'reason'
ORDER BY f.key, f.value->>'reason'
"""

# Each periodic chore (sweeping, re-waking, reconciling...) runs in one relay at a
# time: the others find its transaction-scoped advisory lock taken and skip the round.
MAINTENANCE_TRY_LOCK: Final = f"SELECT pg_try_advisory_xact_lock({INSTANCE_SPACE}, %(key)s::int4)"
