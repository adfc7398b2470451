"""The invariant checker: reads a database whose work has settled (after a test
run, a drill, a chaos soak) and says whether the promises held: nothing lost,
nothing completed twice, no write after a final state, history and rows agreeing,
tenants' slots neither leaked nor released twice. ``jobctl check`` runs it.

On a live system, ``lost`` counts the jobs still in flight. With require_success
every job must have SUCCEEDED: for a workload whose budget lets every job succeed,
so a bug that wrongly fails or cancels jobs cannot pass. The effect counts need the
chaos_effects table the chaos app writes (tests/chaos/app.py) and are null without it.
"""

from __future__ import annotations

from typing import Any

import psycopg

from hybrid_jobs.schema.gates.rate import governing
from hybrid_jobs.schema.states import TERMINAL
from hybrid_jobs.schema.tables import TERMINAL_SQL

# Only the module's own constant (the terminal states) is formatted into these
# statements; they take no input at all.
CHECKS = {
    # Not in a final state after the run settled: lost (or stuck). A job that waits
    # for a person's approval is held by design, not lost (awaiting_approval).
    "lost": f"""
        SELECT count(*) FROM jobs
        WHERE state NOT IN ({TERMINAL_SQL}) AND approval IS DISTINCT FROM 'REQUIRED'""",
    # More than one successful attempt for a job: it completed twice.
    "completed_twice": """
        SELECT count(*) FROM (
            SELECT job_id FROM job_attempts WHERE outcome = 'SUCCEEDED'
            GROUP BY job_id HAVING count(*) > 1) AS t""",
    # An attempt recorded after one that ended the job: a write after a terminal
    # state (attempts are ordered by their fencing token, which grows per claim). An
    # operator's replay in between (job_replays: it began after attempts_before)
    # makes the later attempts legitimate.
    "writes_after_terminal": """
        SELECT count(*) FROM job_attempts AS a
        JOIN job_attempts AS f
          ON f.job_id = a.job_id AND f.outcome IN ('SUCCEEDED', 'FAILED', 'CANCELLED')
         AND a.lease_generation > f.lease_generation
        WHERE NOT EXISTS (
            SELECT 1 FROM job_replays AS r
            WHERE r.job_id = a.job_id
              AND r.attempts_before >= f.attempt AND r.attempts_before < a.attempt)""",
    # Attempt numbers that go down along the tokens, or skip: a refunded give-back
    # reuses its number, nothing else may.
    "attempts_out_of_order": """
        SELECT count(*) FROM (
            SELECT attempt - lag(attempt) OVER w AS step, lag(outcome) OVER w AS before
            FROM job_attempts WINDOW w AS (PARTITION BY job_id ORDER BY lease_generation)) AS t
        WHERE step IS NOT NULL AND NOT (step = 1 OR (step = 0 AND before = 'QUEUED'))""",
    # History and row disagree: the final attempt must match the row.
    "history_mismatch": f"""
        SELECT count(*) FROM jobs AS j
        LEFT JOIN LATERAL (
            SELECT * FROM job_attempts AS a WHERE a.job_id = j.job_id
            ORDER BY lease_generation DESC LIMIT 1) AS last ON true
        WHERE j.state IN ({TERMINAL_SQL}) AND j.attempt_count > 0
          AND (last.outcome IS DISTINCT FROM j.state
               OR last.attempt IS DISTINCT FROM j.attempt_count)
          -- cancelled while waiting for a retry (or a run after a give-back or a
          -- replay): the cancel is not an attempt
          AND NOT (j.state = 'CANCELLED'
                   AND (last.outcome IN ('RETRY_WAIT', 'QUEUED')
                        OR EXISTS (SELECT 1 FROM job_replays AS r
                                   WHERE r.job_id = j.job_id
                                     AND r.attempts_before = last.attempt)))""",
    # A tenant's count of held slots must equal the slots its leases hold (one each,
    # a weighed job its weight): a slot released twice makes it lower, a leaked one
    # higher.
    "slots_leaked_or_released_twice": """
        SELECT coalesce(sum(abs(u.running - (
            SELECT coalesce(sum(coalesce(j.weight, 1)), 0) FROM jobs AS j
            WHERE j.tenant = u.tenant AND j.holds_slot))), 0)::int
        FROM tenant_usage AS u""",
    # A slot held by a job no longer leased.
    "slots_without_lease": """
        SELECT count(*) FROM jobs
        WHERE holds_slot AND state NOT IN ('RUNNING', 'CANCEL_REQUESTED')""",
    # A concurrency limit's running count must equal its type's leases that hold a
    # slot of it, and only a lease may hold one: a slot released twice makes the
    # count lower, a leaked one higher.
    "limit_slots_leaked_or_released_twice": """
        SELECT coalesce(sum(abs(c.running - (
            SELECT coalesce(sum(coalesce(j.weight, 1)), 0) FROM jobs AS j
            WHERE j.job_type = c.job_type AND j.limit_held
              AND j.state IN ('RUNNING', 'CANCEL_REQUESTED')))), 0)::int
             + (SELECT count(*) FROM jobs
                WHERE limit_held AND state NOT IN ('RUNNING', 'CANCEL_REQUESTED'))::int
        FROM concurrency_limits AS c""",
    # And so a queue's: its running count against the leases of its jobs that hold a
    # slot of it.
    "queue_limit_slots_leaked_or_released_twice": """
        SELECT coalesce(sum(abs(c.running - (
            SELECT coalesce(sum(coalesce(j.weight, 1)), 0) FROM jobs AS j
            WHERE j.queue = c.queue AND j.queue_limit_held
              AND j.state IN ('RUNNING', 'CANCEL_REQUESTED')))), 0)::int
             + (SELECT count(*) FROM jobs
                WHERE queue_limit_held AND state NOT IN ('RUNNING', 'CANCEL_REQUESTED'))::int
        FROM queue_limits AS c""",
    "attempts_over_budget": "SELECT count(*) FROM jobs WHERE attempt_count > max_attempts",
    # A key's count of leases (key_usage) must equal the leases of its jobs, and a
    # key no lease holds keeps no row: a lease released twice makes it lower, a
    # leaked one higher (or a row left behind).
    "key_leases_leaked_or_released_twice": """
        SELECT (SELECT coalesce(sum(abs(u.running - (
                    SELECT count(*) FROM jobs AS j
                    WHERE j.key = u.key AND j.state IN ('RUNNING', 'CANCEL_REQUESTED')))), 0)
                FROM key_usage AS u)::int
             + (SELECT count(DISTINCT j.key) FROM jobs AS j
                WHERE j.key IS NOT NULL AND j.state IN ('RUNNING', 'CANCEL_REQUESTED')
                  AND NOT EXISTS (SELECT 1 FROM key_usage AS u WHERE u.key = j.key))::int
             + (SELECT count(*) FROM key_usage WHERE running = 0)::int""",
    # Starts of a rate-limited name beyond its limit: in no window [a, b] of the
    # claims' clock (each attempt's started_at, the now() of the claim that took its
    # token) may more than burst + rate x (b - a) attempts start. With the k-th start
    # of a bucket at t_k and f(k) = k - rate x t_k, a window from start i to start j
    # holds j - i + 1 starts, over the limit when f(j) - f(i) + 1 > burst: one pass
    # keeping the least f so far finds the worst window ending at each start, so
    # the check reads each attempt once, not every pair. A name's limit is its own
    # or, failing that, that of the longest "prefix:*" it falls under.
    "rate_limit_exceeded": f"""
        WITH starts AS (
            SELECT j.rate_limit AS bucket, a.started_at
            FROM job_attempts AS a JOIN jobs AS j ON j.job_id = a.job_id
            WHERE j.rate_limit IS NOT NULL AND a.started_at IS NOT NULL
        ), limits AS (
            -- each bucket's limit, looked up by key as the claim looks it up
            SELECT b.bucket, l.rate / l.per_seconds AS per_second, l.burst
            FROM (SELECT DISTINCT bucket FROM starts) AS b
            CROSS JOIN LATERAL ({governing("b.bucket")}) AS l
        ), f AS (
            -- seconds from the bucket's first start, so the float keeps microseconds
            SELECT s.bucket, l.burst, row_number() OVER w AS k,
                   row_number() OVER w - l.per_second * extract(
                       epoch FROM s.started_at - min(s.started_at) OVER (PARTITION BY s.bucket)
                   )::float8 AS f
            FROM starts AS s JOIN limits AS l USING (bucket)
            WINDOW w AS (PARTITION BY s.bucket ORDER BY s.started_at)
        ), worst AS (
            SELECT bucket, burst, f - min(f) OVER w + 1 AS in_window
            FROM f
            WINDOW w AS (PARTITION BY bucket ORDER BY k ROWS UNBOUNDED PRECEDING)
        )
        -- a thousandth of a token for the clock's rounding
        SELECT count(*) FROM worst WHERE in_window > burst + 0.001""",
    # A resource's hold belongs to the lease that took it while that lease lasts, and
    # is left only uncertain once it expired: a hold not uncertain whose lease is gone
    # was leaked (its resource blocked for good), and a lease of a job with a
    # resource without its hold runs beside whoever holds it.
    "resource_holds_without_their_lease": """
        SELECT (SELECT count(*) FROM resource_holds AS h
                WHERE h.uncertain_since IS NULL
                  AND NOT EXISTS (SELECT 1 FROM jobs AS j
                                  WHERE j.job_id = h.job_id
                                    AND j.lease_generation = h.lease_generation
                                    AND j.state IN ('RUNNING', 'CANCEL_REQUESTED')))::int
             + (SELECT count(*) FROM jobs AS j
                WHERE j.resource IS NOT NULL AND j.state IN ('RUNNING', 'CANCEL_REQUESTED')
                  AND NOT EXISTS (SELECT 1 FROM resource_holds AS h
                                  WHERE h.resource = j.resource AND h.job_id = j.job_id
                                    AND h.lease_generation = j.lease_generation))::int""",
    # A child's attempt that began before each of its parents had SUCCEEDED (under
    # on_parent_failure 'run': had ended) by the database's clock: released early.
    # A parent's end is its attempt's finished_at (the finishing statement's time,
    # before its commit) and a child's start is its claim's now(), taken after the
    # commit that woke it, so a release in order always reads as later. A parent
    # that ended without an attempt (cancelled while waiting) ends at finished_at.
    "children_started_before_parents": """
        SELECT count(DISTINCT (a.job_id, a.lease_generation))
        FROM job_attempts AS a
        JOIN jobs AS c ON c.job_id = a.job_id
        JOIN job_dependencies AS d ON d.child_id = a.job_id
        WHERE NOT EXISTS (
            SELECT 1 FROM job_attempts AS p
            WHERE p.job_id = d.parent_id AND p.finished_at <= a.started_at
              AND (p.outcome = 'SUCCEEDED'
                   OR (c.on_parent_failure = 'run' AND p.outcome IN ('FAILED', 'CANCELLED'))))
          AND NOT (c.on_parent_failure = 'run' AND EXISTS (
            SELECT 1 FROM jobs AS p
            WHERE p.job_id = d.parent_id AND p.state IN ('FAILED', 'CANCELLED')
              AND p.finished_at <= a.started_at))""",
    # A child under 'cancel' of a parent that ended FAILED or CANCELLED (and was not
    # replayed to success since) must have ended CANCELLED with PARENT_FAILED, or
    # have ended before the parent did (an operator's cancel). Whether the edge is
    # marked done is not asked: a release at the wrong moment marks it.
    "children_of_failed_parents_not_cancelled": """
        SELECT count(DISTINCT c.job_id)
        FROM job_dependencies AS d
        JOIN jobs AS p ON p.job_id = d.parent_id
        JOIN jobs AS c ON c.job_id = d.child_id
        WHERE c.on_parent_failure = 'cancel' AND p.state IN ('FAILED', 'CANCELLED')
          AND NOT (c.state = 'CANCELLED'
                   AND (c.last_error_code = 'PARENT_FAILED' OR c.finished_at < p.finished_at))""",
    # A child's count of parents pending is its edges not settled: an edge counted
    # twice (a parent's end settling it again) or never makes them differ.
    "dependency_counts_off": """
        SELECT count(*) FROM jobs AS c
        LEFT JOIN (SELECT child_id, count(*) FILTER (WHERE NOT done) AS open
                   FROM job_dependencies GROUP BY child_id) AS e ON e.child_id = c.job_id
        WHERE c.parents_pending <> coalesce(e.open, 0)""",
}

EFFECT_CHECKS = {
    "effects_applied_more_than_once": """
        SELECT count(*) FROM (
            SELECT key FROM chaos_effects GROUP BY key HAVING count(*) > 1) AS t""",
    # An effect whose writer was not the attempt that completed the job: its
    # transaction committed without holding the lease. Fencing forbids it.
    "stale_writes_accepted": """
        SELECT count(*) FROM chaos_effects AS e
        WHERE NOT EXISTS (
            SELECT 1 FROM job_attempts AS a
            WHERE a.job_id = e.job_id AND a.outcome = 'SUCCEEDED'
              AND a.lease_generation = e.generation AND a.worker = e.worker)""",
    # A job that succeeded without its effect being applied by anyone.
    "succeeded_without_effect": """
        SELECT count(*) FROM jobs AS j
        WHERE j.job_type = 'effect' AND j.state = 'SUCCEEDED'
          AND NOT EXISTS (
            SELECT 1 FROM chaos_effects AS e WHERE e.key = j.payload->>'key')""",
}


def check(
    conninfo: str, expected: int | None = None, *, require_success: bool = False
) -> dict[str, Any]:
    with psycopg.connect(conninfo, connect_timeout=10) as conn:
        report: dict[str, Any] = {
            "jobs_enqueued": conn.execute("SELECT count(*) FROM jobs").fetchone()[0],  # type: ignore[index]
            "by_state": dict(
                conn.execute(
                    "SELECT state, count(*) FROM jobs GROUP BY state ORDER BY state"
                ).fetchall()
            ),
        }
        report["terminal"] = sum(n for s, n in report["by_state"].items() if s in TERMINAL)
        if expected is not None:
            # A committed enqueue whose row is missing is lost too.
            report["missing_rows"] = max(expected - report["jobs_enqueued"], 0)
        if require_success:
            report["not_succeeded"] = report["jobs_enqueued"] - report["by_state"].get(
                "SUCCEEDED", 0
            )
        for name, sql in CHECKS.items():
            report[name] = conn.execute(sql).fetchone()[0]  # type: ignore[index]
        has_effects = conn.execute("SELECT to_regclass('chaos_effects') IS NOT NULL").fetchone()[0]  # type: ignore[index]
        for name, sql in EFFECT_CHECKS.items():
            report[name] = conn.execute(sql).fetchone()[0] if has_effects else None  # type: ignore[index]
        report["attempts_per_job"] = dict(
            conn.execute(
                "SELECT attempt_count, count(*) FROM jobs GROUP BY 1 ORDER BY 1"
            ).fetchall()
        )
        report["awaiting_approval"] = conn.execute(
            f"SELECT count(*) FROM jobs WHERE state NOT IN ({TERMINAL_SQL})"
            " AND approval = 'REQUIRED'"
        ).fetchone()[0]  # type: ignore[index]
        report["lease_expired_attempts"] = conn.execute(
            "SELECT count(*) FROM job_attempts WHERE error_code = 'LEASE_EXPIRED'"
        ).fetchone()[0]  # type: ignore[index]
    return report


MUST_BE_ZERO = [
    *CHECKS,
    *EFFECT_CHECKS,
    "missing_rows",
    "not_succeeded",
    "cap_exceeded",
    "key_limit_exceeded",
]


def violations(report: dict[str, Any]) -> dict[str, int]:
    return {k: report[k] for k in MUST_BE_ZERO if report.get(k)}
