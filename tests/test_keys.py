"""Entity keys on real processes: at most key_limit leases per key however many
consumers and slots contend, ordered keys start their jobs in enqueue order one
after the other (a retrying head stays the head; "strict" holds behind a FAILED
one until it is replayed), and a key's slot comes back by every way a lease ends
(kill -9, SIGSTOP past the lease, a give-back at SIGTERM, cancel, Permanent)."""

from __future__ import annotations

import asyncio
import itertools
import signal
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.relay.maintenance import OrphanWalk, wake_orphans
from hybrid_jobs.schema.queries import JOB_EXPIRE_WAITING
from hybrid_jobs.schema.topology import Topology
from tests.apps.keys import OVERLAPS, RUNS_TABLE
from tests.support.api import api_client
from tests.support.inproc import both_running
from tests.support.jobs import (
    enqueue,
    enqueue_many,
    job,
    until,
    until_started,
    wait_for_state,
    wait_until_all,
    wakeups,
)
from tests.support.metrics import scrape_once
from tests.support.processes import fleet, running
from tests.test_rewaker import relay_pool

pytestmark = pytest.mark.timeout(300)

APP = ["--app", "tests.apps.keys"]

# The overlapping runs of the keys given.
OVERLAPS_OF = OVERLAPS + "WHERE a.key = ANY(%s)\n"

# The most runs of one key going at one instant (a run still going counts as
# open-ended). From the handlers' own clock, not the attempts' history: a claim's
# now() is when its statement arrived, before it was planned and took its
# snapshot, so on a loaded machine it can precede the end of the lease it waited
# for by milliseconds.
PEAK_RUNS = """
SELECT key, max(running) FROM (
    SELECT key, sum(step) OVER (PARTITION BY key ORDER BY at, step) AS running
    FROM (SELECT key, started_at AS at, 1 AS step FROM key_runs
          UNION ALL
          SELECT key, COALESCE(ended_at, 'infinity'), -1 FROM key_runs) AS e
) AS s GROUP BY key
"""


def keyed(key: str | None, **payload: Any) -> dict[str, Any]:
    return {"key": key, **payload}


def test_a_key_capped_at_one_never_overlaps_while_fifty_others_run_at_once(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    pg.execute(RUNS_TABLE)
    hot = [NewJob("keyed", keyed("hot", seconds=0.05), key="hot") for _ in range(40)]
    others = [
        NewJob("keyed", keyed(f"k{i}", seconds=0.3), key=f"k{i}")
        for _ in range(3)
        for i in range(50)
    ]
    with fleet(env, [*APP, "--concurrency", "20"], consumers=2):
        ids = enqueue_many(engine, hot + others)
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(ids), timeout=240))
    keys = ["hot", *(f"k{i}" for i in range(50))]
    assert pg.execute(OVERLAPS_OF, [keys]).fetchall() == []
    peaks = dict(pg.execute(PEAK_RUNS).fetchall())
    assert max(peaks.values()) == 1, peaks
    # the other keys ran side by side: some instant had many of them running
    (side_by_side,) = pg.execute(
        """SELECT max(n) FROM (SELECT (SELECT count(DISTINCT b.key) FROM key_runs AS b
                                      WHERE b.started_at <= a.started_at
                                        AND b.ended_at > a.started_at) AS n
                               FROM key_runs AS a) AS s"""
    ).fetchone()  # type: ignore[misc]
    assert side_by_side >= 15, side_by_side
    # a busy key spent no attempt, and left no row behind
    assert pg.execute("SELECT max(attempt_count) FROM jobs").fetchone() == (1,)
    assert pg.execute("SELECT count(*) FROM key_usage").fetchone() == (0,)
    (busy,) = pg.execute("SELECT count(*) FROM key_runs WHERE key = 'hot'").fetchone()  # type: ignore[misc]
    assert busy == 40


def test_key_limit_two_holds_two_at_once(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    pg.execute(RUNS_TABLE)
    jobs = [NewJob("keyed", keyed("pair", seconds=0.2), key="pair", key_limit=2) for _ in range(12)]
    with fleet(env, [*APP, "--concurrency", "10"]):
        ids = enqueue_many(engine, jobs)
        asyncio.run(wait_until_all(pg, "SUCCEEDED", len(ids), timeout=120))
    assert dict(pg.execute(PEAK_RUNS).fetchall()) == {"pair": 2}
    assert pg.execute("SELECT count(*) FROM key_usage").fetchone() == (0,)


# Per ordered key: its jobs in key_seq order with the first start of a handler
# of each and the end of its last (the handlers' clock: see PEAK_RUNS).
ORDER = """
SELECT j.key, j.job_id, j.key_seq, j.state, j.attempt_count,
       (SELECT min(r.started_at) FROM key_runs AS r WHERE r.job_id = j.job_id) AS first_start,
       (SELECT max(COALESCE(r.ended_at, 'infinity')) FROM key_runs AS r
        WHERE r.job_id = j.job_id) AS last_end
FROM jobs AS j WHERE j.key_seq IS NOT NULL
ORDER BY j.key, j.key_seq
"""


def _check_order(pg: psycopg.Connection) -> dict[str, list[uuid.UUID]]:
    """Each ordered job that ran started after the one before it of its key ended;
    returns the jobs per key in key order."""
    per_key: dict[str, list[Any]] = {}
    for row in pg.execute(ORDER).fetchall():
        per_key.setdefault(row[0], []).append(row)
    for key, rows in per_key.items():
        ran = [r for r in rows if r[5] is not None]
        for before, after in itertools.pairwise(ran):
            assert after[5] > before[6], f"{key}: {after[1]} started before {before[1]} ended"
    return {key: [r[1] for r in rows] for key, rows in per_key.items()}


def test_ordered_jobs_start_in_enqueue_order_with_four_consumers_and_a_retrying_head(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    """Eight keys of ten ordered jobs each, enqueued one transaction at a time from
    four producers at once (so the keys' enqueues race), run by four consumers;
    the first job of key o0 fails twice before it succeeds, and the nine behind it
    wait for it."""
    pg.execute(RUNS_TABLE)
    head = enqueue(
        engine, "keyed", keyed("o0", fail_attempts=2, seconds=0.05), key="o0", ordered=True
    )
    # per producer, the jobs it enqueued in its order (one commit after the other)
    enqueued: dict[int, list[uuid.UUID]] = {w: [] for w in range(4)}

    def produce(worker: int) -> None:
        for n in range(20):
            key = f"o{(worker * 20 + n) % 8}"
            with Session(engine) as session, session.begin():
                job_id = outbox.enqueue(
                    session, "keyed", keyed(key, seconds=0.02), key=key, ordered=True
                )
            enqueued[worker].append(job_id)

    with fleet(env, [*APP, "--concurrency", "5"], consumers=4):

        async def main() -> None:
            await asyncio.gather(*(asyncio.to_thread(produce, w) for w in range(4)))
            await wait_until_all(pg, "SUCCEEDED", 81, timeout=240)

        asyncio.run(main())
    started = _check_order(pg)
    assert started["o0"][0] == head
    assert job(pg, head)["attempt_count"] == 3
    for key, ids in started.items():
        # each producer's jobs of a key keep their order (its commits are in order)
        for mine in enqueued.values():
            of_key = [i for i in mine if i in set(ids)]
            assert of_key == [i for i in ids if i in set(of_key)], key
    assert pg.execute("SELECT count(*) FROM key_usage").fetchone() == (0,)


def test_strict_order_holds_the_key_behind_a_failed_head_until_it_is_replayed(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    pg.execute(RUNS_TABLE)
    with fleet(env, [*APP, "--concurrency", "10"]):
        strict = [
            enqueue(engine, "keyed", keyed("s", permanent_attempts=1), key="s", ordered="strict"),
            *(enqueue(engine, "keyed", keyed("s"), key="s", ordered="strict") for _ in range(3)),
        ]
        # ordered=True moves on past a head that FAILED
        loose = [
            enqueue(engine, "keyed", keyed("l", permanent_attempts=1), key="l", ordered=True),
            *(enqueue(engine, "keyed", keyed("l"), key="l", ordered=True) for _ in range(3)),
        ]
        asyncio.run(wait_for_state(pg, strict[0], "FAILED"))
        asyncio.run(wait_until_all(pg, "SUCCEEDED", 3, timeout=60))
        assert [job(pg, i)["state"] for i in loose] == ["FAILED", *["SUCCEEDED"] * 3]
        asyncio.run(asyncio.sleep(2))
        assert [job(pg, i)["state"] for i in strict] == ["FAILED", *["QUEUED"] * 3]
        with Session(engine) as session:
            why = outbox.explain(session, strict[1])
            later = outbox.explain(session, strict[3])
        (blocker,) = why.blockers
        assert blocker.code == "KEY_ORDER"
        assert blocker.facts == {
            "key": "s",
            "ahead": strict[0],
            "ahead_state": "FAILED",
            "strict": True,
        }
        assert later.blocker("KEY_ORDER").facts["ahead"] == strict[2]  # type: ignore[union-attr]
        # nothing polls the held key: the waiting jobs were turned down once each
        (refusals,) = pg.execute(
            "SELECT count(*) FROM jobs WHERE key = 's' AND delay_reason = 'KEY_ORDER'"
        ).fetchone()  # type: ignore[misc]
        assert refusals >= 1
        assert pg.execute(
            "SELECT count(*) FROM outbox AS o JOIN jobs AS j USING (job_id) WHERE j.key = 's'"
        ).fetchone() == (0,)
        with Session(engine) as session, session.begin():
            outbox.retry_job(session, strict[0])
        asyncio.run(wait_until_all(pg, "SUCCEEDED", 7, timeout=60))
    assert _check_order(pg)["s"] == strict
    assert pg.execute("SELECT count(*) FROM key_usage").fetchone() == (0,)


def test_a_key_comes_back_by_every_way_a_lease_ends(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    """Per key a head that holds it and a job waiting behind it (KEY_BUSY, no
    attempt spent): the head's consumer is killed with SIGKILL, frozen with SIGSTOP
    past its lease, or stopped with SIGTERM (a give-back); the head is cancelled,
    or fails with Permanent. Each time the waiting job starts once the lease ends,
    and no key keeps a row."""
    pg.execute(RUNS_TABLE)
    short = [*APP, "--lease-seconds", "3", "--heartbeat-seconds", "1", "--concurrency", "4"]
    heads: dict[str, uuid.UUID] = {}
    nexts: dict[str, uuid.UUID] = {}

    def pair(key: str, **head: Any) -> None:
        heads[key] = enqueue(engine, "keyed", keyed(key, **head), key=key)
        asyncio.run(until_started(pg, "key_runs", [heads[key]]))
        nexts[key] = enqueue(engine, "keyed", keyed(key), key=key)

        def refused() -> bool:
            return job(pg, nexts[key])["delay_reason"] == "KEY_BUSY"

        asyncio.run(until(refused, f"{key}: the next job is turned down for its key"))

    # the chaos soak's relay: wake-ups a frozen consumer holds are sent again soon
    relay = ["--sweep-interval", "0.5", "--rewake-interval", "3"]
    with running("relay", relay, env, "relay.started"):
        with running("consumer", short, env, "consumer.started") as killed:
            pair("kill", hang_once=True)
            killed.kill()
        frozen_cm = running("consumer", short, env, "consumer.started")
        frozen = frozen_cm.__enter__()
        try:
            pair("stop", hang_once=True)
            frozen.signal(signal.SIGSTOP)
            with running(
                "consumer", [*short, "--drain-seconds", "0.5"], env, "consumer.started"
            ) as d:
                pair("term", hang_once=True)
                assert d.stop() == 0
            assert job(pg, heads["term"])["state"] == "QUEUED"
            with running("consumer", short, env, "consumer.started"):
                pair("cancel", hang_once=True)
                with Session(engine) as session, session.begin():
                    outbox.request_cancel(session, heads["cancel"])
                pair("perm", permanent_attempts=1, seconds=1)
                asyncio.run(wait_until_all(pg, "SUCCEEDED", 8, timeout=90))
                states = {k: job(pg, i)["state"] for k, i in heads.items()}
                assert states == {
                    "kill": "SUCCEEDED",
                    "stop": "SUCCEEDED",
                    "term": "SUCCEEDED",
                    "cancel": "CANCELLED",
                    "perm": "FAILED",
                }
        finally:
            frozen.signal(signal.SIGCONT)
            frozen_cm.__exit__(None, None, None)
    for key, job_id in nexts.items():
        row = job(pg, job_id)
        # every attempt it spent was a lease it held (one that the frozen consumer
        # held ran out, say); waiting for its key spent none
        (leases,) = pg.execute(
            "SELECT count(*) FROM job_attempts WHERE job_id = %s", [job_id]
        ).fetchone()  # type: ignore[misc]
        assert (row["state"], row["attempt_count"]) == ("SUCCEEDED", leases), key
    assert pg.execute("SELECT count(*) FROM key_usage").fetchone() == (0,)


async def test_explain_names_the_key_and_the_job_holding_it(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    registry = Registry()
    release = asyncio.Event()

    @registry.handler("hold")
    async def hold(j: consumers.Job) -> None:
        await release.wait()

    async with both_running(db_url, amqp_url, topology, registry, concurrency=4):
        holder = enqueue(engine, "hold", {}, key="doc:1")
        await wait_for_state(pg, holder, "RUNNING")
        waiting = enqueue(engine, "hold", {}, key="doc:1")
        # Turned down, and then without a wake-up: on a slow machine the re-waker
        # (1 s grace here) can put the wake-up the claim holds back in the backlog
        # first; sent again, it is turned down again and used up.
        await until(
            lambda: job(pg, waiting)["delay_reason"] == "KEY_BUSY" and wakeups(pg, waiting) == 0,
            "turned down, its wake-up used up",
        )
        with Session(engine) as session:
            why = outbox.explain(session, waiting)
        assert why.codes == ["KEY_BUSY"], why
        assert why.blocker("KEY_BUSY").facts == {  # type: ignore[union-attr]
            "key": "doc:1",
            "running": 1,
            "key_limit": 1,
            "held_by": holder,
        }
        assert "held by job" in why.summary
        assert pg.execute("SELECT running FROM key_usage WHERE key = 'doc:1'").fetchone() == (1,)
        release.set()
        await wait_until_all(pg, "SUCCEEDED", 2)
    assert pg.execute("SELECT count(*) FROM key_usage").fetchone() == (0,)


@pytest.mark.parametrize(("first", "second"), [(1, 5), (5, 1)])
async def test_mixed_limits_on_one_key_keep_the_strictest(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
    first: int,
    second: int,
) -> None:
    """A job that asked to run alone is neither joined by one of its key that
    allows company, nor joins one: the strictest limit of the holders and the
    newcomer governs (it was the newcomer's alone, and overwrote the key's)."""
    registry = Registry()
    release = asyncio.Event()

    @registry.handler("hold")
    async def hold(j: consumers.Job) -> None:
        await release.wait()

    async with both_running(db_url, amqp_url, topology, registry, concurrency=4):
        holder = enqueue(engine, "hold", {}, key="doc:mixed", key_limit=first)
        await wait_for_state(pg, holder, "RUNNING")
        newcomer = enqueue(engine, "hold", {}, key="doc:mixed", key_limit=second)
        await until(
            lambda: (
                job(pg, newcomer)["delay_reason"] == "KEY_BUSY"
                or job(pg, newcomer)["state"] == "RUNNING"
            ),
            "the newcomer claimed or turned down",
        )
        assert job(pg, newcomer)["state"] != "RUNNING", "two leases under a limit of one"
        await until(lambda: wakeups(pg, newcomer) == 0, "its wake-up used up")
        with Session(engine) as session:
            why = outbox.explain(session, newcomer)
        assert why.codes == ["KEY_BUSY"], why
        assert why.blocker("KEY_BUSY").facts["key_limit"] == 1  # type: ignore[union-attr]
        release.set()
        await wait_until_all(pg, "SUCCEEDED", 2)
    assert pg.execute("SELECT count(*) FROM key_usage").fetchone() == (0,)


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"ordered": True}, ValueError, "ordered needs a key"),
        ({"key_limit": 2}, ValueError, "key_limit needs a key"),
        ({"key": "a", "key_limit": 0}, ValueError, "key_limit must be between"),
        ({"key": "a", "key_limit": "2"}, TypeError, "key_limit must be an int"),
        ({"key": "a", "ordered": "yes"}, ValueError, "ordered must be True, False or 'strict'"),
        ({"key": ""}, ValueError, "key"),
        ({"key": "a", "key_limit": 2, "ordered": True}, ValueError, "one at a time"),
        ({"key": "a", "key_limit": 3, "ordered": "strict"}, ValueError, "one at a time"),
    ],
)
def test_bad_key_arguments_raise_before_writing(
    engine: Engine, pg: psycopg.Connection, kwargs: dict[str, Any], error: type, text: str
) -> None:
    with Session(engine) as session, session.begin(), pytest.raises(error, match=text):
        outbox.enqueue(session, "t", {}, **kwargs)
    assert pg.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


async def test_the_api_enqueues_with_a_key(db_url: DatabaseUrl, pg: psycopg.Connection) -> None:
    async with api_client(db_url) as client:
        sent = await client.post(
            "/v1/jobs",
            json={"job_type": "greet", "key": "account:9", "ordered": "strict"},
        )
        assert sent.status_code == 202, sent.text
        shown = sent.json()
        assert (shown["key"], shown["key_limit"], shown["key_order"]) == ("account:9", 1, "strict")
        wide = await client.post(
            "/v1/jobs", json={"job_type": "greet", "key": "pool", "key_limit": 2}
        )
        assert wide.status_code == 202, wide.text
        assert wide.json()["key_limit"] == 2
        for refused_body in (
            {"job_type": "greet", "ordered": True},
            {"job_type": "greet", "key": "account:9", "key_limit": 2, "ordered": True},
        ):
            refused = await client.post("/v1/jobs", json=refused_body)
            assert refused.status_code == 422, refused.text
    row = pg.execute(
        "SELECT key, key_limit, key_order, key_seq IS NOT NULL FROM jobs ORDER BY key"
    ).fetchall()
    assert row == [("account:9", 1, "strict", True), ("pool", 2, None, False)]


async def test_the_orphan_walk_leaves_a_job_waiting_for_its_key_until_the_key_frees(
    pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """A job turned down for its key has no wake-up on purpose: the end of the lease
    ahead of it wakes it. The orphan walk (the backstop for a wake-up lost in a race)
    wakes it only once nothing holds it back any more; while the key is busy it
    would be turned down again, once per lap, for nothing."""
    busy, behind = uuid.uuid4(), uuid.uuid4()
    pg.execute(
        "INSERT INTO jobs (job_id, job_type, key, key_limit, delay_reason) VALUES"
        " (%s, 't', 'k1', 1, 'KEY_BUSY')",
        [busy],
    )
    head = pg.execute(
        "INSERT INTO jobs (job_id, job_type, key, key_limit, key_order, key_seq, state,"
        " lease_owner, lease_expires_at, attempt_count, max_attempts)"
        " VALUES (gen_random_uuid(), 't', 'k2', 1, 'ordered', 1, 'RUNNING', 'w',"
        " now() + interval '1 hour', 1, 5) RETURNING job_id"
    ).fetchone()[0]  # type: ignore[index]
    pg.execute(
        "INSERT INTO jobs (job_id, job_type, key, key_limit, key_order, key_seq, delay_reason)"
        " VALUES (%s, 't', 'k2', 1, 'ordered', 2, 'KEY_ORDER')",
        [behind],
    )
    pg.execute("INSERT INTO key_usage (key, running, key_limit) VALUES ('k1', 1, 1), ('k2', 1, 1)")
    pool = relay_pool(db_url)
    await pool.open()
    try:
        assert await wake_orphans(pool, OrphanWalk(), grace=0, size=100, worker_ttl=60) == []
        pg.execute("DELETE FROM key_usage WHERE key = 'k1'")
        pg.execute(
            "UPDATE jobs SET state = 'SUCCEEDED', lease_owner = NULL,"
            " lease_expires_at = NULL, finished_at = now() WHERE job_id = %s",
            [head],
        )
        found = await wake_orphans(pool, OrphanWalk(), grace=0, size=100, worker_ttl=60)
    finally:
        await pool.close()
    assert sorted(job_id for job_id, _queue in found) == sorted([busy, behind])


async def test_the_metrics_count_the_jobs_waiting_for_their_key(
    pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    pg.execute(
        "INSERT INTO jobs (job_id, job_type, queue, key, key_limit, delay_reason)"
        " SELECT gen_random_uuid(), 't', 'mail', 'k' || g, 1,"
        " CASE WHEN g <= 3 THEN 'KEY_BUSY' ELSE 'KEY_ORDER' END"
        " FROM generate_series(1, 5) AS g"
    )
    scrape = await scrape_once(db_url, "test-keys-metrics")
    waits = "hybrid_jobs_jobs_waiting_for_key"
    assert scrape.value(waits, queue="mail", reason="KEY_BUSY") == 3
    assert scrape.value(waits, queue="mail", reason="KEY_ORDER") == 2


def _ordered_pair(pg: psycopg.Connection, head_columns: str, head_values: str) -> uuid.UUID:
    """An ordered key 'k' with a head made of the given columns and, behind it, a job
    turned down for its order (so without a wake-up); returns the one behind."""
    behind = uuid.uuid4()
    pg.execute(
        "INSERT INTO jobs (job_id, job_type, key, key_limit, key_order, key_seq"
        f"{head_columns}) VALUES (gen_random_uuid(), 't', 'k', 1, 'ordered', 1{head_values})"
    )
    pg.execute(
        "INSERT INTO jobs (job_id, job_type, key, key_limit, key_order, key_seq, delay_reason)"
        " VALUES (%s, 't', 'k', 1, 'ordered', 2, 'KEY_ORDER')",
        [behind],
    )
    return behind


def test_an_expired_head_wakes_the_job_behind_it(pg: psycopg.Connection) -> None:
    """The deadline sweep ends a head that never started: the next of its key must
    not wait for the orphan walk to notice."""
    behind = _ordered_pair(pg, ", expires_at", ", now() - interval '1 second'")
    ended = pg.execute(JOB_EXPIRE_WAITING, {"limit": 100}).fetchall()
    assert len(ended) == 1
    assert pg.execute("SELECT job_id FROM outbox WHERE sent_at IS NULL").fetchall() == [(behind,)]


def test_a_rejected_head_wakes_the_job_behind_it(engine: Engine, pg: psycopg.Connection) -> None:
    behind = _ordered_pair(pg, ", approval, run_after", ", 'REQUIRED', '9999-12-31'::timestamptz")
    head = pg.execute("SELECT job_id FROM jobs WHERE key_seq = 1").fetchone()[0]  # type: ignore[index]
    with Session(engine) as session, session.begin():
        outbox.reject(session, head, by="alice")
    assert job(pg, head)["state"] == "CANCELLED"
    assert pg.execute("SELECT job_id FROM outbox WHERE sent_at IS NULL").fetchall() == [(behind,)]


def test_a_debounced_job_takes_no_key(engine: Engine) -> None:
    with Session(engine) as session, session.begin(), pytest.raises(ValueError, match="no key"):
        outbox.enqueue(session, "t", {}, key="k", dedup_key="d", debounce=timedelta(seconds=1))
