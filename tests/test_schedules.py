"""Recurring schedules on the real services: the producer API, firing (each
occurrence once, under two relays and across a relay killed mid-fire), catch-up
after downtime, retention, and bad input refused with nothing written."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.plumbing.db import make_pool
from hybrid_jobs.relay.schedules import fire_due
from hybrid_jobs.schema.topology import Topology
from tests.support import inproc
from tests.support.inproc import consumer_running
from tests.support.processes import running

SECOND = timedelta(seconds=1)


def schedule(engine: Engine, name: str = "s", job_type: str = "tick", **kw: Any) -> datetime:
    with Session(engine) as session, session.begin():
        return outbox.schedule(session, name, job_type, {"from": name}, **kw)


def db_now(pg: psycopg.Connection) -> datetime:
    return pg.execute("SELECT now()").fetchone()[0]  # type: ignore[index]


def move_next_fire(pg: psycopg.Connection, name: str, at: datetime) -> None:
    pg.execute("UPDATE schedules SET next_fire_at = %s WHERE name = %s", [at, name])


def row(pg: psycopg.Connection, name: str) -> dict[str, Any]:
    cur = pg.execute("SELECT * FROM schedules WHERE name = %s", [name])
    names = [d.name for d in cur.description or []]
    found = cur.fetchone()
    assert found is not None, f"no schedule {name}"
    return dict(zip(names, found, strict=True))


def ledger(pg: psycopg.Connection, name: str = "s") -> list[dict[str, Any]]:
    cur = pg.execute(
        "SELECT scheduled_for, fired_at, delay_seconds, outcome, skip_reason, job_id "
        "FROM schedule_fires WHERE schedule_name = %s ORDER BY scheduled_for",
        [name],
    )
    names = [d.name for d in cur.description or []]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def schedule_count(pg: psycopg.Connection) -> int:
    return pg.execute("SELECT count(*) FROM schedules").fetchone()[0]  # type: ignore[index]


def floor_to(at: datetime, step: timedelta) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return epoch + (at - epoch) // step * step


def assert_each_once(pg: psycopg.Connection, name: str, step: timedelta) -> list[datetime]:
    """The ledger holds each occurrence from its first to its last exactly once, each
    with its own job (and wake-up) whose dedup key names the occurrence."""
    fires = ledger(pg, name)
    instants = [f["scheduled_for"] for f in fires]
    assert instants, "nothing fired"
    expected = [instants[0] + i * step for i in range(len(instants))]
    assert instants == expected, f"gaps or repeats: {instants}"
    assert all(f["outcome"] == "enqueued" for f in fires)
    jobs = pg.execute(
        "SELECT j.job_id, j.dedup_key, count(o.id) FROM jobs j "
        "LEFT JOIN outbox o USING (job_id) GROUP BY j.job_id"
    ).fetchall()
    by_id = {job_id: (key, wakeups) for job_id, key, wakeups in jobs}
    assert len(jobs) == len(fires), "a job per occurrence, and no other"
    for f in fires:
        key, wakeups = by_id[f["job_id"]]
        assert key == f"schedule:{name}@{f['scheduled_for'].astimezone(UTC).isoformat()}"
        assert wakeups == 1
    return instants


async def wait_for(
    check: Callable[[], bool], what: str, timeout: float = 30, interval: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(interval)


# ------------------------------------------------------------------- producer API


def test_schedule_counts_from_the_database_clock(engine: Engine, pg: psycopg.Connection) -> None:
    before = db_now(pg)
    next_fire = schedule(engine, every=timedelta(seconds=10), queue="reports", priority=3)
    after = db_now(pg)
    assert next_fire.timestamp() % 10 == 0
    assert before < next_fire <= after + timedelta(seconds=10)
    stored = row(pg, "s")
    assert stored["next_fire_at"] == next_fire
    assert stored["every_seconds"] == 10.0 and stored["cron"] is None
    assert (stored["queue"], stored["priority"], stored["catchup"]) == ("reports", 3, "latest")
    assert stored["payload"] == {"from": "s"} and not stored["paused"]


def test_an_update_keeps_its_place_unless_the_rule_changes(
    engine: Engine, pg: psycopg.Connection
) -> None:
    schedule(engine, cron="0 3 * * *", timezone="Europe/Berlin")
    # Where a relay left it: an occurrence that is due and not yet fired.
    due = floor_to(db_now(pg), SECOND) - timedelta(seconds=5)
    move_next_fire(pg, "s", due)
    assert schedule(engine, cron="0 3 * * *", timezone="Europe/Berlin", priority=7) == due
    assert row(pg, "s")["priority"] == 7
    # A new zone is a new rule: counted from now, 03:00 in Tokyo.
    moved = schedule(engine, cron="0 3 * * *", timezone="Asia/Tokyo")
    assert moved > db_now(pg)
    assert moved.astimezone(UTC).hour == 18 and moved.minute == 0  # 03:00 JST
    assert row(pg, "s")["timezone"] == "Asia/Tokyo"


def test_nothing_is_written_when_the_transaction_rolls_back(
    engine: Engine, pg: psycopg.Connection
) -> None:
    with Session(engine) as session:
        outbox.schedule(session, "s", "tick", every=timedelta(minutes=1))
        session.rollback()
    assert schedule_count(pg) == 0


async def test_pause_stops_firing_and_resume_does_not_backfill(
    engine: Engine, pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection]
) -> None:
    schedule(engine, every=SECOND)
    with Session(engine) as session, session.begin():
        assert outbox.pause_schedule(session, "s") is True
        assert outbox.pause_schedule(session, "nope") is False
    move_next_fire(pg, "s", db_now(pg) - timedelta(seconds=30))
    assert await fire_due(pool) == 0
    assert ledger(pg) == []
    with Session(engine) as session, session.begin():
        resumed = outbox.resume_schedule(session, "s")
        assert outbox.resume_schedule(session, "nope") is None
    assert resumed is not None and resumed > db_now(pg) - SECOND
    assert row(pg, "s")["next_fire_at"] == resumed and not row(pg, "s")["paused"]
    # The 30 seconds of pause are not fired after the resume either.
    await fire_due(pool)
    assert all(f["scheduled_for"] >= resumed for f in ledger(pg))
    # Resuming a schedule that runs keeps its place.
    due = floor_to(db_now(pg), SECOND) - timedelta(seconds=2)
    move_next_fire(pg, "s", due)
    with Session(engine) as session, session.begin():
        assert outbox.resume_schedule(session, "s") == due


async def test_unschedule_deletes_the_schedule_and_its_ledger_not_its_jobs(
    engine: Engine, pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection]
) -> None:
    schedule(engine, every=SECOND, catchup="all")
    move_next_fire(pg, "s", floor_to(db_now(pg), SECOND) - timedelta(seconds=3))
    assert await fire_due(pool) >= 3
    with Session(engine) as session, session.begin():
        assert outbox.unschedule(session, "s") is True
        assert outbox.unschedule(session, "s") is False
    assert schedule_count(pg) == 0
    assert pg.execute("SELECT count(*) FROM schedule_fires").fetchone()[0] == 0  # type: ignore[index]
    assert pg.execute("SELECT count(*) FROM jobs").fetchone()[0] >= 3  # type: ignore[index]


async def test_async_variants(async_engine: AsyncEngine, pg: psycopg.Connection) -> None:
    async with AsyncSession(async_engine) as session, session.begin():
        first = await outbox.schedule_async(
            session, "a", "tick", cron="*/5 * * * * *", catchup="skip", tenant="acme"
        )
        assert first.second % 5 == 0
        assert await outbox.pause_schedule_async(session, "a") is True
    assert row(pg, "a")["paused"] and row(pg, "a")["tenant"] == "acme"
    async with AsyncSession(async_engine) as session, session.begin():
        resumed = await outbox.resume_schedule_async(session, "a")
        assert resumed is not None and resumed.second % 5 == 0
        assert await outbox.unschedule_async(session, "a") is True
        assert await outbox.unschedule_async(session, "a") is False
    assert schedule_count(pg) == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"cron": "61 * * * *"}, ValueError, "cron '61 \\* \\* \\* \\*' is invalid: bad minute"),
        ({"cron": "* * *"}, ValueError, "has 3 fields; expected five"),
        ({"cron": "0 9 * * *", "timezone": "Europe/Atlantis"}, ValueError, "timezone"),
        ({"every": timedelta(milliseconds=500)}, ValueError, "every must be at least 1 second"),
        ({"every": 60}, TypeError, "every must be a datetime.timedelta"),
        ({"cron": "* * * * *", "every": SECOND}, ValueError, "exactly one of cron= and every="),
        ({}, ValueError, r"exactly one of cron= and every= \(got neither\)"),
        ({"every": SECOND, "catchup": "some"}, ValueError, "catchup must be one of"),
        ({"every": SECOND, "queue": "no spaces"}, ValueError, "queue must be"),
        ({"every": SECOND, "tenant": "a b"}, ValueError, "tenant must be"),
        ({"every": SECOND, "priority": 40000}, ValueError, "priority must fit"),
        ({"every": SECOND, "max_attempts": 0}, ValueError, "max_attempts must be between"),
        ({"every": SECOND, "payload": {1, 2}}, TypeError, "payload is not JSON-serialisable"),
        ({"every": SECOND, "name": ""}, ValueError, "name must not be empty"),
        ({"every": SECOND, "name": "x" * 201}, ValueError, "name is 201 characters"),
        ({"every": SECOND, "job_type": ""}, ValueError, "job_type must not be empty"),
    ],
)
def test_bad_input_is_refused_and_nothing_written(
    engine: Engine,
    pg: psycopg.Connection,
    kwargs: dict[str, Any],
    error: type[Exception],
    message: str,
) -> None:
    schedule(engine, "s", every=timedelta(minutes=1))
    before = row(pg, "s")
    args = {"name": "s", "job_type": "tick", "payload": None} | kwargs
    with Session(engine) as session, session.begin():
        with pytest.raises(error, match=message):
            outbox.schedule(session, args.pop("name"), args.pop("job_type"), **args)
        # The caller's transaction goes on, untouched, and commits.
        outbox.schedule(session, "t", "tick", every=SECOND)
    assert schedule_count(pg) == 2
    assert row(pg, "s") == before


# ------------------------------------------------------------------------- firing


async def test_fire_due_enqueues_each_occurrence_once_with_its_delay(
    engine: Engine, pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection]
) -> None:
    schedule(engine, every=SECOND, queue="ticks", priority=2, max_attempts=3, catchup="all")
    start = floor_to(db_now(pg), SECOND) - timedelta(seconds=20)
    move_next_fire(pg, "s", start)
    fired = await fire_due(pool)
    instants = assert_each_once(pg, "s", SECOND)
    assert instants[0] == start and fired == len(instants) >= 21
    fires = ledger(pg)
    for f in fires:
        # Recorded by the database clock: decided at fired_at, that late.
        late = (f["fired_at"] - f["scheduled_for"]).total_seconds()
        assert f["delay_seconds"] == pytest.approx(late, abs=1e-5)
        assert f["delay_seconds"] >= 0
    assert fires[0]["delay_seconds"] >= 20
    state = row(pg, "s")
    assert state["last_fire_at"] == instants[-1]
    assert state["next_fire_at"] == instants[-1] + SECOND > db_now(pg) - SECOND
    job = pg.execute(
        "SELECT job_type, queue, priority, max_attempts, payload FROM jobs LIMIT 1"
    ).fetchone()
    assert job == ("tick", "ticks", 2, 3, {"from": "s"})


async def test_the_ledger_refuses_an_occurrence_fired_before(
    engine: Engine, pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection]
) -> None:
    """Whatever sends the walk back over fired occurrences (a stale read, a rule
    changed under a relay's feet), the ledger's primary key lets none fire twice,
    even once retention has deleted their jobs (and with them the dedup keys)."""
    schedule(engine, every=SECOND, catchup="all")
    start = floor_to(db_now(pg), SECOND) - timedelta(seconds=5)
    move_next_fire(pg, "s", start)
    await fire_due(pool)
    fired_before = {f["scheduled_for"]: f["job_id"] for f in ledger(pg)}
    pg.execute("DELETE FROM jobs")
    move_next_fire(pg, "s", start)
    await fire_due(pool)
    after = {f["scheduled_for"]: f["job_id"] for f in ledger(pg)}
    assert {at: after[at] for at in fired_before} == fired_before
    keys = {r[0] for r in pg.execute("SELECT dedup_key FROM jobs").fetchall()}
    again = [at for at in fired_before if f"schedule:s@{at.astimezone(UTC).isoformat()}" in keys]
    assert again == []
    # Only occurrences that became due since were enqueued, one job each.
    assert len(keys) == len(after) - len(fired_before)


@pytest.mark.parametrize(
    ("catchup", "max_catchup", "missed_fired", "reason"),
    [
        ("skip", 10, 0, "catchup"),
        ("latest", 10, 0, "catchup"),
        ("all", 3, 3, "catchup_limit"),
        ("all", 50, 50, "catchup_limit"),
    ],
)
async def test_catchup_after_downtime(
    engine: Engine,
    pg: psycopg.Connection,
    pool: AsyncConnectionPool[AsyncConnection],
    catchup: str,
    max_catchup: int,
    missed_fired: int,
    reason: str,
) -> None:
    """Every minute; no relay ran for ten minutes. The newest occurrence is on time
    (within the grace of 60 s) and runs; of the older ones, "all" runs the newest
    max_catchup, "skip" and "latest" none (the newest is theirs)."""
    minute = timedelta(minutes=1)
    schedule(engine, every=minute, catchup=catchup)
    start = floor_to(db_now(pg), minute) - timedelta(minutes=10)
    move_next_fire(pg, "s", start)
    await fire_due(pool, max_catchup=max_catchup)
    fires = ledger(pg)
    instants = [f["scheduled_for"] for f in fires]
    assert instants == [start + i * minute for i in range(len(instants))]
    assert len(instants) in (10, 11)
    assert row(pg, "s")["next_fire_at"] == instants[-1] + minute > fires[-1]["fired_at"]
    on_time = [f for f in fires if f["delay_seconds"] <= 60]
    missed = [f for f in fires if f["delay_seconds"] > 60]
    assert len(on_time) == 1 and on_time[0]["outcome"] == "enqueued"
    cut = max(len(missed) - missed_fired, 0)
    assert [f["outcome"] for f in missed] == ["skipped"] * cut + ["enqueued"] * (len(missed) - cut)
    assert {f["skip_reason"] for f in missed[:cut]} <= {reason}
    enqueued = [f for f in fires if f["outcome"] == "enqueued"]
    assert pg.execute("SELECT count(*) FROM jobs").fetchone()[0] == len(enqueued)  # type: ignore[index]


@pytest.mark.parametrize("catchup", ["skip", "latest"])
async def test_after_any_gap_skip_and_latest_enqueue_one_job(
    engine: Engine, pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection], catchup: str
) -> None:
    """Every 5 seconds, three hours without a relay: one job, for the newest
    occurrence (it used to be 13 for "skip" and 14 for "latest": every occurrence of
    the last 60 s counted as on time). The rest are recorded skipped."""
    step = timedelta(seconds=5)
    schedule(engine, every=step, catchup=catchup)
    move_next_fire(pg, "s", floor_to(db_now(pg), step) - timedelta(hours=3))
    assert await fire_due(pool) == 1
    fires = ledger(pg)
    enqueued = [f for f in fires if f["outcome"] == "enqueued"]
    assert [f["scheduled_for"] for f in enqueued] == [fires[-1]["scheduled_for"]]
    assert enqueued[0]["delay_seconds"] < 5 + 1
    assert {f["skip_reason"] for f in fires[:-1]} == {"catchup"}
    jobs = pg.execute("SELECT job_id, scheduled_for FROM jobs").fetchall()
    assert jobs == [(enqueued[0]["job_id"], enqueued[0]["scheduled_for"])]
    # Handled again at once: nothing more is due, nothing more runs; unless the next
    # occurrence fell due meanwhile (a loaded machine can take seconds over 2,160
    # skipped occurrences), which is on time and runs as one job.
    again = await fire_due(pool)
    if db_now(pg) < enqueued[0]["scheduled_for"] + step:
        assert again == 0
    else:
        assert again <= 1


@pytest.mark.parametrize(
    ("catchup", "late", "runs"),
    [
        # the relay is back 30 s after the hour: the hour runs, the one before not
        ("skip", 30, ["hour"]),
        ("latest", 30, ["hour"]),
        ("all", 30, ["hour before", "hour"]),
        # 5 s inside and outside the 60 s grace
        ("skip", 55, ["hour"]),
        ("skip", 65, []),
        ("latest", 65, ["hour"]),
        ("all", 65, ["hour before", "hour"]),
    ],
)
async def test_an_hourly_schedule_back_after_an_hour_by_the_database_clock(
    engine: Engine,
    pg: psycopg.Connection,
    pool: AsyncConnectionPool[AsyncConnection],
    catchup: str,
    late: int,
    runs: list[str],
) -> None:
    """An hourly cron entry whose hour fell `late` seconds ago by the database's
    clock, and whose relay was away since before the hour before."""
    hour = floor_to(db_now(pg), SECOND) - timedelta(seconds=late)
    cron = f"{hour.second} {hour.minute} * * * *"  # seconds first: hourly at mm:ss
    schedule(engine, cron=cron, catchup=catchup)
    move_next_fire(pg, "s", hour - timedelta(hours=1))
    await fire_due(pool)
    names = {hour - timedelta(hours=1): "hour before", hour: "hour"}
    fires = ledger(pg)
    assert [names[f["scheduled_for"]] for f in fires] == ["hour before", "hour"]
    assert [names[f["scheduled_for"]] for f in fires if f["outcome"] == "enqueued"] == runs
    assert row(pg, "s")["next_fire_at"] == hour + timedelta(hours=1)


async def test_retention_keeps_the_newest_fires(
    engine: Engine, pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection]
) -> None:
    schedule(engine, every=SECOND, catchup="all")
    start = floor_to(db_now(pg), SECOND) - timedelta(seconds=30)
    move_next_fire(pg, "s", start)
    fired = await fire_due(pool, keep_fires=5)
    fires = ledger(pg)
    assert len(fires) == 5
    assert fires[-1]["scheduled_for"] == row(pg, "s")["last_fire_at"]
    # Jobs are not the ledger's to prune.
    assert pg.execute("SELECT count(*) FROM jobs").fetchone()[0] == fired >= 31  # type: ignore[index]


async def test_a_long_outage_is_walked_in_bounded_work(
    engine: Engine, pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection]
) -> None:
    """A day behind on an every-second schedule: the newest occurrences are recorded
    and the 3 newest missed ones fire, not 86,400 of them."""
    schedule(engine, every=SECOND, catchup="all")
    move_next_fire(pg, "s", floor_to(db_now(pg), SECOND) - timedelta(days=1))
    fired = await fire_due(pool, max_catchup=3, keep_fires=20, grace=5)
    fires = ledger(pg)
    assert len(fires) == 20
    enqueued = [f["scheduled_for"] for f in fires if f["outcome"] == "enqueued"]
    # 3 caught up, and the 5 or 6 on time: contiguous seconds, the newest.
    assert fired == len(enqueued) in (8, 9)
    assert enqueued == [enqueued[0] + i * SECOND for i in range(len(enqueued))]
    assert enqueued[-1] == fires[-1]["scheduled_for"]
    assert row(pg, "s")["next_fire_at"] == enqueued[-1] + SECOND


# ------------------------------------------------------------------ with relays


async def test_two_relays_fire_every_second_exactly_once(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    # "all": a relay late by a second under load must still fire both occurrences
    schedule(engine, every=SECOND, catchup="all")
    fast = {"schedule_interval": 0.05, "rewake_interval": 30.0}
    async with (
        inproc.relay_running(db_url, amqp_url, topology, **fast),
        inproc.relay_running(db_url, amqp_url, topology, **fast),
    ):
        # Ten seconds of occurrences, fired side by side.
        await wait_for(lambda: len(ledger(pg)) >= 11, "11 fires", timeout=40)
    instants = assert_each_once(pg, "s", SECOND)
    assert instants[-1] - instants[0] >= timedelta(seconds=10)
    # The relays keep up: none of them was late enough to count as missed.
    assert max(f["delay_seconds"] for f in ledger(pg)) < 60


async def test_occurrences_fire_on_time_not_an_interval_late(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    """The scheduler sleeps until the next occurrence is due, not a fixed interval:
    with an interval of 5 s, an every-second schedule's occurrences each fire within
    a fraction of a second (a fixed interval would make them 2.5 s late on average,
    all five under a second with a chance of 1 in 3,000). The bound leaves room for
    a loaded machine: CI's parallel run once saw one fire 0.34 s late."""
    schedule(engine, every=SECOND)
    async with inproc.relay_running(
        db_url, amqp_url, topology, schedule_interval=5.0, rewake_interval=30.0
    ):
        # The first round may wait out an interval (the schedule was new to the
        # sleeping relay) and then record every occurrence it slept through at once:
        # the rounds after it are the ones that must be on time.
        await wait_for(lambda: len(ledger(pg)) >= 1, "the first round", timeout=30)
        first_round = len(ledger(pg))
        await wait_for(lambda: len(ledger(pg)) >= first_round + 5, "5 fires more", timeout=30)
    delays = [f["delay_seconds"] for f in ledger(pg)[first_round:]]
    assert max(delays) < 1.0, delays


async def test_a_relay_killed_mid_fire_loses_no_occurrence(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    env: dict[str, str],
) -> None:
    # "all": the occurrences due while no relay ran fire too, each once
    schedule(engine, every=SECOND, catchup="all")
    args = ["--schedule-interval", "0.1"]
    blocked_fire = (
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'relay' AND wait_event_type = 'Lock' "
        "AND query LIKE '%INSERT INTO jobs AS j%'"
    )
    with running("relay", args, env, "relay.started") as relay:
        await wait_for(lambda: len(ledger(pg)) >= 3, "the first fires")
        # Hold the next fire between its ledger insert and its job insert, then kill.
        with psycopg.connect(db_url.conninfo) as locker:
            locker.execute("LOCK TABLE jobs IN SHARE MODE")
            await wait_for(
                lambda: pg.execute(blocked_fire).fetchone() is not None, "a fire in flight"
            )
            (orphan,) = pg.execute(blocked_fire).fetchone()  # type: ignore[misc]
            relay.kill()
            killed_at = db_now(pg)
            locker.rollback()
    # The dead relay's transaction is rolled back by the server, taking its ledger rows.
    await wait_for(
        lambda: (
            pg.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [orphan]).fetchone() is None
        ),
        "the killed relay's backend to go",
    )
    before = {f["scheduled_for"] for f in ledger(pg)}
    assert all(at < killed_at for at in before)
    # Some downtime, so that several occurrences fall due while no relay runs.
    await wait_for(lambda: db_now(pg) > killed_at + timedelta(seconds=2.5), "downtime")
    with running("relay", args, env, "relay.started"):
        await wait_for(
            lambda: ledger(pg)[-1]["scheduled_for"] >= killed_at + timedelta(seconds=3),
            "fires after the restart",
        )
    instants = assert_each_once(pg, "s", SECOND)
    assert instants[0] == min(before)
    # The one in flight and the ones due while no relay ran: fired late, by the second.
    late = [f["scheduled_for"] for f in ledger(pg) if f["delay_seconds"] > 1.5]
    assert max(before) + SECOND in late and len(late) >= 2


async def test_a_schedule_without_a_payload_fires(db_url: DatabaseUrl, engine: Engine, pg) -> None:
    """Found by the metrics work: a payload-less schedule must fire, not fail each time."""
    with Session(engine) as session, session.begin():
        outbox.schedule(session, "bare", "tick", every=timedelta(seconds=1))
    pg.execute("UPDATE schedules SET next_fire_at = now() - interval '1 second'")
    pool = make_pool(db_url, "test", 2)
    await pool.open()
    try:
        assert await fire_due(pool) >= 1
    finally:
        await pool.close()
    (payload,) = pg.execute("SELECT payload FROM jobs WHERE job_type = 'tick'").fetchone()
    assert payload is None


async def test_trigger_enqueues_the_template_now_and_leaves_the_timetable(
    engine: Engine, async_engine: AsyncEngine, pg, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Session(engine) as session, session.begin():
        next_fire = outbox.schedule(
            session, "report", "build", {"blob": "x" * 2000}, every=timedelta(hours=1),
            queue="reports", tenant="acme", priority=5, max_attempts=2,
        )  # fmt: skip
        outbox.pause_schedule(session, "report")
    # A limit lowered since the schedule was written does not make it unfireable.
    monkeypatch.setenv("MAX_PAYLOAD_BYTES", "100")
    async with AsyncSession(async_engine) as session, session.begin():
        job_id = await outbox.trigger_schedule_async(session, "report")
        assert await outbox.trigger_schedule_async(session, "nope") is None
    with Session(engine) as session, session.begin():
        again = outbox.trigger_schedule(session, "report")
    assert job_id is not None and again is not None and again != job_id
    row = pg.execute(
        "SELECT job_type, queue, tenant, priority, max_attempts, state, dedup_key,"
        " length(payload->>'blob') FROM jobs WHERE job_id = %s",
        (job_id,),
    ).fetchone()
    assert row == ("build", "reports", "acme", 5, 2, "QUEUED", None, 2000)
    assert pg.execute("SELECT count(*) FROM outbox WHERE job_id = %s", (job_id,)).fetchone() == (1,)
    assert pg.execute("SELECT count(*) FROM schedule_fires").fetchone() == (0,)
    assert pg.execute("SELECT next_fire_at, paused FROM schedules").fetchone() == (next_fire, True)


# ------------------------------------------------------- which occurrence a job is


async def test_a_job_knows_the_occurrence_that_fired_it(
    engine: Engine,
    pg: psycopg.Connection,
    pool: AsyncConnectionPool[AsyncConnection],
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    """catchup="all" after five missed seconds: five jobs of one schedule, each told
    its own nominal instant (job.scheduled_for, aware, UTC), as the ledger has it;
    a job enqueued by hand, or triggered off the timetable, has none."""
    registry = Registry()

    @registry.handler("tick")
    async def tick(j: consumers.Job) -> dict[str, Any]:
        at = j.scheduled_for
        return {"at": None if at is None else at.isoformat(), "aware": bool(at and at.tzinfo)}

    schedule(engine, every=SECOND, catchup="all")
    move_next_fire(pg, "s", floor_to(db_now(pg), SECOND) - timedelta(seconds=5))
    fired = await fire_due(pool)
    with Session(engine) as session, session.begin():
        outbox.pause_schedule(session, "s")  # the relay below fires no more
        by_hand = outbox.enqueue(session, "tick", {})
        triggered = outbox.trigger_schedule(session, "s")
    async with (
        consumer_running(db_url, amqp_url, topology, registry),
        inproc.relay_running(db_url, amqp_url, topology),
    ):
        await wait_for(
                lambda: pg.execute("SELECT count(*) FROM jobs WHERE state = 'SUCCEEDED'")
                .fetchone()[0] == fired + 2,  # type: ignore[index]
                "every job to run",
            )  # fmt: skip
    results = dict(pg.execute("SELECT job_id, result FROM jobs").fetchall())
    fires = [f for f in ledger(pg) if f["outcome"] == "enqueued"]
    assert len(fires) == fired >= 5
    for f in fires:
        expected = f["scheduled_for"].astimezone(UTC).isoformat()
        assert results[f["job_id"]] == {"at": expected, "aware": True}
    assert len({results[f["job_id"]]["at"] for f in fires}) == len(fires), "each its own"
    assert results[by_hand] == {"at": None, "aware": False}
    assert results[triggered] == {"at": None, "aware": False}


# --------------------------------------------------------- schedules that fail


def _failing(pg: psycopg.Connection, count: int, since: datetime) -> None:
    """Schedules that fail at every firing, from before `since`: their zone is not
    one (as after a tzdata upgrade dropped it; the API refuses to write one)."""
    pg.execute(
        "INSERT INTO schedules (name, job_type, cron, timezone, next_fire_at)"
        " SELECT 'bad-' || g, 'tick', '* * * * *', 'Mars/Olympus_Mons', %s - g * interval '1 s'"
        " FROM generate_series(1, %s) AS g",
        [since, count],
    )


async def test_schedules_that_keep_failing_hold_back_none_of_the_others(
    engine: Engine,
    pg: psycopg.Connection,
    pool: AsyncConnectionPool[AsyncConnection],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """100 schedules that fail, all due before a good one, and a batch of 100: the
    good one fires in the same round. Each failing one says why on its row and once
    in the log, and waits out a backoff that doubles, instead of being tried (and
    blocking the batch) again at once. They used to fill every batch for ever."""
    schedule(engine, "good", every=SECOND)
    due = floor_to(db_now(pg), SECOND) - timedelta(seconds=2)
    move_next_fire(pg, "good", due)
    _failing(pg, 100, due)
    with caplog.at_level(logging.ERROR, logger="relay"):
        fired = await fire_due(pool, batch=100)
    assert fired == 1 and ledger(pg, "good")[-1]["outcome"] == "enqueued"
    failed = [r for r in caplog.records if r.message == "relay.schedule_failed"]
    assert len(failed) == 100, "each failing schedule said so once"
    bad = row(pg, "bad-1")
    assert bad["failures"] == 1 and "Mars/Olympus_Mons" in bad["last_error"]
    assert bad["last_error_at"] <= db_now(pg) < bad["retry_at"]
    assert bad["next_fire_at"] < due, "it stays due: nothing of it was skipped"
    assert ledger(pg, "bad-1") == []

    # Handled again at once: the failing ones wait out their backoff.
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="relay"):
        await fire_due(pool, batch=100)
    assert [r for r in caplog.records if r.message == "relay.schedule_failed"] == []
    # Once it is over, a schedule that still fails backs off twice as long.
    pg.execute("UPDATE schedules SET retry_at = now() WHERE name = 'bad-1'")
    await fire_due(pool, batch=100)
    again = row(pg, "bad-1")
    assert again["failures"] == 2
    first_wait = (bad["retry_at"] - bad["last_error_at"]).total_seconds()
    second_wait = (again["retry_at"] - again["last_error_at"]).total_seconds()
    assert second_wait == pytest.approx(2 * first_wait)
    # Mended, it fires at its next turn and forgets the count (not the last error).
    pg.execute("UPDATE schedules SET timezone = 'UTC', retry_at = now() WHERE name = 'bad-1'")
    await fire_due(pool, batch=100)
    mended = row(pg, "bad-1")
    assert (mended["failures"], mended["retry_at"]) == (0, None)
    assert mended["last_error"] == again["last_error"]
    assert [f["outcome"] for f in ledger(pg, "bad-1")][-1] == "enqueued"


def test_a_schedule_takes_a_json_default_and_stores_plain_json(
    engine: Engine, pg: psycopg.Connection
) -> None:
    at = datetime(2026, 12, 6, 9, 30, tzinfo=UTC)
    with Session(engine) as session, session.begin():
        with pytest.raises(TypeError, match=r"payload\['since'\] is of type datetime"):
            outbox.schedule(session, "report", "stamp", {"since": at}, every=SECOND)
        outbox.schedule(
            session,
            "report",
            "stamp",
            {"since": at},
            every=SECOND,
            json_default=lambda value: value.isoformat(),
        )
    (payload,) = pg.execute("SELECT payload FROM schedules WHERE name = 'report'").fetchone() or (
        None,
    )
    assert payload == {"since": "2026-12-06T09:30:00+00:00"}
