"""A refused wake-up waits until something can change the answer: real relay and
consumer processes. Before, a job type that only a busy consumer knew cost about
870 wake-ups per job in 10 s: every other consumer refused it (NO_HANDLER), the
claim put its wake-up back due now, the relay sent it again at once, and round."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.schema import queries as q
from tests.support.jobs import enqueue, enqueue_many, until, wait_for_state
from tests.support.processes import running

pytestmark = pytest.mark.timeout(240)

RELAY = ["--poll-interval", "0.5"]
CAPABLE = ["--app", "tests.apps.refusals", "--concurrency", "1"]
OTHER = ["--app", "tests.apps.basic"]
# How long the measurement lasts, while the only consumer with the handler is busy.
WINDOW = 4.0


def written(pg: psycopg.Connection) -> int:
    """Outbox rows ever written (the identity only grows)."""
    row = pg.execute("SELECT last_value FROM pg_sequences WHERE sequencename LIKE 'outbox_id%'")
    value = row.fetchone()
    return int(value[0] or 0) if value else 0


def states(pg: psycopg.Connection, ids: list[uuid.UUID]) -> dict[str, int]:
    rows = pg.execute(
        "SELECT state, count(*) FROM jobs WHERE job_id = ANY(%s) GROUP BY state", [ids]
    )
    return dict(rows.fetchall())


def lapsed(pg: psycopg.Connection, pid: int) -> bool:
    """Whether the sweeper took a lease of the consumer of ``pid`` back."""
    row = pg.execute("SELECT lease_lapsed_at IS NOT NULL FROM workers WHERE pid = %s", [pid])
    return row.fetchone() == (True,)


def wait(check: Any, what: str, timeout: float = 30) -> Any:
    return asyncio.run(until(check, what, timeout))


def _where_they_are(pg: psycopg.Connection, job_ids: list[uuid.UUID]) -> dict[str, Any]:
    """The jobs' states, reasons and wake-ups, and the consumers' rows: what a
    failed wait for parked jobs needs to say why."""
    jobs = pg.execute(
        "SELECT j.state, j.delay_reason, j.lease_owner, o.sent_at IS NOT NULL, o.available_at"
        " FROM jobs AS j LEFT JOIN outbox AS o USING (job_id) WHERE j.job_id = ANY(%s)",
        [job_ids],
    ).fetchall()
    workers = pg.execute(
        "SELECT pid, job_types, stopping, last_seen_at, lease_lapsed_at, now() FROM workers"
    ).fetchall()
    return {"jobs": jobs, "workers": workers}


def test_a_job_type_only_a_busy_consumer_knows_waits_without_a_storm_of_wakeups(
    env: dict[str, str], engine: Engine, pg: psycopg.Connection
) -> None:
    with (
        running("relay", RELAY, env, "relay.started") as relay,
        running("consumer", CAPABLE, env, "consumer.started"),
        running("consumer", OTHER, env, "consumer.started"),
    ):
        blocker = enqueue(engine, "rare", {"seconds": WINDOW + 4})
        asyncio.run(wait_for_state(pg, blocker, "RUNNING"))
        # One transaction each, so one message each: the busy consumer's prefetch
        # takes two, the other consumer gets the rest.
        waiting = [enqueue(engine, "rare") for _ in range(10)]
        before, began = written(pg), time.monotonic()
        time.sleep(WINDOW)
        during = written(pg) - before
        assert pg.execute("SELECT state FROM jobs WHERE job_id = %s", [blocker]).fetchone() == (
            "RUNNING",
        ), "the window fell inside the busy stretch"
        assert time.monotonic() - began < WINDOW + 4
        # Each job: at most its refusal's delayed wake-up and one early one, in
        # the window (it was thousands).
        assert during <= 2 * len(waiting), f"{during} wake-ups for {len(waiting)} waiting jobs"
        assert states(pg, waiting) == {"QUEUED": 10}
        wait(lambda: states(pg, [*waiting, blocker]) == {"SUCCEEDED": 11}, "all ran", 60)
        assert not relay.has_event("relay.chore_failed")


def test_a_job_type_whose_only_consumer_was_killed_waits_without_a_storm_of_wakeups(
    env: dict[str, str], engine: Engine, pg: psycopg.Connection
) -> None:
    """The only consumer with the handler is killed (SIGKILL) while it runs one: its
    row in workers still looks live, with its one slot taken, until its heartbeat
    lapses. The other consumer turns the waiting jobs down meanwhile, at most twice
    each in the window (it was 11 a job in 10 s); one with the handler that starts
    then runs them all, the killed one's job after its lease."""
    short = [*CAPABLE, "--lease-seconds", "3", "--heartbeat-seconds", "1"]
    with (
        running("relay", [*RELAY, "--sweep-interval", "1"], env, "relay.started") as relay,
        running("consumer", OTHER, env, "consumer.started"),
    ):
        with running("consumer", short, env, "consumer.started") as capable:
            blocker = enqueue(engine, "rare", {"seconds": 600, "then": 0})
            asyncio.run(wait_for_state(pg, blocker, "RUNNING"))
            capable.kill()
        # From the sweep that took its lease back: its row is still fresh, and its
        # one slot is free.
        wait(lambda: lapsed(pg, capable.pid), "the sweeper took its lease back")
        before = written(pg)
        waiting = [enqueue(engine, "rare") for _ in range(10)]
        time.sleep(WINDOW)
        during = written(pg) - before
        # Each job: its first wake-up and the refusal's delayed one, at most; the
        # killed one's too, which waits again once its lease lapsed (it was 66).
        jobs = len(waiting) + 1
        assert during <= 2 * jobs, f"{during} wake-ups for {jobs} waiting jobs"
        assert states(pg, waiting) == {"QUEUED": 10}
        with running("consumer", short, env, "consumer.started"):
            wait(lambda: states(pg, [*waiting, blocker]) == {"SUCCEEDED": 11}, "all ran", 60)
        assert not relay.has_event("relay.chore_failed")


def test_a_frozen_consumer_that_comes_back_wakes_the_jobs_that_waited_for_it(
    env: dict[str, str], engine: Engine, pg: psycopg.Connection
) -> None:
    """The only consumer with the handler is frozen (SIGSTOP) past its lease: once
    the sweeper took its lease back it is not live, so the jobs the other consumer
    turns down wait for a consumer to come, without a wake-up (parked). When it
    thaws (SIGCONT), its next heartbeat of its row says it is back, and it wakes
    them: nothing else would."""
    short = [*CAPABLE, "--lease-seconds", "3", "--heartbeat-seconds", "1"]
    with (
        running("relay", [*RELAY, "--sweep-interval", "1"], env, "relay.started") as relay,
        running("consumer", OTHER, env, "consumer.started"),
        running("consumer", short, env, "consumer.started") as capable,
    ):
        blocker = enqueue(engine, "rare", {"seconds": 2})
        asyncio.run(wait_for_state(pg, blocker, "RUNNING"))
        capable.signal(signal.SIGSTOP)
        try:
            wait(lambda: lapsed(pg, capable.pid), "the sweeper took its lease back")
            # One message each: once the frozen one is not live, the relay packs by
            # the other consumer's prefetch, and one message of all five could go
            # to the frozen one, which holds its room of one message till it thaws.
            waiting = []
            for _ in range(5):
                waiting.append(enqueue(engine, "rare"))
                wait(lambda: unsent(pg, waiting) == 0, "its wake-up went out")

            def parked() -> int:
                row = pg.execute(
                    "SELECT count(*) FROM jobs AS j WHERE j.job_id = ANY(%s)"
                    " AND j.delay_reason = 'NO_HANDLER'"
                    " AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.job_id = j.job_id)",
                    [waiting],
                ).fetchone()
                return int(row[0]) if row else 0

            # RabbitMQ may also have handed some to the frozen one (its prefetch):
            # those it runs when it thaws. The others the other consumer turned down.
            try:
                wait(lambda: parked() >= 2, "waiting jobs turned down, left without a wake-up")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: {_where_they_are(pg, waiting)}") from None
            time.sleep(1)
            left = parked()
        finally:
            capable.signal(signal.SIGCONT)
        # Within seconds, not at the orphan walk (a job waits 30 s, its grace,
        # before the walk looks at it: 29 s after the thaw when measured).
        wait(lambda: states(pg, [*waiting, blocker]) == {"SUCCEEDED": 6}, "all ran", 20)
        assert capable.wait_for_event("consumer.back")["woke_waiting_jobs"] >= left
        assert not relay.has_event("relay.chore_failed")


def test_refusals_for_a_paused_queue_do_not_loop(
    env: dict[str, str], engine: Engine, pg: psycopg.Connection
) -> None:
    def pause() -> None:
        with Session(engine) as session, session.begin():
            outbox.pause_queue(session, "default", by="test")

    with (
        running("relay", RELAY, env, "relay.started") as relay,
        running("consumer", [*OTHER, "--concurrency", "1"], env, "consumer.started"),
    ):
        jobs, blocker = _busy_then(engine, pg, NewJob("noop", {}), pause)
        assert states(pg, jobs) == {"QUEUED": 4}
        with Session(engine) as session, session.begin():
            outbox.resume_queue(session, "default")
        wait(lambda: states(pg, [*jobs, blocker]) == {"SUCCEEDED": 5}, "all ran", 60)
        assert not relay.has_event("relay.chore_failed")


def test_refusals_for_a_full_tenant_do_not_loop(
    env: dict[str, str], engine: Engine, pg: psycopg.Connection
) -> None:
    def cap() -> None:
        with Session(engine) as session, session.begin():
            outbox.set_tenant_limit(session, "acme", max_running=0)

    with (
        running("relay", RELAY, env, "relay.started") as relay,
        running("consumer", [*OTHER, "--concurrency", "1"], env, "consumer.started"),
    ):
        jobs, blocker = _busy_then(engine, pg, NewJob("noop", {}, tenant="acme"), cap)
        assert states(pg, jobs) == {"QUEUED": 4}
        with Session(engine) as session, session.begin():
            outbox.set_tenant_limit(session, "acme", max_running=1)
        wait(lambda: states(pg, [*jobs, blocker]) == {"SUCCEEDED": 5}, "all ran", 60)
        assert not relay.has_event("relay.chore_failed")


def _busy_then(
    engine: Engine, pg: psycopg.Connection, job: NewJob, turn_down: Any
) -> tuple[list[uuid.UUID], uuid.UUID]:
    """Wake-ups for four jobs reach the consumer while its one slot is busy;
    meanwhile the answer changes (``turn_down``), so once the slot frees the
    consumer turns them down. Each refusal puts its wake-up back once, and the
    relay's decision holds it back until the answer changes again: no loop."""
    blocker = enqueue(engine, "sleep", {"seconds": 3})
    asyncio.run(wait_for_state(pg, blocker, "RUNNING"))
    jobs = [enqueue_many(engine, [job])[0] for _ in range(4)]
    wait(lambda: sent(pg, jobs) == 4, "their wake-ups went out")
    turn_down()
    before = written(pg)
    wait(lambda: reasons(pg, jobs) != {None}, "the consumer turned them down", 30)
    time.sleep(WINDOW)
    during = written(pg) - before
    assert during <= 2 * len(jobs), f"{during} wake-ups written for {len(jobs)} jobs"
    return jobs, blocker


def unsent(pg: psycopg.Connection, ids: list[uuid.UUID]) -> int:
    row = pg.execute(
        "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND job_id = ANY(%s)", [ids]
    ).fetchone()
    return int(row[0]) if row else 0


def sent(pg: psycopg.Connection, ids: list[uuid.UUID]) -> int:
    row = pg.execute(
        "SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL AND job_id = ANY(%s)", [ids]
    ).fetchone()
    return int(row[0]) if row else 0


def reasons(pg: psycopg.Connection, ids: list[uuid.UUID]) -> set[str | None]:
    rows = pg.execute("SELECT delay_reason FROM jobs WHERE job_id = ANY(%s)", [ids])
    return {r[0] for r in rows.fetchall()}


WORKER = (
    "INSERT INTO workers (worker_id, host, pid, queues, job_types, concurrency, prefetch)"
    " VALUES (%s, 'h', 1, '{default}', %s, 1, 2)"
)
RARE = [
    {
        "job_type": "rare",
        "max_attempts": 5,
        "backoff_base": 1.0,
        "backoff_cap": 10.0,
        "backoff_jitter": 0.0,
        "sync": False,
    }
]


def claim(pg: psycopg.Connection, worker: str, ids: list[uuid.UUID], types: Any) -> list[Any]:
    """A consumer's claim, as consumers/store.py makes it, of wake-ups the relay
    sent (marked sent first, as the relay's commit does)."""
    pg.execute("UPDATE outbox SET sent_at = now() WHERE job_id = ANY(%s)", [ids])
    params = {
        "job_ids": ids,
        "types": json.dumps(types),
        "free_threads": 0,
        "concurrency": 10,
        "free_slots": 10,
        "worker": worker,
        "lease_seconds": 60,
        "worker_ttl": 60,
        "tenants": [],
        "queues": ["default"],
    }
    return pg.execute(q.JOB_CLAIM_MANY, params).fetchall()


def wakeups(pg: psycopg.Connection, ids: list[uuid.UUID]) -> list[str]:
    """Each job's unsent wake-up: 'now', 'later' (the backstop), or 'none'."""
    rows = dict(
        pg.execute(
            "SELECT job_id, CASE WHEN available_at <= now() THEN 'now' ELSE 'later' END"
            " FROM outbox WHERE job_id = ANY(%s) AND sent_at IS NULL",
            [ids],
        ).fetchall()
    )
    return [rows.get(i, "none") for i in ids]


def bring_forward(pg: psycopg.Connection) -> list[str]:
    return [r[0] for r in pg.execute(q.OUTBOX_WAKE_REFUSED, {"worker_ttl": 60}) if r[0]]


def test_a_refusal_for_want_of_a_handler_waits_for_a_free_slot_at_a_consumer_with_it(
    engine: Engine, pg: psycopg.Connection
) -> None:
    pg.execute(WORKER, ["capable", ["rare"]])
    pg.execute(WORKER, ["other", ["common"]])
    ids = [enqueue(engine, "rare") for _ in range(3)]
    # The consumer with the handler has a free slot: the wake-up met the wrong
    # consumer, and goes back due now...
    assert {r[0] for r in claim(pg, "other", ids, [])} == {"NO_HANDLER"}
    assert wakeups(pg, ids) == ["now"] * 3
    # ...but not twice in a second.
    claim(pg, "other", ids, [])
    assert wakeups(pg, ids) == ["later"] * 3
    assert bring_forward(pg) == ["default"], "one free slot: one of them, now"
    assert sorted(wakeups(pg, ids)) == ["later", "later", "now"]

    # The consumer with the handler is busy: the refusal waits for the backstop,
    # and nothing brings it forward.
    (busy,) = (i for i, w in zip(ids, wakeups(pg, ids), strict=True) if w == "now")
    waiting = [i for i in ids if i != busy]
    assert claim(pg, "capable", [busy], RARE)[0][0] == "claimed"
    assert {r[0] for r in claim(pg, "other", waiting, [])} == {"NO_HANDLER"}
    assert wakeups(pg, waiting) == ["later"] * 2
    assert bring_forward(pg) == []
    # Its slot frees: one of them (one slot) comes due.
    pg.execute(
        "UPDATE jobs SET state = 'SUCCEEDED', lease_owner = NULL, lease_expires_at = NULL,"
        " finished_at = now() WHERE job_id = %s",
        [busy],
    )
    assert bring_forward(pg) == ["default"]
    assert sorted(wakeups(pg, waiting)) == ["later", "now"]

    # No other live consumer has the handler: no wake-up at all, until one
    # announces it (JOB_WAKE_PARKED).
    pg.execute("DELETE FROM workers WHERE worker_id = 'capable'")
    claim(pg, "other", waiting, [])
    assert wakeups(pg, waiting) == ["none"] * 2
