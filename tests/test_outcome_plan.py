"""An outcome reads what its batch costs, not what the backlog costs: ending the
leases of keyed jobs wakes each key's next job, and the check that the next one has
no wake-up pending must read that job's wake-ups, never the backlog's. A generic plan
(the one a consumer's prepared statement settles on) had ANDed in the whole unsent
index for every job woken: with 20,000 jobs waiting, 5 ms a job, and the keyed drain
ran at 0.69x the unkeyed one."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from hybrid_jobs.schema import queries as q
from tests.support.plans import plan as explain_plan

BACKLOG = 5_000
KEYS = 40

# KEYS keys, each with a job running (its lease held, key_usage saying so) and the
# next one waiting, turned down for the key (no wake-up of its own: the end of the
# lease ahead is what wakes it).
SEED_KEYS = """
WITH running AS (
    INSERT INTO jobs (job_id, job_type, key, key_limit, state, lease_owner, lease_expires_at,
                      lease_generation, attempt_count, max_attempts, started_at)
    SELECT gen_random_uuid(), 'noop', 'account:' || g, 1, 'RUNNING', 'plan-test',
           now() + interval '1 hour', 1, 1, 5, now()
    FROM generate_series(1, %(keys)s) AS g
    RETURNING key
), waiting AS (
    INSERT INTO jobs (job_id, job_type, key, key_limit, delay_reason, delay_since)
    SELECT gen_random_uuid(), 'noop', key, 1, 'KEY_BUSY', now() FROM running
)
INSERT INTO key_usage (key, running, key_limit) SELECT key, 1, 1 FROM running
"""
# A backlog of plain jobs with their wake-ups unsent, added after the statistics
# were taken: the planner believes the unsent index nearly empty.
SEED_BACKLOG = """
WITH backlog AS (
    INSERT INTO jobs (job_id, job_type)
    SELECT gen_random_uuid(), 'noop' FROM generate_series(1, %(n)s)
    RETURNING job_id
)
INSERT INTO outbox (job_id, queue) SELECT job_id, 'default' FROM backlog
"""


@pytest.fixture
def running(pg: psycopg.Connection) -> list[Any]:
    pg.execute(SEED_KEYS, {"keys": KEYS})
    pg.execute("VACUUM ANALYZE jobs")
    # The outbox as a young system has it, never analyzed (or analyzed long before
    # the backlog came): the planner takes the default guesses, which make a job's
    # wake-ups and the unsent ones equally few.
    pg.execute(SEED_BACKLOG, {"n": BACKLOG})
    return [r[0] for r in pg.execute("SELECT job_id FROM jobs WHERE state = 'RUNNING'")]


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_ending_keyed_leases_reads_the_batch_not_the_backlog(
    pg: psycopg.Connection, running: list[Any], generic: bool
) -> None:
    params = {
        "outcomes": json.dumps(
            [
                {"job_id": str(j), "generation": 1, "kind": "succeeded", "result": None}
                for j in running
            ]
        ),
        "worker": "plan-test",
    }
    for _ in range(3):  # the generic plan as a settled prepared statement runs it
        found = explain_plan(pg, q.JOB_FINISH_MANY, params, generic=generic)
    outbox_read = outbox_scans(found[0]["Plan"])
    assert outbox_read, "the outcome looks for the next jobs' pending wake-ups"
    for node, index, rows in outbox_read:
        assert node != "Seq Scan", outbox_read
        # each job woken is looked up once or twice, never the backlog
        assert rows <= 4 * KEYS, (node, index, rows, outbox_read)
    # and, run for real, it wakes each key's next job once
    pg.execute(q.JOB_FINISH_MANY, params)
    woken = pg.execute(
        "SELECT count(*) FROM outbox AS o JOIN jobs AS j USING (job_id)"
        " WHERE j.delay_reason = 'KEY_BUSY'"
    ).fetchone()
    assert woken == (KEYS,)


def outbox_scans(node: dict[str, Any]) -> list[tuple[str, str | None, int]]:
    """Each scan of outbox or of one of its indexes (a bitmap index scan names only
    its index): node type, index, and the rows it produced or filtered away, all its
    loops together."""
    found = []
    ours = node.get("Relation Name") == "outbox" or node.get("Index Name", "").startswith("outbox")
    if ours and "Scan" in node["Node Type"]:
        read = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
        found.append((node["Node Type"], node.get("Index Name"), read * node["Actual Loops"]))
    for child in node.get("Plans", []):
        found.extend(outbox_scans(child))
    return found
