"""The checker's rate-limit invariant on real PostgreSQL: the starts of a bucket, by
the claims' clock, never exceed burst + rate x t in any window. Attempts are written
as the history would have them, once within the limit and once a start over it in
the middle of a run (a window no start-to-end count would see)."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from hybrid_jobs.jobctl.check import CHECKS
from tests.support.plans import plan, reads

EXCEEDED = CHECKS["rate_limit_exceeded"]


def _starts(pg: psycopg.Connection, bucket: str, seconds: list[float]) -> None:
    """One SUCCEEDED job of ``bucket`` per start, its attempt begun at that many
    seconds after a fixed instant."""
    for at in seconds:
        job_id = uuid.uuid4()
        pg.execute(
            "INSERT INTO jobs (job_id, job_type, rate_limit, state, attempt_count)"
            " VALUES (%s, 'noop', %s, 'SUCCEEDED', 1)",
            [job_id, bucket],
        )
        pg.execute(
            "INSERT INTO job_attempts (job_id, attempt, lease_generation, worker, started_at,"
            " finished_at, outcome) VALUES (%s, 1, 1, 'w',"
            " '2026-12-01 00:00:00+00'::timestamptz + make_interval(secs => %s),"
            " '2026-12-01 00:00:00+00'::timestamptz + make_interval(secs => %s + 0.01),"
            " 'SUCCEEDED')",
            [job_id, at, at],
        )


@pytest.fixture
def limited(pg: psycopg.Connection) -> psycopg.Connection:
    # 10 a second with a burst of 2 under the prefix, and an own limit for one name
    pg.execute(
        "INSERT INTO rate_limits (name, rate, per_seconds, burst)"
        " VALUES ('sms:*', 10, 1, 2), ('sms:vip', 100, 1, 1)"
    )
    return pg


def test_starts_within_the_limit_pass(limited: psycopg.Connection) -> None:
    # the burst at once, then one a token (0.1 s) apart, then a pause and a burst again
    _starts(limited, "sms:acme", [0, 0, 0.1, 0.2, 0.3, 1.0, 1.0, 1.1])
    # its own, faster limit applies, not the prefix's
    _starts(limited, "sms:vip", [i * 0.01 for i in range(30)])
    assert limited.execute(EXCEEDED).fetchone() == (0,)


def test_one_start_over_the_limit_in_any_window_is_caught(limited: psycopg.Connection) -> None:
    # within the limit from the first start to the last (8 starts in 1.1 s, 2 + 11
    # allowed), but five within 0.1 s in the middle: burst 2 + 1 token, two too many
    _starts(limited, "sms:acme", [0, 0.5, 0.5, 0.55, 0.6, 0.6, 1.1, 1.1])
    found = limited.execute(EXCEEDED).fetchone()
    assert found is not None and found[0] >= 1
    # another bucket under the same prefix is its own: within its limit, not counted
    before = found[0]
    _starts(limited, "sms:globex", [0, 0, 0.1])
    assert limited.execute(EXCEEDED).fetchone() == (before,)


def test_a_name_under_two_prefixes_is_held_to_the_longer_ones_limit(
    limited: psycopg.Connection,
) -> None:
    # 'sms:eu:*' (burst 4) governs sms:eu:acme, not 'sms:*' (burst 2), as the claim
    # has it: four starts at once are within the limit
    limited.execute(
        "INSERT INTO rate_limits (name, rate, per_seconds, burst) VALUES ('sms:eu:*', 10, 1, 4)"
    )
    _starts(limited, "sms:eu:acme", [0, 0, 0, 0])
    assert limited.execute(EXCEEDED).fetchone() == (0,)
    # and a fifth is one too many by the longer prefix's limit too
    _starts(limited, "sms:eu:acme", [0])
    found = limited.execute(EXCEEDED).fetchone()
    assert found is not None and found[0] >= 1


def test_the_check_looks_each_bucket_s_limit_up_by_key(limited: psycopg.Connection) -> None:
    # 20,000 limits, and starts in 200 buckets under them: each bucket's limit is
    # found in a few index probes, not by reading every limit for every bucket
    limited.execute(
        "INSERT INTO rate_limits (name, rate, per_seconds, burst)"
        " SELECT 'api' || i || ':*', 10, 1, 2 FROM generate_series(1, 20000) AS i"
    )
    for i in range(200):
        _starts(limited, f"api{i + 1}:x", [0])
    limited.execute("ANALYZE rate_limits")
    found = plan(limited, EXCEEDED, {})
    read = list(reads(found[0]["Plan"], "rate_limits"))
    assert read and all(node != "Seq Scan" for node, _, _ in read), read
    assert sum(rows for _, rows, _ in read) <= 3 * 200, read
    assert limited.execute(EXCEEDED).fetchone() == (0,)
