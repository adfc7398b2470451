"""Rate limits (jobs.rate_limit, else the handler's): a token of the limit's bucket
(rate_buckets) per start, across every consumer. The claim locks the buckets first
and counts their tokens; only the jobs every other gate then admits take theirs,
last: a job turned down spends none. Nothing to release at the end of a lease: a
token is spent once its job starts."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.states import DelayReason

USES: Final = "COALESCE(j.rate_limit, t.rate_limit) IS NOT NULL"

REASONS: Final = (DelayReason.RATE_LIMITED,)

# The bucket a job takes from: its own limit's name, else its handler's.
LOCKED_COLUMN: Final = "COALESCE(j.rate_limit, t.rate_limit) AS rate_name"
LOCKED_COLUMN_ABSENT: Final = "NULL::text AS rate_name"


def governing(name: str) -> str:
    """SQL: the limit that governs the rate-limit name ``name`` (an SQL expression),
    as one row of rate, per_seconds and burst (none: the name is not limited): the
    name's own, else the longest 'prefix:*' that covers it. The limits that can cover
    a name are the name itself and, for each ':' in it, the name up to there with
    '*': looked up by key, a name costs a few index probes however many limits an
    operator sets."""
    return f"""SELECT x.rate, x.per_seconds, x.burst
        FROM rate_limits AS x
        WHERE x.name = ANY (array_prepend({name}, ARRAY(
            SELECT left({name}, p) || '*'
            FROM generate_series(1, length({name})) AS p
            WHERE substr({name}, p, 1) = ':')))
        ORDER BY x.name = {name} DESC, length(x.name) DESC
        LIMIT 1"""


CLAIM_ADMIT: Final = f"""rate_wanted AS (
    -- 1d. each runnable job under a rate limit: its bucket (its own name) and the limit
    -- that governs it, the name's own or else the longest 'prefix:*' that covers it,
    -- looked up by key, and its turn for a token.
    SELECT r.job_id, r.rate_name AS bucket, m.rate / m.per_seconds AS per_second, m.burst,
           row_number() OVER (PARTITION BY r.rate_name ORDER BY r.priority DESC, r.job_id)
               AS token_rank
    FROM runnable AS r
    CROSS JOIN LATERAL ({governing("r.rate_name")}) AS m
    WHERE r.rate_name IS NOT NULL
      -- one waiting for its key takes no token
      AND r.job_id NOT IN (SELECT job_id FROM key_waiting)
), rate_level AS MATERIALIZED (
    -- 1e. their buckets, locked in bucket order before anything else is (as a claim
    -- always takes them), at their latest version (committed or not yet seen by this
    -- snapshot): the level refilled at per_second since refilled_at, up to the burst,
    -- as of now(), and the whole tokens it holds. Nothing is taken here: a token goes
    -- only to a job every gate admits (rate_spent). A bucket this snapshot does not
    -- show has no row here: its jobs wait for the next claim, which finds it
    -- (rate_created makes it, full).
    SELECT b.name, w.per_second, w.burst, e.elapsed, a.level,
           floor(GREATEST(0, a.level))::int AS whole
    FROM rate_buckets AS b
    JOIN (SELECT bucket, max(per_second) AS per_second, max(burst) AS burst
          FROM rate_wanted GROUP BY bucket) AS w ON w.bucket = b.name
    CROSS JOIN LATERAL (
        SELECT EXTRACT(EPOCH FROM now() - b.refilled_at)::float8 AS elapsed) AS e
    CROSS JOIN LATERAL (
        SELECT LEAST(w.burst, b.tokens + w.per_second * e.elapsed) AS level) AS a
    ORDER BY b.name
    FOR UPDATE OF b
), rate_refused AS (
    -- 1f. the jobs past their bucket's whole tokens, in their turn: no token for them
    -- in this claim (a job ahead that another gate turns down leaves its token in the
    -- bucket, untaken). One whose bucket is unseen is not turned down, only not
    -- taken: it comes back 'locked', for the worker to try again in a moment.
    SELECT w.job_id, w.bucket, w.per_second,
           w.token_rank - COALESCE(l.whole, 0) AS short_by, l.name IS NULL AS unseen
    FROM rate_wanted AS w LEFT JOIN rate_level AS l ON l.name = w.bucket
    WHERE w.token_rank > COALESCE(l.whole, 0)
), rated AS (
    -- 1g. the runnable jobs with a token to have, or under no limit
    SELECT r.* FROM runnable AS r WHERE r.job_id NOT IN (SELECT job_id FROM rate_refused)
)"""

CLAIM_ADMIT_ABSENT: Final = """rate_refused AS (
    SELECT NULL::uuid AS job_id, NULL::text AS bucket, NULL::float8 AS per_second,
           NULL::int AS short_by, NULL::boolean AS unseen
    WHERE false
), rated AS (
    SELECT r.* FROM runnable AS r
)"""

CLAIM_TAKE: Final = """rate_spent AS MATERIALIZED (
    -- 2d. the tokens of the jobs every gate admitted, taken from the buckets locked
    -- in 1e: tokens spent are starts. A claim whose now() is earlier than the
    -- bucket's time (a claim that began later wrote it first) finds the level less
    -- the refill between the two and leaves the bucket's time as it was: the
    -- bucket's level at its time is the least slack of every window ending then, so
    -- the starts stay within burst + rate x t in every window of the claims' own
    -- clock. taken is what this claim took.
    SELECT l.name, l.per_second, l.level - COALESCE(n.n, 0) AS left_tokens,
           COALESCE(n.n, 0) AS n, l.elapsed
    FROM rate_level AS l
    LEFT JOIN (SELECT w.bucket, count(*)::int AS n
               FROM rate_wanted AS w JOIN resource_admitted AS a USING (job_id)
               GROUP BY w.bucket) AS n ON n.bucket = l.name
), rate_taken AS (
    UPDATE rate_buckets AS b
    SET tokens = s.left_tokens + s.per_second * GREATEST(0, -s.elapsed), taken = s.n,
        refilled_at = GREATEST(b.refilled_at, now())
    FROM rate_spent AS s
    WHERE b.name = s.name AND s.n > 0
), rate_created AS (
    -- 2e. a bucket first used (a 'prefix:*''s name; RATE_LIMIT_SET makes an exact
    -- name's): made full, for the next claim, after every other gate's lock, as the
    -- last thing this claim takes
    INSERT INTO rate_buckets (name, tokens, taken, refilled_at)
    SELECT r.bucket, max(w.burst), 0, now()
    FROM rate_refused AS r JOIN rate_wanted AS w USING (job_id)
    WHERE r.unseen
    GROUP BY r.bucket
    ORDER BY r.bucket
    ON CONFLICT (name) DO NOTHING
)"""

CLAIM_TAKE_ABSENT: Final = """rate_spent AS (
    SELECT NULL::text AS name, NULL::float8 AS per_second, NULL::float8 AS left_tokens,
           NULL::int AS n, NULL::float8 AS elapsed
    WHERE false
)"""

REFUSED: Final = f"""WHEN l.job_id IN (SELECT job_id FROM rate_refused)
                THEN '{DelayReason.RATE_LIMITED}'"""
