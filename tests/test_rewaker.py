"""The re-waker under a huge backlog: lost wake-ups are repaired in a transaction of
their own, and the orphan backstop walks the jobs table a bounded slice at a time,
so neither waits for, nor rolls back with, a scan of every waiting job."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from harness import backlog
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.plumbing.db import RELAY_OPTIONS
from hybrid_jobs.relay.broker import Publisher
from hybrid_jobs.relay.maintenance import OrphanWalk, rewake_lost, wake_orphans
from hybrid_jobs.schema.topology import Topology

pytestmark = pytest.mark.timeout(180)


def build_backlog(pg: psycopg.Connection, n: int, queue: str = "default") -> None:
    """Jobs waiting behind the window, each with its unsent wake-up."""
    backlog.build_backlog(pg, n, queue, job_type="t")
    pg.execute("ANALYZE jobs")
    pg.execute("ANALYZE outbox")


def relay_pool(
    db: DatabaseUrl, options: str | None = None
) -> AsyncConnectionPool[psycopg.AsyncConnection]:
    return AsyncConnectionPool(
        db.conninfo,
        min_size=1,
        max_size=2,
        kwargs={"autocommit": True} | ({"options": options} if options else {}),
        open=False,
    )


async def test_lost_wakeups_are_repaired_behind_a_backlog_the_orphan_scan_cannot_finish(
    pg: psycopg.Connection, db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology
) -> None:
    """200,000 waiting jobs under a short statement timeout. Before, the repair shared
    a scan of every waiting job's transaction and rolled back with it, every round, so
    lost wake-ups stayed lost; now the repair commits on its own, and the orphan walk
    reads a slice of 2,000 jobs at a time, whatever the table holds. (The timeout is
    one second, not the few milliseconds a slice takes on a quiet machine: on a busy
    CI runner a slice's time stretches many fold, and a bound that close only
    measures the runner. How much a slice reads is asserted by rows, below.)"""
    build_backlog(pg, 200_000)
    lost = [
        row[0]
        for row in pg.execute(
            "UPDATE outbox SET sent_at = now() - interval '1 minute'"
            " WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT 50) RETURNING job_id"
        ).fetchall()
    ]
    # the relay's own options (no JIT, whose compile alone can take 70 ms of a
    # plan this size), with the short timeout after them
    pool = relay_pool(db_url, RELAY_OPTIONS + " -c statement_timeout=1000")
    publisher = Publisher(amqp_url, topology)
    await pool.open()
    await publisher.connect()
    try:
        # The queue exists and holds nothing: the 50 sent wake-ups are lost.
        assert await publisher.ready_counts(["default"]) == {"default": 0}
        woken = await rewake_lost(pool, publisher, grace=1.0, worker_ttl=60)
        walk = OrphanWalk()
        for _ in range(3):
            await wake_orphans(pool, walk, grace=1.0, size=2_000, worker_ttl=60)
    finally:
        await publisher.close()
        await pool.close()
    assert woken == 50
    (unsent,) = pg.execute(
        "SELECT count(*) FROM outbox WHERE job_id = ANY(%s) AND sent_at IS NULL", [lost]
    ).fetchone()  # type: ignore[misc]
    assert unsent == 50, "the lost wake-ups are back in the backlog, to be sent again"
    assert walk.after is not None, "the walk moved on, a slice at a time"
    (walked,) = pg.execute("SELECT count(*) FROM jobs WHERE job_id <= %s", [walk.after]).fetchone()  # type: ignore[misc]
    assert walked == 3 * 2_000, "three slices read 2,000 jobs each, not the whole backlog"


async def test_the_orphan_walk_wakes_every_job_left_without_a_wakeup_in_bounded_slices(
    pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """A slice at a time, by primary key, from where the last one ended: jobs with no
    wake-up at all (a row edited by hand) get one, jobs with one are left alone,
    and a lap ends by starting over."""
    build_backlog(pg, 3_000)
    orphans = [
        row[0]
        for row in pg.execute(
            "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox ORDER BY random() LIMIT 700)"
            " RETURNING job_id"
        ).fetchall()
    ]
    finished = pg.execute(
        "INSERT INTO jobs (job_id, job_type, state, finished_at) SELECT gen_random_uuid(), 't',"
        " 'SUCCEEDED', now() FROM generate_series(1, 500) RETURNING job_id"
    ).fetchall()
    assert len(finished) == 500
    pool = relay_pool(db_url)
    await pool.open()
    try:
        walk = OrphanWalk()
        woken: list[uuid.UUID] = []
        slices = 0
        while walk.laps == 0:
            found = await wake_orphans(pool, walk, grace=0, size=400, worker_ttl=60)
            woken += [job_id for job_id, _queue in found]
            slices += 1
            assert slices < 100, "the walk never came round"
        assert slices == -(-3_500 // 400), "each slice reads its 400 rows, no more, no less"
        assert sorted(woken) == sorted(orphans)
        again = await wake_orphans(pool, walk, grace=0, size=10_000, worker_ttl=60)
        assert again == [], "a second lap finds nothing left to wake"
    finally:
        await pool.close()
    (left,) = pg.execute(
        "SELECT count(*) FROM jobs AS j WHERE j.state = 'QUEUED'"
        " AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.job_id = j.job_id)"
    ).fetchone()  # type: ignore[misc]
    assert left == 0
