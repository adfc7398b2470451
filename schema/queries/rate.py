"""Rate limits: the operator's limits and the token buckets the claim takes from
(JOB_CLAIM_MANY: steps 1d to 1g check them, 2d and 2e take), and a tenant's enqueue bucket."""

from __future__ import annotations

from typing import Final

# Creates or changes a limit, in the caller's transaction. Its buckets keep their
# tokens (capped by the new burst at the next claim). An exact name's bucket is made
# here, full: a claim takes tokens only from a bucket its snapshot shows, and one
# that finds none makes it and turns its jobs down once (a 'prefix:*''s names, each
# at its first use).
RATE_LIMIT_SET: Final = """
WITH set AS (
    INSERT INTO rate_limits AS r (name, rate, per_seconds, burst)
    VALUES (%(name)s, %(rate)s, %(per_seconds)s, %(burst)s)
    ON CONFLICT (name) DO UPDATE
    SET rate = EXCLUDED.rate, per_seconds = EXCLUDED.per_seconds, burst = EXCLUDED.burst,
        updated_at = now()
)
INSERT INTO rate_buckets (name, tokens, taken, refilled_at)
SELECT %(name)s, %(burst)s, 0, now()
WHERE right(%(name)s, 2) <> ':*'
ON CONFLICT (name) DO NOTHING
"""

# Removes a limit and the buckets it governed (an exact name's own; a 'prefix:*''s
# of every name with the prefix that no exact limit has), so one set again starts
# full. Returns whether there was one.
RATE_LIMIT_REMOVE: Final = """
WITH gone AS (
    DELETE FROM rate_limits WHERE name = %(name)s RETURNING name
), emptied AS (
    DELETE FROM rate_buckets AS b USING gone AS g
    WHERE b.name = g.name
       OR (right(g.name, 2) = ':*' AND starts_with(b.name, left(g.name, -1))
           AND NOT EXISTS (SELECT 1 FROM rate_limits AS x WHERE x.name = b.name))
)
SELECT count(*) > 0 FROM gone
"""

# Every limit, with its bucket as of now (an exact name's: the tokens it has, after
# the refill since the last claim took from it) and, for a 'prefix:*', how many
# names have a bucket under it. The buckets under a prefix are counted up to 10000.
RATE_LIMITS: Final = """
SELECT r.name, r.rate, r.per_seconds, r.burst,
       CASE WHEN b.name IS NULL THEN r.burst
            ELSE LEAST(r.burst, b.tokens + r.rate / r.per_seconds
                       * GREATEST(0, EXTRACT(EPOCH FROM now() - b.refilled_at)::float8))
       END AS tokens,
       b.refilled_at,
       CASE WHEN right(r.name, 2) = ':*'
            THEN (SELECT count(*) FROM (SELECT 1 FROM rate_buckets AS x
                                        WHERE starts_with(x.name, left(r.name, -1))
                                        LIMIT 10000) AS n)::int
            ELSE (b.name IS NOT NULL)::int
       END AS buckets
FROM rate_limits AS r
LEFT JOIN rate_buckets AS b ON b.name = r.name
ORDER BY r.name
"""
