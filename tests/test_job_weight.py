"""A job's weight (enqueue's ``weight=``), as a gate: a job of weight N takes N of its
consumer's free slots, N of its tenant's cap and N of its type's concurrency limit;
a job turned down by one takes nothing from another; every end of its lease gives
the same N back and wakes as many waiters as fit; a job heavier than its consumer's
whole concurrency is turned down and explained; and a job of weight 1 pays for none
of it. Each test names what it guards."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers.outcome import Outcome
from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.consumers.store import NO_ROOM, NO_THREAD, JobStore, finish_params
from hybrid_jobs.consumers.testing import run_jobs
from hybrid_jobs.jobctl.check import check, violations
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.queries import WORKER_TTL_SECONDS
from tests.support.jobs import enqueue, job, versions
from tests.support.metrics import scrape_once

_REGISTRY = Registry()


@_REGISTRY.handler("noop", max_attempts=3)
async def _noop(job: consumers.Job) -> None:
    return None


@_REGISTRY.handler("limited", global_limit=4, max_attempts=3)
async def _limited(job: consumers.Job) -> None:
    return None


@_REGISTRY.handler("render", weight=3, max_attempts=3)
async def _render(job: consumers.Job) -> None:
    return None


@_REGISTRY.handler("plain", max_attempts=3)
def _plain(job: consumers.Job) -> None:
    return None


def _params(
    ids: list[uuid.UUID],
    worker: str = "w1",
    *,
    concurrency: int = 10,
    free: int | None = None,
    threads: int = 0,
) -> dict[str, Any]:
    return {
        "job_ids": list(ids),
        "types": json.dumps(_REGISTRY.claim_terms()),
        "free_threads": threads,
        "concurrency": concurrency,
        "free_slots": concurrency if free is None else free,
        "worker": worker,
        "lease_seconds": 30,
        "worker_ttl": WORKER_TTL_SECONDS,
        "tenants": [],
        "queues": _REGISTRY.queues(),
    }


def _claim(
    pg: psycopg.Connection,
    ids: list[uuid.UUID],
    worker: str = "w1",
    *,
    concurrency: int = 10,
    free: int | None = None,
    threads: int = 0,
) -> dict[uuid.UUID, str]:
    # sent, as the relay marks its wake-ups: the claim then uses them up
    pg.execute("UPDATE outbox SET sent_at = now() WHERE job_id = ANY(%s)", [ids])
    rows = pg.execute(
        q.JOB_CLAIM_MANY,
        _params(ids, worker, concurrency=concurrency, free=free, threads=threads),
    ).fetchall()
    return {row[1]: row[0] for row in rows}


def _one(pg: psycopg.Connection, sql: str, *args: Any) -> Any:
    row = pg.execute(sql, list(args)).fetchone()
    assert row is not None
    return row[0]


def _tenant_running(pg: psycopg.Connection, tenant: str = "acme") -> int:
    return int(_one(pg, "SELECT running FROM tenant_usage WHERE tenant = %s", tenant))


def _limit_running(pg: psycopg.Connection) -> int:
    return int(_one(pg, "SELECT running FROM concurrency_limits WHERE job_type = 'limited'"))


def _pending(pg: psycopg.Connection, job_id: uuid.UUID) -> int:
    return int(
        _one(pg, "SELECT count(*) FROM outbox WHERE job_id = %s AND sent_at IS NULL", job_id)
    )


def _wrong(db_url: DatabaseUrl) -> dict[str, int]:
    """What ``jobctl check`` finds wrong, but the jobs still waiting or running (it
    counts them as lost: these tests stop before they end)."""
    found = violations(check(db_url.conninfo))
    found.pop("lost", None)
    return found


def _cap(engine: Engine, max_running: int, tenant: str = "acme") -> None:
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, tenant, max_running=max_running)


def _record_limits(pg: psycopg.Connection) -> None:
    pg.execute(
        q.CONCURRENCY_LIMIT_RECORD_MANY,
        {"limits": json.dumps(_REGISTRY.limits()), "worker": "w0"},
    )


# ------------------------------------------------------------------ enqueue


def test_a_weight_of_one_is_stored_as_null_and_a_heavier_one_as_given(
    engine: Engine, pg: psycopg.Connection
) -> None:
    light = enqueue(engine, "noop")
    also_light = enqueue(engine, "noop", weight=1)
    heavy = enqueue(engine, "noop", weight=3)
    assert [job(pg, i)["weight"] for i in (light, also_light, heavy)] == [None, None, 3]


@pytest.mark.parametrize("bad", [0, -1, 101, True, 1.5, "3"])
def test_a_weight_is_an_int_from_one_to_the_bound(engine: Engine, bad: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="weight"):
        enqueue(engine, "noop", weight=bad)


def test_the_table_refuses_a_weight_out_of_range(engine: Engine, pg: psycopg.Connection) -> None:
    job_id = enqueue(engine, "noop")
    with pytest.raises(psycopg.errors.CheckViolation):
        pg.execute("UPDATE jobs SET weight = 1 WHERE job_id = %s", [job_id])


def test_a_handlers_with_options_carries_the_weight(engine: Engine, pg: psycopg.Connection) -> None:
    registry = Registry()

    @registry.handler("render")
    async def render(job: consumers.Job) -> None: ...

    with Session(engine) as session, session.begin():
        job_id = render.with_options(weight=4).enqueue(session, {})
    assert job(pg, job_id)["weight"] == 4


# ------------------------------------------------------------------ tenant caps


def test_a_tenant_with_cap_four_runs_a_weight_three_and_a_weight_one_job_not_two_threes(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _cap(engine, 4)
    heavy = enqueue(engine, "noop", tenant="acme", weight=3)
    light = enqueue(engine, "noop", tenant="acme")
    assert _claim(pg, [heavy, light]) == {heavy: "claimed", light: "claimed"}
    assert _tenant_running(pg) == 4
    second = enqueue(engine, "noop", tenant="acme", weight=3)
    assert _claim(pg, [second], "w2") == {second: "TENANT_CAP"}
    assert _tenant_running(pg) == 4
    # its wake-up comes back a moment later, not at once: the relay sends a capped
    # tenant's wake-up as soon as one slot is free, and it needs three
    due_in = _one(
        pg, "SELECT available_at - now() FROM outbox WHERE job_id = %s AND sent_at IS NULL", second
    )
    assert due_in > timedelta(0)


def test_two_weight_three_jobs_in_one_claim_take_only_what_the_cap_holds(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _cap(engine, 4)
    ids = [enqueue(engine, "noop", tenant="acme", weight=3) for _ in range(2)]
    got = _claim(pg, ids)
    assert sorted(got.values()) == ["TENANT_CAP", "claimed"]
    assert _tenant_running(pg) == 3


def test_a_job_heavier_than_its_tenants_free_slots_is_explained(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _cap(engine, 4)
    holder = enqueue(engine, "noop", tenant="acme", weight=2)
    assert _claim(pg, [holder]) == {holder: "claimed"}
    waiting = enqueue(engine, "noop", tenant="acme", weight=3)
    assert _claim(pg, [waiting]) == {waiting: "TENANT_CAP"}
    with Session(engine) as session:
        why = outbox.explain(session, waiting)
    assert why.blocker("TENANT_CAP").facts == {  # type: ignore[union-attr]
        "tenant": "acme",
        "running": 2,
        "max_running": 4,
        "weight": 3,
    }
    assert "weighs 3" in why.summary, why.summary


# ------------------------------------------------------------------ concurrency limits


def test_a_concurrency_limit_counts_each_job_for_its_weight(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _record_limits(pg)
    heavy = enqueue(engine, "limited", weight=3)
    assert _claim(pg, [heavy]) == {heavy: "claimed"}
    assert _limit_running(pg) == 3
    too_much = enqueue(engine, "limited", weight=2)
    assert _claim(pg, [too_much], "w2") == {too_much: "CONCURRENCY_LIMIT"}
    # fewer free slots than it weighs: it waits, without a wake-up, for an end
    assert _pending(pg, too_much) == 0
    light = enqueue(engine, "limited")
    assert _claim(pg, [light], "w2") == {light: "claimed"}
    assert _limit_running(pg) == 4


def test_a_job_the_tenant_cap_turns_down_takes_nothing_of_the_limit(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _record_limits(pg)
    _cap(engine, 2)
    heavy = enqueue(engine, "limited", tenant="acme", weight=3)
    assert _claim(pg, [heavy]) == {heavy: "TENANT_CAP"}
    assert _limit_running(pg) == 0
    assert _tenant_running(pg) == 0
    assert not job(pg, heavy)["limit_held"]


def test_a_job_the_limit_turns_down_takes_nothing_of_its_tenant(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _record_limits(pg)
    _cap(engine, 10)
    holder = enqueue(engine, "limited", weight=3)
    assert _claim(pg, [holder]) == {holder: "claimed"}
    heavy = enqueue(engine, "limited", tenant="acme", weight=2)
    assert _claim(pg, [heavy]) == {heavy: "CONCURRENCY_LIMIT"}
    assert _tenant_running(pg) == 0


def test_the_end_of_a_heavy_lease_wakes_the_waiters_that_fit_the_freed_slots(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _record_limits(pg)
    holder = enqueue(engine, "limited", weight=4)
    assert _claim(pg, [holder]) == {holder: "claimed"}
    waiting = [enqueue(engine, "limited") for _ in range(5)]
    assert set(_claim(pg, waiting, "w2").values()) == {"CONCURRENCY_LIMIT"}
    generation = job(pg, holder)["lease_generation"]
    pg.execute(q.JOB_FINISH_MANY, finish_params("w1", [(holder, generation, Outcome.succeeded())]))
    assert _limit_running(pg) == 0
    # four slots came back: four waiters woken, the oldest
    woken = [w for w in waiting if _pending(pg, w)]
    assert woken == sorted(waiting)[:4]
    assert set(_claim(pg, woken, "w2").values()) == {"claimed"}
    assert _limit_running(pg) == 4


def test_a_waiter_heavier_than_the_freed_slots_does_not_take_a_lighter_ones_turn(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _record_limits(pg)
    big, small = (enqueue(engine, "limited", weight=w) for w in (3, 1))
    assert _claim(pg, [big, small]) == {big: "claimed", small: "claimed"}
    heavy_waiter = enqueue(engine, "limited", weight=2)
    light_waiter = enqueue(engine, "limited")
    assert set(_claim(pg, [heavy_waiter, light_waiter], "w2").values()) == {"CONCURRENCY_LIMIT"}
    generation = job(pg, small)["lease_generation"]
    pg.execute(q.JOB_FINISH_MANY, finish_params("w1", [(small, generation, Outcome.succeeded())]))
    # one slot free: the waiter of weight 2 could not use it; the one of weight 1 can
    assert (_pending(pg, heavy_waiter), _pending(pg, light_waiter)) == (0, 1)


def test_a_woken_waiter_that_ends_before_it_ran_passes_its_turn_to_one_that_fits(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _record_limits(pg)
    big, small = (enqueue(engine, "limited", weight=w) for w in (3, 1))
    assert _claim(pg, [big, small]) == {big: "claimed", small: "claimed"}
    first, middle, last = sorted(enqueue(engine, "limited") for _ in range(3))
    pg.execute("UPDATE jobs SET weight = 2 WHERE job_id = %s", [middle])
    assert set(_claim(pg, [first, middle, last], "w2").values()) == {"CONCURRENCY_LIMIT"}
    generation = job(pg, small)["lease_generation"]
    pg.execute(q.JOB_FINISH_MANY, finish_params("w1", [(small, generation, Outcome.succeeded())]))
    assert [_pending(pg, w) for w in (first, middle, last)] == [1, 0, 0]
    with Session(engine) as session, session.begin():
        outbox.request_cancel(session, first)
    # one slot is free: the turn passes over the waiter of weight 2 to the next
    assert (_pending(pg, middle), _pending(pg, last)) == (0, 1)


# ------------------------------------------------------------------ every end gives N back


@pytest.mark.parametrize(
    "ending", ["succeeded", "failed", "retry", "cancelled", "snoozed", "expired", "given_back"]
)
def test_every_end_of_a_heavy_lease_gives_back_exactly_its_weight(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, ending: str
) -> None:
    _record_limits(pg)
    _cap(engine, 6)
    heavy = enqueue(engine, "limited", tenant="acme", weight=3)
    light = enqueue(engine, "limited", tenant="acme")
    assert _claim(pg, [heavy, light]) == {heavy: "claimed", light: "claimed"}
    assert (_tenant_running(pg), _limit_running(pg)) == (4, 4)
    generation = job(pg, heavy)["lease_generation"]
    if ending == "expired":
        pg.execute(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = %s",
            [heavy],
        )
        swept = pg.execute(q.JOB_SWEEP_EXPIRED, {"limit": 100, "default_backoff": 1.0}).fetchall()
        assert [row[0] for row in swept] == [heavy]
    elif ending == "given_back":
        fences = json.dumps([{"job_id": str(heavy), "generation": generation}])
        rows = pg.execute(q.JOB_GIVE_BACK_MANY, {"jobs": fences, "worker": "w1"}).fetchall()
        assert [row[1] for row in rows] == ["QUEUED"]
    else:
        outcome = {
            "succeeded": Outcome.succeeded(),
            "failed": Outcome.failed("BAD_INPUT", "no"),
            "retry": Outcome.retry("RuntimeError", "again", 5.0),
            "cancelled": Outcome.cancelled("asked to"),
            "snoozed": Outcome.snoozed(5.0),
        }[ending]
        # composed of what the lease holds, as the consumer's store composes it
        statement = q.job_finish_many({"concurrency", "weight"})
        rows = pg.execute(statement, finish_params("w1", [(heavy, generation, outcome)])).fetchall()
        assert len(rows) == 1 and rows[0][1] not in ("LOCKED", "full"), rows
    assert (_tenant_running(pg), _limit_running(pg)) == (1, 1)
    assert not job(pg, heavy)["limit_held"] and not job(pg, heavy)["holds_slot"]
    assert _wrong(db_url) == {}


def test_the_plain_outcome_leaves_a_heavy_lease_for_the_one_composed_with_its_weight(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _cap(engine, 4)
    heavy = enqueue(engine, "noop", tenant="acme", weight=3)
    assert _claim(pg, [heavy]) == {heavy: "claimed"}
    generation = job(pg, heavy)["lease_generation"]
    params = finish_params("w1", [(heavy, generation, Outcome.succeeded())])
    assert pg.execute(q.JOB_FINISH_PLAIN_MANY, params).fetchall() == [(heavy, "full")]
    assert _tenant_running(pg) == 3
    assert pg.execute(q.JOB_FINISH_MANY, params).fetchall() == [(heavy, "SUCCEEDED")]
    assert _tenant_running(pg) == 0


def test_a_stale_outcome_of_an_expired_heavy_holder_gives_back_nothing_more(
    engine: Engine, pg: psycopg.Connection
) -> None:
    _cap(engine, 4)
    heavy = enqueue(engine, "noop", tenant="acme", weight=3)
    assert _claim(pg, [heavy]) == {heavy: "claimed"}
    generation = job(pg, heavy)["lease_generation"]
    pg.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 second'")
    pg.execute(q.JOB_SWEEP_EXPIRED, {"limit": 100, "default_backoff": 0.0})
    assert _tenant_running(pg) == 0
    other = enqueue(engine, "noop", tenant="acme", weight=2)
    assert _claim(pg, [other], "w2") == {other: "claimed"}
    rows = pg.execute(
        q.JOB_FINISH_MANY, finish_params("w1", [(heavy, generation, Outcome.succeeded())])
    ).fetchall()
    assert rows == []
    assert _tenant_running(pg) == 2


def test_jobctl_check_counts_a_heavy_lease_for_its_weight(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    _record_limits(pg)
    _cap(engine, 4)
    heavy = enqueue(engine, "limited", tenant="acme", weight=3)
    assert _claim(pg, [heavy]) == {heavy: "claimed"}
    assert _wrong(db_url) == {}
    pg.execute("UPDATE tenant_usage SET running = 1 WHERE tenant = 'acme'")
    assert violations(check(db_url.conninfo))["slots_leaked_or_released_twice"] == 2


# ------------------------------------------------------------------ the consumer's slots


def test_a_job_heavier_than_the_free_slots_is_not_claimed_and_not_written(
    engine: Engine, pg: psycopg.Connection
) -> None:
    heavy = enqueue(engine, "noop", weight=3)
    before = versions(pg, [heavy])
    assert _claim(pg, [heavy], free=2) == {heavy: NO_ROOM}
    assert versions(pg, [heavy]) == before
    assert _claim(pg, [heavy], free=3) == {heavy: "claimed"}


def test_a_plain_functions_job_short_of_slots_waits_for_them_not_for_a_thread(
    engine: Engine, pg: psycopg.Connection
) -> None:
    # told 'no_thread', the consumer would send it away and let lighter jobs take
    # the slots it needs; told 'no_room', it holds them for it as they free
    heavy = enqueue(engine, "plain", weight=3)
    assert _claim(pg, [heavy], free=2, threads=4) == {heavy: NO_ROOM}
    assert _claim(pg, [heavy], free=2, threads=0) == {heavy: NO_ROOM}
    # room for it, but no free thread: that is the threads' answer
    assert _claim(pg, [heavy], free=3, threads=0) == {heavy: NO_THREAD}
    assert _claim(pg, [heavy], free=3, threads=1) == {heavy: "claimed"}


def test_a_plain_functions_job_the_batch_left_no_room_for_is_told_no_room(
    engine: Engine, pg: psycopg.Connection
) -> None:
    first, second = sorted(enqueue(engine, "plain", weight=2) for _ in range(2))
    assert _claim(pg, [first, second], free=3, threads=4) == {first: "claimed", second: NO_ROOM}


def test_a_batch_takes_no_more_weight_than_the_free_slots(
    engine: Engine, pg: psycopg.Connection
) -> None:
    ids = [enqueue(engine, "noop", weight=2) for _ in range(3)]
    got = _claim(pg, ids, free=5)
    assert sorted(got.values()) == ["claimed", "claimed", NO_ROOM]


def test_a_job_heavier_than_the_whole_concurrency_is_turned_down_and_explained(
    engine: Engine, pg: psycopg.Connection
) -> None:
    heavy = enqueue(engine, "noop", weight=5)
    assert _claim(pg, [heavy], concurrency=4) == {heavy: "WEIGHT_OVER_CONCURRENCY"}
    row = job(pg, heavy)
    assert (row["delay_reason"], row["attempt_count"]) == ("WEIGHT_OVER_CONCURRENCY", 0)
    # it asks again after the backstop, not round and round the same consumers
    due_in = _one(
        pg, "SELECT available_at - now() FROM outbox WHERE job_id = %s AND sent_at IS NULL", heavy
    )
    assert due_in > timedelta(seconds=5)
    pg.execute(
        "INSERT INTO workers (worker_id, host, pid, queues, job_types, concurrency, prefetch)"
        " VALUES ('small', 'here', 1, '{default}', '{noop}', 4, 0)"
    )
    with Session(engine) as session:
        why = outbox.explain(session, heavy)
    assert why.blocker("WEIGHT_OVER_CONCURRENCY").facts == {  # type: ignore[union-attr]
        "weight": 5,
        "largest_concurrency": 4,
    }
    assert "--concurrency" in why.summary, why.summary


def test_a_consumer_with_room_for_a_heavy_job_brings_its_wake_up_forward_when_it_starts(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """A job turned down as heavier than its consumer asks again after the refusal
    backstop. A consumer that starts with room for it (JOB_WAKE_HEAVY, as it starts
    or comes back) makes its wake-up due at once; one still too small, or serving
    other queues or types, does not, and a lighter job's wake-up is left alone."""
    heavy = enqueue(engine, "noop", weight=5)
    heavier = enqueue(engine, "noop", weight=8)
    assert _claim(pg, [heavy, heavier], concurrency=4) == {
        heavy: "WEIGHT_OVER_CONCURRENCY",
        heavier: "WEIGHT_OVER_CONCURRENCY",
    }
    light = enqueue(engine, "noop", run_after=timedelta(minutes=5))

    def due(job_id: uuid.UUID) -> bool:
        return bool(_one(pg, "SELECT available_at <= now() FROM outbox WHERE job_id = %s", job_id))

    def start(queues: list[str], job_types: list[str], concurrency: int) -> set[uuid.UUID]:
        rows = pg.execute(
            q.JOB_WAKE_HEAVY,
            {"queues": queues, "job_types": job_types, "concurrency": concurrency},
        ).fetchall()
        return {row[0] for row in rows}

    assert start(["default"], ["noop"], 4) == set(), "still too small for either"
    assert start(["other"], ["noop"], 6) == set() and start(["default"], ["x"], 6) == set()
    assert not due(heavy) and not due(heavier)
    assert start(["default"], ["noop"], 6) == {heavy}, "room for the one of weight 5"
    assert due(heavy) and not due(heavier) and not due(light)
    assert _one(pg, "SELECT count(*) FROM outbox WHERE job_id = %s", heavy) == 1
    # its claim by the larger consumer takes it
    assert _claim(pg, [heavy], "w2", concurrency=6) == {heavy: "claimed"}
    assert start(["default"], ["noop"], 8) == {heavier}


def test_a_heavy_job_turned_down_while_a_larger_consumer_is_live_is_sent_again_at_once(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """Its wake-up may reach a consumer too small for it while a larger one serves
    the queue: turned down, it is due again at once (for the larger one); turned
    down again within a second, a second later, so that small consumers cannot pass
    it round and round. With no larger consumer live, after the backstop."""
    pg.execute(
        "INSERT INTO workers (worker_id, host, pid, queues, job_types, concurrency, prefetch)"
        " VALUES ('big', 'here', 2, '{default}', '{noop}', 6, 0)"
    )
    heavy = enqueue(engine, "noop", weight=5)
    assert _claim(pg, [heavy], concurrency=4) == {heavy: "WEIGHT_OVER_CONCURRENCY"}
    due_in = _one(
        pg, "SELECT available_at - now() FROM outbox WHERE job_id = %s AND sent_at IS NULL", heavy
    )
    assert due_in <= timedelta(0), "due at once: a live consumer has room for it"
    assert _claim(pg, [heavy], "w3", concurrency=4) == {heavy: "WEIGHT_OVER_CONCURRENCY"}
    due_in = _one(
        pg, "SELECT available_at - now() FROM outbox WHERE job_id = %s AND sent_at IS NULL", heavy
    )
    assert timedelta(0) < due_in <= timedelta(seconds=1), "twice in a second: a second on"
    pg.execute(
        "UPDATE workers SET last_seen_at = now() - interval '1 hour' WHERE worker_id = 'big'"
    )
    pg.execute(
        "UPDATE jobs SET delay_since = now() - interval '1 minute' WHERE job_id = %s", [heavy]
    )
    assert _claim(pg, [heavy], "w4", concurrency=4) == {heavy: "WEIGHT_OVER_CONCURRENCY"}
    due_in = _one(
        pg, "SELECT available_at - now() FROM outbox WHERE job_id = %s AND sent_at IS NULL", heavy
    )
    assert due_in > timedelta(seconds=5), "no larger consumer live: the backstop"
    assert _claim(pg, [heavy], "big", concurrency=6) == {heavy: "claimed"}


async def test_the_metrics_count_the_jobs_heavier_than_their_consumer(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    heavy = enqueue(engine, "noop", weight=5)
    assert _claim(pg, [heavy], concurrency=4) == {heavy: "WEIGHT_OVER_CONCURRENCY"}
    scrape = await scrape_once(db_url, "test-weight-metrics")
    assert scrape.value("hybrid_jobs_jobs_waiting_for_larger_consumer", queue="default") == 1


async def test_the_store_claims_a_heavy_job_through_the_gate_and_knows_its_weight(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    _cap(engine, 8)
    plain = enqueue(engine, "noop", tenant="acme")
    heavy = enqueue(engine, "noop", tenant="acme", weight=3)
    too_heavy_now = enqueue(engine, "noop", tenant="acme", weight=3)
    async with AsyncConnectionPool(
        db_url.conninfo, min_size=1, max_size=2, connection_class=AsyncConnection, open=False
    ) as pool:
        store = JobStore(pool, "w1", 30)
        got = await store.claim(
            [plain, heavy, too_heavy_now],
            _REGISTRY.claim_terms(),
            queues=_REGISTRY.queues(),
            free_threads=0,
            worker_ttl=WORKER_TTL_SECONDS,
            free_slots=4,
            concurrency=4,
        )
        claimed = {c.job_id: c for c in got.claimed}
        # the plain claim took the plain job's one slot; three were left for the rest
        assert set(claimed) == {plain, heavy}
        assert (claimed[plain].weight, claimed[heavy].weight) == (1, 3)
        assert claimed[heavy].gates == frozenset({"weight"})
        assert got.missed == {too_heavy_now: NO_ROOM}
        assert _tenant_running(pg) == 4
        finished = await store.finish(
            [(heavy, claimed[heavy].generation, Outcome.succeeded())], claimed[heavy].gates
        )
        assert set(finished.applied.values()) == {"SUCCEEDED"}
    assert _tenant_running(pg) == 1


@pytest.mark.parametrize("bad", [0, 101, True, 2.0])
def test_a_handlers_weight_is_an_int_from_one_to_the_bound(bad: Any) -> None:
    with pytest.raises(ValueError, match="weight"):
        Registry().handler("t", weight=bad)


async def test_a_handlers_weight_applies_to_its_jobs_enqueued_without_one(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    _cap(engine, 5)
    plain, own, second = (
        enqueue(engine, "render", tenant="acme", **w) for w in ({}, {"weight": 2}, {})
    )
    async with AsyncConnectionPool(
        db_url.conninfo, min_size=1, max_size=2, connection_class=AsyncConnection, open=False
    ) as pool:
        store = JobStore(pool, "w1", 30)

        async def claim(ids: list[uuid.UUID]) -> Any:
            return await store.claim(
                ids,
                _REGISTRY.claim_terms(),
                queues=_REGISTRY.queues(),
                free_threads=0,
                worker_ttl=WORKER_TTL_SECONDS,
            )

        got = await claim([plain, own])
        # the handler's 3 for the job without a weight, the job's own 2 for the other
        claimed = {c.job_id: c for c in got.claimed}
        assert {i: c.weight for i, c in claimed.items()} == {plain: 3, own: 2}
        assert claimed[plain].gates == frozenset({"weight"})
        assert _tenant_running(pg) == 5
        # fixed on the job at its claim, so that every end gives back as much
        assert job(pg, plain)["weight"] == 3
        assert (await claim([second])).missed == {second: "TENANT_CAP"}
        finished = await store.finish(
            [(plain, claimed[plain].generation, Outcome.succeeded())], claimed[plain].gates
        )
        assert set(finished.applied.values()) == {"SUCCEEDED"}
    assert _tenant_running(pg) == 2
    assert _wrong(db_url) == {}


def test_the_in_process_runner_runs_every_due_heavy_job_in_one_call(
    engine: Engine, db_url: DatabaseUrl
) -> None:
    ids = [enqueue(engine, "noop", weight=40) for _ in range(3)]
    ran = run_jobs(db_url, _REGISTRY)
    assert sorted((r.job_id, r.state) for r in ran) == sorted((i, "SUCCEEDED") for i in ids)


# ------------------------------------------------------------------ pay for what you use


def test_a_job_of_weight_one_pays_for_none_of_it() -> None:
    # the plain claim and the plain outcome only pass weighed jobs on (a test of the
    # column, as for every other gate), and count nothing by weight
    # (the test, and the gate named for the whole claim: "WHEN j.weight ... 'weight'")
    assert q.JOB_CLAIM_PLAIN_MANY.count("weight") == 3
    assert "j.weight IS NULL" in q.JOB_CLAIM_PLAIN_MANY
    assert q.JOB_FINISH_PLAIN_MANY.count("weight") == 2  # the guard, and its answer
    for statement in (q.JOB_CLAIM_PLAIN_MANY, q.JOB_FINISH_PLAIN_MANY):
        assert "free_slots" not in statement and "sum(" not in statement
    # and a claim composed for another gate counts no slot of this worker's
    assert "free_slots" not in q.job_claim_many({"key"})
    assert "sum(COALESCE(j.weight" not in q.job_finish_many({"key"})
