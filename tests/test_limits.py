"""Deadlines, debounce and rate limits (issue 18), on the real services: the relay
and consumer commands as processes, and the claim statement itself."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.consumers.testing import JobRunner
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.relay.maintenance import expire_waiting
from tests.apps.limits import STARTS_TABLE
from tests.support.jobs import enqueue, job, until, wait_for_state, wait_until_all
from tests.support.processes import running

pytestmark = pytest.mark.timeout(120)

APP = ["--app", "tests.apps.limits"]
# What a handler's start may lag its claim by, more for one job than another.
HANDLER_LAG = 0.25
FAST = ["--sweep-interval", "0.3", "--poll-interval", "0.2"]


def started(pg: psycopg.Connection) -> list[uuid.UUID]:
    return [row[0] for row in pg.execute("SELECT job_id FROM starts ORDER BY at").fetchall()]


def test_an_expired_job_never_starts_and_ends_cancelled_expired(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    """One consumer slot, held by a 1.5 s job: five jobs due now with a deadline
    0.5 s away wait behind it and are woken past their deadline (the claim ends
    them); one delayed past its deadline is ended by the relay's sweep, since no
    claim looks at it before then; one with a deadline far off runs."""
    pg.execute(STARTS_TABLE)
    with (
        running("relay", FAST, env, "relay.started"),
        running("consumer", [*APP, "--concurrency", "1"], env, "consumer.started"),
    ):
        blocker = enqueue(engine, "stamp", {"seconds": 1.5})
        asyncio.run(wait_for_state(pg, blocker, "RUNNING"))
        late = [enqueue(engine, "stamp", {}, expires=timedelta(seconds=0.5)) for _ in range(5)]
        # Delayed past its deadline, as a retry's backoff can leave a job (enqueue
        # refuses to write one so): not due for a minute, so nothing claims it first.
        delayed = enqueue(
            engine, "stamp", {}, run_after=timedelta(seconds=60), expires=timedelta(seconds=90)
        )
        pg.execute(
            "UPDATE jobs SET expires_at = now() + interval '1 second' WHERE job_id = %s",
            [delayed],
        )
        kept = enqueue(engine, "stamp", {}, expires=timedelta(minutes=5))
        for job_id in [*late, delayed, kept]:
            asyncio.run(wait_for_state(pg, job_id, "CANCELLED", "SUCCEEDED", timeout=30))
        # every wake-up leaves the table: the ended jobs' with them, the ones sent for
        # jobs that ran at the relay's next settle (it must not be stopped before)
        asyncio.run(
            until(
                lambda: pg.execute("SELECT count(*) FROM outbox").fetchone() == (0,),
                "no wake-up left",
            )
        )
    assert set(started(pg)) == {blocker, kept}, "no expired job started"
    for job_id in [*late, delayed]:
        row = job(pg, job_id)
        assert (row["state"], row["last_error_code"], row["attempt_count"]) == (
            "CANCELLED",
            "EXPIRED",
            0,
        )
        assert row["started_at"] is None and row["finished_at"] >= row["expires_at"]
    with Session(engine) as session:
        why = outbox.explain(session, delayed)
    assert why.outcome == "CANCELLED" and why.last_error is not None
    assert why.last_error.code == "EXPIRED" and "deadline" in why.summary


async def test_the_claim_ends_a_job_woken_past_its_deadline(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """The claim itself refuses it, in the same statement: no attempt spent, its
    wake-ups gone, reported as EXPIRED."""
    registry = Registry()
    ran: list[uuid.UUID] = []

    @registry.handler("stamp")
    async def stamp(j: consumers.Job) -> None:
        ran.append(j.id)

    job_id = enqueue(engine, "stamp", {}, expires=timedelta(seconds=0.2))
    fresh = enqueue(engine, "stamp", {}, expires=timedelta(minutes=1))
    await asyncio.sleep(0.3)
    async with JobRunner(db_url, registry) as runner:
        claim = await runner.store.claim(
            [job_id, fresh],
            registry.claim_terms(),
            queues=registry.queues(),
            free_threads=1,
            worker_ttl=60,
        )
    assert claim.missed == {job_id: "EXPIRED"}
    assert [c.job_id for c in claim.claimed] == [fresh]
    row = job(pg, job_id)
    assert (row["state"], row["last_error_code"], row["attempt_count"]) == (
        "CANCELLED",
        "EXPIRED",
        0,
    )
    assert pg.execute("SELECT count(*) FROM outbox WHERE job_id = %s", [job_id]).fetchone() == (0,)


async def test_a_replayed_expired_job_runs(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """A job the relay ended for its deadline (CANCELLED, EXPIRED), replayed by an
    operator, runs: the replay drops the deadline it missed, so the relay's next
    round does not end it again. A job cancelled for another reason keeps its
    deadline through a replay."""
    registry = Registry()

    @registry.handler("stamp")
    async def stamp(j: consumers.Job) -> None:
        return None

    # delayed past its deadline (as a retry's backoff can leave a job; enqueue refuses
    # to write one so): no claim looks at it, the relay's sweep ends it
    missed = enqueue(
        engine, "stamp", {}, run_after=timedelta(minutes=1), expires=timedelta(minutes=2)
    )
    pg.execute(
        "UPDATE jobs SET expires_at = now() + interval '0.2 seconds' WHERE job_id = %s", [missed]
    )
    cancelled = enqueue(
        engine, "stamp", {}, run_after=timedelta(minutes=1), expires=timedelta(hours=1)
    )
    with Session(engine) as session, session.begin():
        assert outbox.request_cancel(session, cancelled) == "CANCELLED"
    deadline = job(pg, cancelled)["expires_at"]
    await asyncio.sleep(0.3)
    async with JobRunner(db_url, registry) as runner:
        assert await expire_waiting(runner.pool, batch=10) == 1
        row = job(pg, missed)
        assert (row["state"], row["last_error_code"]) == ("CANCELLED", "EXPIRED")
        with Session(engine) as session, session.begin():
            assert outbox.retry_job(session, missed, by="test") == "QUEUED"
            assert outbox.retry_job(session, cancelled, by="test") == "QUEUED"
        # the relay's next round finds nothing past its deadline
        assert await expire_waiting(runner.pool, batch=10) == 0
        assert job(pg, missed)["expires_at"] is None
        assert job(pg, cancelled)["expires_at"] == deadline
        ran = await runner.run_until_idle()
    assert sorted((r.job_id, r.state) for r in ran) == sorted(
        [(missed, "SUCCEEDED"), (cancelled, "SUCCEEDED")]
    )


def test_a_deadline_is_checked_before_anything_is_written(engine: Engine) -> None:
    with Session(engine) as session, pytest.raises(ValueError, match="expires must be"):
        from datetime import datetime

        outbox.enqueue(session, "stamp", {}, expires=datetime(2030, 1, 1))
    with Session(engine) as session, pytest.raises(TypeError, match="expires"):
        outbox.enqueue(session, "stamp", {}, expires=5)  # type: ignore[arg-type]


def test_ten_debounced_enqueues_in_a_row_run_one_job_with_the_last_payload(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    """Trailing edge: each enqueue moves the start to the debounce after it; all ten
    return the same job, which runs once, with the tenth payload. Once it has started,
    the key makes a new job."""
    pg.execute(STARTS_TABLE)
    window = timedelta(seconds=2)
    debounce = {"dedup_key": "reindex:42", "debounce": window}
    with (
        running("relay", FAST, env, "relay.started"),
        running("consumer", APP, env, "consumer.started"),
    ):
        ids = []
        returned = [time.monotonic()]
        for n in range(10):
            ids.append(enqueue(engine, "stamp", {"n": n}, **debounce))
            returned.append(time.monotonic())
            time.sleep(0.02)
        # The premise: each enqueue came well within the debounce of the one before
        # (it is what keeps the job from starting between them). A bound on each gap,
        # not on the ten together: on a loaded machine an enqueue took 0.1 s.
        gaps = [b - a for a, b in itertools.pairwise(returned)]
        assert max(gaps) < window.total_seconds() / 2, gaps
        assert len(set(ids)) == 1
        waiting = job(pg, ids[0])
        # Trailing edge: due the debounce after the last enqueue, not the first.
        assert waiting["run_after"] == waiting["updated_at"] + window
        assert waiting["run_after"] > waiting["created_at"] + window + timedelta(seconds=0.1)
        row = asyncio.run(wait_for_state(pg, ids[0], "SUCCEEDED", timeout=30))
        assert row["started_at"] >= waiting["run_after"]
        again = enqueue(engine, "stamp", {"n": 10}, **debounce)
        assert again != ids[0], "once started, the key makes a new job"
        asyncio.run(wait_for_state(pg, again, "SUCCEEDED", timeout=30))
    starts = pg.execute("SELECT job_id, payload FROM starts ORDER BY at").fetchall()
    assert starts == [(ids[0], {"n": 9}), (again, {"n": 10})]
    assert pg.execute("SELECT count(*) FROM jobs").fetchone() == (2,)


def test_debounce_never_moves_a_start_past_debounce_max(
    engine: Engine, pg: psycopg.Connection
) -> None:
    debounce = {
        "dedup_key": "k",
        "debounce": timedelta(seconds=30),
        "debounce_max": timedelta(seconds=45),
    }
    first = enqueue(engine, "stamp", {"n": 0}, **debounce)
    created = job(pg, first)["created_at"]
    pg.execute("UPDATE jobs SET debounce_until = created_at + interval '20 seconds'")
    again = enqueue(engine, "stamp", {"n": 1}, **debounce)
    row = job(pg, first)
    assert again == first and row["payload"] == {"n": 1}
    assert row["run_after"] == created + timedelta(seconds=20), "capped at debounce_until"
    (available_at,) = pg.execute("SELECT available_at FROM outbox").fetchone()
    assert available_at == row["run_after"], "its wake-up moved with it"
    # Two in one batch: the last wins, both get its id.
    with Session(engine) as session, session.begin():
        pair = outbox.enqueue_many(
            session,
            [
                outbox.NewJob("stamp", {"n": n}, dedup_key="k", debounce=timedelta(1))
                for n in (2, 3)
            ],
        )
    assert pair == [first, first] and job(pg, first)["payload"] == {"n": 3}
    with Session(engine) as session, pytest.raises(ValueError, match="dedup_key"):
        outbox.enqueue(session, "stamp", {}, debounce=timedelta(seconds=1))


def most_over_the_limit(times: list[float], burst: float, per_second: float) -> float:
    """The largest count of starts in a window [t_i, t_k] less burst + rate x t: at
    most 0 when every window keeps to the limit (windows that start and end at a
    start are the tightest)."""
    times = sorted(times)
    return max(
        (k - i + 1) - (burst + per_second * (times[k] - times[i]))
        for i in range(len(times))
        for k in range(i, len(times))
    )


def test_a_rate_limit_holds_across_two_consumer_processes(
    engine: Engine,
    pg: psycopg.Connection,
    env: dict[str, str],
) -> None:
    """10 per second, burst 3, shared by jobs that name the limit and jobs whose
    handler does, over two consumers of 10 slots each (far more room than the
    limit): every job runs once, and no window of starts exceeds 3 + 10 x t, by
    the claims' clock or by the handlers' own start times."""
    pg.execute(STARTS_TABLE)
    with Session(engine) as session, session.begin():
        outbox.set_rate_limit(session, "paced", rate=10, per=timedelta(seconds=1), burst=3)
    jobs = [outbox.NewJob("stamp", {}, rate_limit="paced") for _ in range(25)]
    jobs += [outbox.NewJob("paced", {}) for _ in range(25)]
    with (
        running("relay", FAST, env, "relay.started"),
        running("consumer", [*APP, "--concurrency", "10"], env, "consumer.started"),
        running("consumer", [*APP, "--concurrency", "10"], env, "consumer.started"),
    ):
        with Session(engine) as session, session.begin():
            outbox.enqueue_many(session, jobs)
        asyncio.run(wait_until_all(pg, "SUCCEEDED", 50, timeout=60))
    claimed = [
        row[0]
        for row in pg.execute("SELECT EXTRACT(EPOCH FROM started_at)::float8 FROM jobs").fetchall()
    ]
    ran = [row[0] for row in pg.execute("SELECT EXTRACT(EPOCH FROM at)::float8 FROM starts")]
    assert len(ran) == 50 and pg.execute("SELECT max(attempt_count) FROM jobs").fetchone() == (1,)
    print("over the limit", most_over_the_limit(claimed, 3, 10), most_over_the_limit(ran, 3, 10))
    assert most_over_the_limit(claimed, 3, 10) <= 1e-6, "exact, by the claims' clock"
    # A handler starts a moment after its claim commits, some later than others
    # (measured up to about 0.08 s here): its windows can shrink by that much.
    assert most_over_the_limit(ran, 3 + 10 * HANDLER_LAG, 10) <= 1e-6
    # It ran at the limit, not slower: 50 jobs, 3 at once and 47 at 10/s.
    assert max(claimed) - min(claimed) < 4.7 + 2.0
    limit = {r.name: r for r in [*_limits(engine)]}["paced"]
    assert limit.buckets == 1 and limit.tokens <= 3


def _limits(engine: Engine) -> list[outbox.RateLimit]:
    with Session(engine) as session:
        return outbox.rate_limits(session)


async def test_a_job_without_a_token_waits_for_its_own_token_spending_nothing(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """2 per second, burst 2: of five jobs woken at once two start; the other three
    are RATE_LIMITED with their wake-ups due one token apart (0.5 s, 1 s, 1.5 s),
    no attempt spent. A prefix limit gives each name its own bucket, made by the
    first claim that meets the name (its jobs come back 'locked', untouched, for the
    worker to try again at once)."""
    registry = Registry()

    @registry.handler("stamp")
    async def stamp(j: consumers.Job) -> None:
        return None

    with Session(engine) as session, session.begin():
        outbox.set_rate_limit(session, "api", rate=2, burst=2)
        outbox.set_rate_limit(session, "sms:*", rate=1, per=timedelta(minutes=1), burst=1)
    ids = [enqueue(engine, "stamp", {}, rate_limit="api") for _ in range(5)]
    sms = [enqueue(engine, "stamp", {}, rate_limit=f"sms:{c}") for c in ("a", "a", "b")]
    pg.execute("UPDATE outbox SET sent_at = now()")  # as the relay does when it wakes them
    async with JobRunner(db_url, registry) as runner:
        first = await runner.store.claim(
            ids + sms,
            registry.claim_terms(),
            queues=registry.queues(),
            free_threads=8,
            worker_ttl=60,
        )
        assert {first.missed[i] for i in sms} == {"locked"}
        assert {job(pg, i)["delay_reason"] for i in sms} == {None}
        again = await runner.store.claim(
            sms,
            registry.claim_terms(),
            queues=registry.queues(),
            free_threads=8,
            worker_ttl=60,
        )
    claimed = first.claimed + again.claimed
    assert len(claimed) == 4, "two of api, one each of sms:a and sms:b"
    missed = {i: why for i, why in first.missed.items() if i not in sms} | again.missed
    assert sorted(missed.values()) == ["RATE_LIMITED"] * 4
    claim = first
    limited = [i for i in ids if i in claim.missed]
    (refilled,) = pg.execute("SELECT refilled_at FROM rate_buckets WHERE name = 'api'").fetchone()
    due = [
        (row[0] - refilled).total_seconds()
        for row in pg.execute(
            "SELECT available_at FROM outbox WHERE job_id = ANY(%s) ORDER BY available_at",
            [limited],
        )
    ]
    assert due == pytest.approx([0.5, 1.0, 1.5], abs=0.01)
    for job_id in limited:
        row = job(pg, job_id)
        assert (row["attempt_count"], row["delay_reason"]) == (0, "RATE_LIMITED")
    with Session(engine) as session:
        why = outbox.explain(session, limited[0])
    blocker = why.blocker("RATE_LIMITED")
    assert blocker is not None and blocker.facts["rate_limit"] == "api"
    assert blocker.facts["next_token_at"] is not None
    # The claim spent the bucket: what it holds now is only what refilled since, at
    # 2 a second (bounded by the database's clock before and after the read, so a
    # slow machine does not fail it).
    (before,) = pg.execute("SELECT now()").fetchone()
    names = {r.name: r for r in _limits(engine)}
    (after,) = pg.execute("SELECT now()").fetchone()
    assert names["sms:*"].buckets == 2
    refill = [min(2.0, 2 * (t - refilled).total_seconds()) for t in (before, after)]
    assert refill[0] - 0.01 <= names["api"].tokens <= refill[1] + 0.01
    with Session(engine) as session, session.begin():
        assert outbox.remove_rate_limit(session, "sms:*")
    assert pg.execute("SELECT count(*) FROM rate_buckets").fetchone() == (1,)


async def test_a_name_under_two_prefixes_takes_the_longer_ones_limit(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """A name both 'sms:*' and 'sms:eu:*' cover is held to the longer prefix's limit,
    whatever else is set; an exact limit of its own beats both."""
    registry = Registry()

    @registry.handler("stamp")
    async def stamp(j: consumers.Job) -> None:
        return None

    with Session(engine) as session, session.begin():
        outbox.set_rate_limit(session, "sms:*", rate=1, per=timedelta(hours=1), burst=1)
        outbox.set_rate_limit(session, "sms:eu:*", rate=1, per=timedelta(hours=1), burst=3)
        outbox.set_rate_limit(session, "sms:eu:vip", rate=1, per=timedelta(hours=1), burst=2)
        for i in range(50):  # others the lookup must pass over
            outbox.set_rate_limit(session, f"sms:e{i}:*", rate=1, per=timedelta(hours=1))
    eu = [enqueue(engine, "stamp", {}, rate_limit="sms:eu:acme") for _ in range(4)]
    vip = [enqueue(engine, "stamp", {}, rate_limit="sms:eu:vip") for _ in range(4)]
    pg.execute("UPDATE outbox SET sent_at = now()")
    claimed: list[uuid.UUID] = []
    async with JobRunner(db_url, registry) as runner:
        for _ in range(2):  # the first meets sms:eu:acme's bucket unmade: 'locked'
            claim = await runner.store.claim(
                eu + vip,
                registry.claim_terms(),
                queues=registry.queues(),
                free_threads=8,
                worker_ttl=60,
            )
            claimed += [c.job_id for c in claim.claimed]
    assert len([i for i in claimed if i in eu]) == 3, "burst 3 of sms:eu:*, not 1 of sms:*"
    assert len([i for i in claimed if i in vip]) == 2, "burst 2 of its own limit"


def test_a_tenant_that_enqueues_faster_than_its_rate_gets_backpressure(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """5 per second: a second's worth goes in at once, the next is refused with a
    retry-after of about a token's time, and nothing of it is written; after that
    time it goes in. Another tenant is not affected, and a batch is all or nothing."""
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_enqueue_rate=5)
    with Session(engine) as session, session.begin():
        outbox.enqueue_many(session, [outbox.NewJob("stamp", {}, tenant="acme")] * 5)
    with pytest.raises(outbox.Backpressure) as refused:
        enqueue(engine, "stamp", {}, tenant="acme")
    assert refused.value.max_enqueue_rate == 5 and 0 < refused.value.retry_after <= 0.2
    enqueue(engine, "stamp", {}, tenant="globex")
    time.sleep(refused.value.retry_after + 0.01)
    enqueue(engine, "stamp", {}, tenant="acme")
    with pytest.raises(outbox.Backpressure):
        enqueue_many_of(engine, [outbox.NewJob("stamp", {}, tenant="acme")] * 6)
    counts = dict(pg.execute("SELECT tenant, count(*) FROM jobs GROUP BY tenant").fetchall())
    assert counts == {"acme": 6, "globex": 1}
    (limit,) = [t for t in tenant_limits(engine) if t.tenant == "acme"]
    assert limit.max_enqueue_rate == 5


def test_tenant_limits_reports_no_count_of_waiting_jobs_it_does_not_keep(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """Waiting jobs are counted (by the relay) only for tenants with a max_queued: a
    capped tenant with 4 waiting jobs and no max_queued says None, not 0, and so
    does one whose max_queued was removed after a count."""
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_running=1)
        outbox.set_tenant_limit(session, "globex", max_running=1, max_queued=10)
        outbox.enqueue_many(session, [outbox.NewJob("stamp", {}, tenant="acme")] * 4)
    (acme,) = [t for t in tenant_limits(engine) if t.tenant == "acme"]
    assert (acme.max_queued, acme.queued, acme.queued_at) == (None, None, None)
    # globex's count, as the relay's usage chore writes it; then its max_queued goes.
    pg.execute("UPDATE tenant_usage SET queued = 3, queued_at = now() WHERE tenant = 'globex'")
    (globex,) = [t for t in tenant_limits(engine) if t.tenant == "globex"]
    assert globex.queued == 3 and globex.queued_at is not None
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "globex", max_running=1)
    (globex,) = [t for t in tenant_limits(engine) if t.tenant == "globex"]
    assert (globex.queued, globex.queued_at) == (None, None)


def enqueue_many_of(engine: Engine, jobs: list[outbox.NewJob]) -> list[uuid.UUID]:
    with Session(engine) as session, session.begin():
        return outbox.enqueue_many(session, jobs)


def tenant_limits(engine: Engine) -> list[outbox.TenantLimit]:
    with Session(engine) as session:
        return outbox.tenant_limits(session)
