"""The operator's controls on the real services: replay, pausing a queue, "why is
my job waiting?" (every code from a real situation), and retention."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Backoff, Registry
from hybrid_jobs.jobctl.check import check as chaos_check
from hybrid_jobs.outbox import Explanation, NewJob
from hybrid_jobs.plumbing.config import AmqpUrl, ConfigError, DatabaseUrl
from hybrid_jobs.relay.settings import RelaySettings
from hybrid_jobs.schema.topology import Topology
from tests.support.inproc import chore_rounds, consumer_running, relay_running
from tests.support.jobs import attempts, enqueue, enqueue_many, job, until, wait_for_state

pytestmark = pytest.mark.timeout(120)

FAST = Backoff(base=0.05, cap=0.1, jitter=0.0)


@pytest.fixture
def services(db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology):
    return db_url, amqp_url, topology


def explain(engine: Engine, job_id: uuid.UUID | str) -> Explanation:
    with Session(engine) as session:
        return outbox.explain(session, job_id)


def replays(pg: psycopg.Connection, job_id: uuid.UUID) -> list[tuple[Any, ...]]:
    return pg.execute(
        "SELECT replayed_by, from_state, attempts_before FROM job_replays"
        " WHERE job_id = %s ORDER BY id",
        [job_id],
    ).fetchall()


# ---------------------------------------------------------------------------- replay


async def test_replay_runs_failed_and_cancelled_jobs_again_and_leaves_others_alone(
    services, engine: Engine, pg
) -> None:
    registry = Registry()
    release = asyncio.Event()

    @registry.handler("flaky", max_attempts=2, backoff=FAST)
    async def flaky(j: consumers.Job) -> str:
        if j.attempt <= 2:
            raise ConnectionResetError(f"upstream hung up on attempt {j.attempt}")
        return "ok"

    @registry.handler("doomed", max_attempts=2, backoff=FAST)
    async def doomed(j: consumers.Job) -> None:
        raise consumers.Permanent("never works", code="DOOMED")

    @registry.handler("later")
    async def later(j: consumers.Job) -> None:
        return None

    @registry.handler("hold")
    async def hold(j: consumers.Job) -> None:
        await release.wait()

    flaky_id = enqueue(engine, "flaky")
    doomed_id = enqueue(engine, "doomed")
    cancelled_id = enqueue(engine, "later", run_after=timedelta(hours=1))
    with Session(engine) as session, session.begin():
        assert outbox.request_cancel(session, cancelled_id) == "CANCELLED"
    hold_id = enqueue(engine, "hold")
    done_id = enqueue(engine, "later")
    async with relay_running(*services), consumer_running(*services, registry):
        failed = await wait_for_state(pg, flaky_id, "FAILED")
        assert (failed["attempt_count"], failed["max_attempts"]) == (2, 2)
        await wait_for_state(pg, doomed_id, "FAILED")
        await wait_for_state(pg, done_id, "SUCCEEDED")
        running = await wait_for_state(pg, hold_id, "RUNNING")

        with Session(engine) as session, session.begin():
            assert outbox.retry_job(session, flaky_id, by="alice") == "QUEUED"
            assert outbox.retry_job(session, str(cancelled_id)) == "QUEUED"
            assert outbox.retry_job(session, doomed_id) == "QUEUED"
            # Any other state: nothing changes, and the state says why.
            assert outbox.retry_job(session, hold_id) == "RUNNING"
            assert outbox.retry_job(session, done_id) == "SUCCEEDED"
            assert outbox.retry_job(session, uuid.uuid4()) is None
            with pytest.raises(ValueError, match="job_id"):
                outbox.retry_job(session, "not-a-uuid")
            row = job(pg, flaky_id)
            assert row["state"] == "FAILED", "nothing is visible before the caller commits"

        row = await wait_for_state(pg, flaky_id, "SUCCEEDED")
        assert (row["attempt_count"], row["max_attempts"]) == (3, 4), "a fresh budget of 2"
        assert row["result"] == "ok" and row["last_error_code"] is not None
        history = attempts(pg, flaky_id)
        assert [(a["attempt"], a["outcome"]) for a in history] == [
            (1, "RETRY_WAIT"),
            (2, "FAILED"),
            (3, "SUCCEEDED"),
        ], "the history is kept and numbering carries on"
        assert replays(pg, flaky_id) == [("alice", "FAILED", 2)]

        again = await wait_for_state(pg, cancelled_id, "SUCCEEDED")
        assert again["attempt_count"] == 1 and again["cancel_requested_at"] is None
        assert again["max_attempts"] == 5, "never claimed before: the handler's budget applies"
        (who, from_state, before) = replays(pg, cancelled_id)[0]
        user = pg.execute("SELECT current_user").fetchone()[0]
        assert who.startswith(user) and (from_state, before) == ("CANCELLED", 0)

        # Failing again after a replay: the budget is the job's own size each time
        # (2 more), not the whole count so far.
        await until(lambda: job(pg, doomed_id)["attempt_count"] == 2, "the replayed attempt")
        await wait_for_state(pg, doomed_id, "FAILED")
        with Session(engine) as session, session.begin():
            assert outbox.retry_job(session, doomed_id) == "QUEUED"
        await until(lambda: job(pg, doomed_id)["attempt_count"] == 3, "the second replay")
        row = await wait_for_state(pg, doomed_id, "FAILED")
        assert (row["attempt_count"], row["max_attempts"]) == (3, 4)
        assert [r[2] for r in replays(pg, doomed_id)] == [1, 2]

        after = job(pg, hold_id)
        assert (after["state"], after["lease_generation"], after["max_attempts"]) == (
            running["state"],
            running["lease_generation"],
            running["max_attempts"],
        ), "a running job is left alone"
        assert replays(pg, hold_id) == [] and replays(pg, done_id) == []
        release.set()
        await wait_for_state(pg, hold_id, "SUCCEEDED")

    # The chaos checker counts a replayed job's later attempts as legitimate, and
    # still counts a write after a final state that no replay explains.
    report = chaos_check(services[0].conninfo)
    assert (report["writes_after_terminal"], report["history_mismatch"]) == (0, 0), report
    pg.execute(
        "INSERT INTO job_attempts (job_id, attempt, lease_generation, worker, started_at,"
        " finished_at, outcome) VALUES (%s, 2, 99, 'zombie', now(), now(), 'SUCCEEDED')",
        [done_id],
    )
    assert chaos_check(services[0].conninfo)["writes_after_terminal"] == 1


async def test_retry_jobs_replays_by_filter_within_the_limit(
    services, engine: Engine, async_engine: AsyncEngine, pg
) -> None:
    registry = Registry()

    def failing_once(job_type: str, queue: str) -> None:
        @registry.handler(job_type, queue=queue)
        async def handler(j: consumers.Job) -> None:
            if j.attempt == 1:
                raise consumers.Permanent("first attempt fails", code=j.payload["code"])

    failing_once("mail", "a")
    failing_once("sms", "b")
    jobs = [
        *(NewJob("mail", {"code": "X"}, queue="a") for _ in range(3)),
        *(NewJob("mail", {"code": "Y"}, queue="a") for _ in range(2)),
        *(NewJob("sms", {"code": "X"}, queue="b") for _ in range(2)),
    ]
    ids = enqueue_many(engine, jobs)
    async with relay_running(*services), consumer_running(*services, registry):
        for job_id in ids:
            await wait_for_state(pg, job_id, "FAILED")
        soon = datetime.now(UTC) + timedelta(minutes=5)
        with Session(engine) as session, session.begin():
            for bad in (
                {"limit": 0},
                {"limit": 100_001},
                {"finished_after": datetime(2026, 1, 1)},  # naive: ambiguous
                {"queue": "no spaces"},
                {"error_code": ""},
                {"by": ""},
            ):
                with pytest.raises(ValueError):
                    outbox.retry_jobs(session, **bad)
            for bad in ({"limit": True}, {"finished_after": "yesterday"}, {"job_type": 7}):
                with pytest.raises(TypeError):
                    outbox.retry_jobs(session, **bad)
            assert outbox.retry_jobs(session, finished_after=soon) == 0
            assert outbox.retry_jobs(session, queue="a", error_code="X", by="ops") == 3
        for job_id in ids[:3]:
            await wait_for_state(pg, job_id, "SUCCEEDED")
        assert {job(pg, i)["state"] for i in ids[3:]} == {"FAILED"}, "only the matches"

        with Session(engine) as session, session.begin():
            assert outbox.retry_jobs(session, job_type="sms", limit=1) == 1
        async with AsyncSession(async_engine) as session, session.begin():
            assert await outbox.retry_jobs_async(session, queue="a") == 2
            assert await outbox.retry_job_async(session, ids[0]) == "SUCCEEDED"
        for job_id in ids[3:5]:
            await wait_for_state(pg, job_id, "SUCCEEDED")
        states = sorted(job(pg, i)["state"] for i in ids[5:])
        assert states == ["FAILED", "SUCCEEDED"], "the limit held"
    who = pg.execute("SELECT DISTINCT replayed_by FROM job_replays ORDER BY 1").fetchall()
    assert ("ops",) in who


# ----------------------------------------------------------------------------- pause


async def test_pause_and_resume_a_queue_while_jobs_flow(services, engine: Engine, pg) -> None:
    registry = Registry()

    @registry.handler("step", queue="p")
    async def step(j: consumers.Job) -> None:
        await asyncio.sleep(0.3)

    first = enqueue_many(engine, [NewJob("step", {"n": i}, queue="p") for i in range(8)])
    async with (
        relay_running(*services, min_window=8) as relay,
        consumer_running(*services, registry, concurrency=2),
    ):
        await until(
            lambda: pg.execute("SELECT count(*) FROM jobs WHERE state = 'RUNNING'").fetchone()[0],
            "a running job",
        )
        with Session(engine) as session, session.begin():
            paused = outbox.pause_queue(session, "p", by="ops")
        assert (paused.queue, paused.paused_by) == ("p", "ops")
        (committed,) = pg.execute("SELECT now()").fetchone()
        with Session(engine) as session, session.begin():
            again = outbox.pause_queue(session, "p", by="someone else")
            assert again == paused, "pausing a paused queue keeps who and when"
            assert outbox.paused_queues(session) == [paused]
        later = enqueue_many(engine, [NewJob("step", {"n": i}, queue="p") for i in range(4)])

        # Running jobs finish; wake-ups already in flight are turned down.
        await until(
            lambda: (
                pg.execute("SELECT count(*) FROM jobs WHERE state = 'RUNNING'").fetchone()[0] == 0
            ),
            "the running jobs to finish",
        )
        # The relay has looked at the queue since and held it back, and more rounds
        # of its chores have passed: nothing of the queue started after the pause.
        await until(
            lambda: pg.execute(
                "SELECT 1 FROM fair_shares"
                " WHERE queue = 'p' AND tenant = '' AND held_reason = 'QUEUE_PAUSED'"
            ).fetchone(),
            "the relay to hold the queue back, saying why",
        )
        await chore_rounds(relay, "sweep", 3)
        started = pg.execute(
            "SELECT count(*) FROM jobs WHERE started_at >= %s", [committed]
        ).fetchone()[0]
        assert started == 0, "a job of a paused queue was claimed"
        waiting = [i for i in first + later if job(pg, i)["state"] == "QUEUED"]
        assert len(waiting) >= 4 and all(job(pg, i)["attempt_count"] == 0 for i in later)
        why = explain(engine, waiting[-1])
        assert why.codes == ["QUEUE_PAUSED"], why
        assert why.blocker("QUEUE_PAUSED").facts == {  # type: ignore[union-attr]
            "paused_at": paused.paused_at,
            "paused_by": "ops",
        }

        with Session(engine) as session, session.begin():
            assert outbox.resume_queue(session, "p") is True
        for job_id in first + later:
            await wait_for_state(pg, job_id, "SUCCEEDED")
        with Session(engine) as session, session.begin():
            assert outbox.resume_queue(session, "p") is False
            assert outbox.paused_queues(session) == []
            with pytest.raises(ValueError):
                outbox.pause_queue(session, "no spaces")

    # Resuming tells the relay at commit (nothing else runs now to notify).
    with Session(engine) as session, session.begin():
        outbox.pause_queue(session, "p")
    with psycopg.connect(services[0].conninfo, autocommit=True) as listener:
        listener.execute('LISTEN "public.outbox"')
        with Session(engine) as session, session.begin():
            assert outbox.resume_queue(session, "p") is True
        heard = next(listener.notifies(timeout=10, stop_after=1), None)
        assert heard is not None and heard.channel == "public.outbox"


# --------------------------------------------------------------------------- explain


async def test_explain_a_due_job_without_a_relay_one_without_a_handler_and_no_consumer(
    services, engine: Engine, async_engine: AsyncEngine, pg
) -> None:
    registry = Registry()

    @registry.handler("known")
    async def known(j: consumers.Job) -> None:
        return None

    known_id = enqueue(engine, "known")
    future_id = enqueue(engine, "known", run_after=timedelta(hours=1))
    stranger_id = enqueue(engine, "stranger")
    lonely_id = enqueue(engine, "known", queue="lonely")
    async with consumer_running(*services, registry):
        # No relay runs: the wake-up waits in the outbox, and explain says why.
        why = explain(engine, known_id)
        assert (why.state, why.codes) == ("QUEUED", ["WAKEUP_PENDING", "NO_RELAY"]), why
        assert why.blocker("NO_RELAY").facts == {"relays_live": 0, "last_seen_at": None}  # type: ignore[union-attr]
        assert "no relay is running" in why.summary
        facts = why.blockers[0].facts
        assert facts["sent"] is False and facts["outbox_lag_seconds"] >= 0
        assert facts["due_since"] <= why.checked_at

        why = explain(engine, future_id)
        assert why.codes == ["NOT_DUE", "NO_RELAY"], why
        assert 3500 < why.blockers[0].facts["in_seconds"] <= 3600
        assert why.blockers[0].facts["run_after"] == why.run_after

        # Behind the known job in the queue, and nothing drains yet: no estimate.
        why = explain(engine, stranger_id)
        assert why.codes == ["WAKEUP_PENDING", "BACKLOG", "NO_RELAY", "NO_HANDLER"], why
        backlog = why.blocker("BACKLOG").facts  # type: ignore[union-attr]
        assert (backlog["ahead"], backlog["drain_per_s"]) == (1, 0)
        assert backlog["estimated_start_in_seconds"] is None
        assert why.blocker("NO_HANDLER").facts == {  # type: ignore[union-attr]
            "job_type": "stranger",
            "workers_on_queue": 1,
            "parked": False,
        }

        why = explain(engine, lonely_id)
        assert why.codes == ["WAKEUP_PENDING", "NO_RELAY", "NO_CONSUMER"], why
        assert why.blocker("NO_CONSUMER").facts == {"queue": "lonely", "live_workers": 0}  # type: ignore[union-attr]

        async with relay_running(*services):
            await wait_for_state(pg, known_id, "SUCCEEDED")
            # The consumer turns the stranger down: it waits, parked, for a handler.
            await until(lambda: job(pg, stranger_id)["delay_reason"] == "NO_HANDLER", "parking")
            async with AsyncSession(async_engine) as session:
                why = await outbox.explain_async(session, stranger_id)
            assert why.codes == ["NO_HANDLER"], why
            assert why.blockers[0].facts["parked"] is True

    why = explain(engine, known_id)
    assert (why.outcome, why.blockers, why.lease) == ("SUCCEEDED", [], None)
    assert why.summary.startswith("SUCCEEDED at ") and why.finished_at is not None
    assert why.as_dict()["outcome"] == "SUCCEEDED"

    with pytest.raises(outbox.JobNotFound) as missing:
        explain(engine, uuid.uuid4())
    assert isinstance(missing.value, LookupError) and "no job" in str(missing.value)
    with pytest.raises(ValueError, match="job_id"):
        explain(engine, "not-a-uuid")
    with pytest.raises(TypeError, match="job_id"):
        explain(engine, 42)  # type: ignore[arg-type]


async def test_explain_running_capped_backing_off_and_cancel_requested_jobs(
    services, engine: Engine, pg
) -> None:
    registry = Registry()
    started = asyncio.Event()

    let_go = asyncio.Event()

    @registry.handler("hold")
    async def hold(j: consumers.Job) -> None:
        await j.progress(1, total=3, stage="warming up")  # type: ignore[misc]
        started.set()
        # It stops only once the test has looked at it while the cancel was pending.
        while not (j.cancel_requested and let_go.is_set()):
            await asyncio.sleep(0.05)
        raise consumers.Cancel("asked to")

    @registry.handler("backs_off", backoff=Backoff(base=3600, cap=3600, jitter=0.0))
    async def backs_off(j: consumers.Job) -> None:
        raise TimeoutError("upstream slow")

    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_running=1)
    holder = enqueue(engine, "hold", tenant="acme")
    retrying = enqueue(engine, "backs_off")
    async with (
        relay_running(*services),
        consumer_running(*services, registry, heartbeat_seconds=0.2, lease_seconds=5),
    ):
        await asyncio.wait_for(started.wait(), 20)
        await until(lambda: job(pg, holder)["progress"], "the progress report")
        why = explain(engine, holder)
        assert (why.state, why.blockers) == ("RUNNING", []), why
        lease = why.lease or {}
        assert lease["worker"] == job(pg, holder)["lease_owner"]
        assert lease["progress"] == {"done": 1, "total": 3, "stage": "warming up"}
        assert lease["lease_expires_at"] > why.checked_at and lease["last_heartbeat_at"]

        # The holder keeps acme's only slot: a second acme job waits for it.
        capped = enqueue(engine, "hold", tenant="acme")
        await until(
            lambda: pg.execute(
                "SELECT 1 FROM fair_shares WHERE tenant = 'acme' AND held_reason = 'TENANT_CAP'"
            ).fetchone(),
            "the relay to hold acme back",
        )
        why = explain(engine, capped)
        assert "TENANT_CAP" in why.codes, why
        assert why.blocker("TENANT_CAP").facts == {  # type: ignore[union-attr]
            "tenant": "acme",
            "running": 1,
            "max_running": 1,
        }

        row = await wait_for_state(pg, retrying, "RETRY_WAIT")
        why = explain(engine, retrying)
        assert why.codes == ["RETRY_BACKOFF"], why
        facts = why.blockers[0].facts
        assert facts["until"] == row["run_after"] and 3500 < facts["in_seconds"] <= 3600
        assert (facts["attempt"], facts["last_error_code"]) == (1, "TimeoutError")
        assert "upstream slow" in facts["last_error_message"]

        with Session(engine) as session, session.begin():
            assert outbox.request_cancel(session, holder) == "CANCEL_REQUESTED"
        why = explain(engine, holder)
        assert (why.state, why.codes) == ("CANCEL_REQUESTED", ["CANCEL_REQUESTED"]), why
        requested = job(pg, holder)["cancel_requested_at"]
        assert why.blockers[0].facts == {"requested_at": requested, "forced": False}
        assert why.lease is not None and "asked to stop" in why.summary
        let_go.set()
        await wait_for_state(pg, holder, "CANCELLED")
        # The freed slot goes to the capped job.
        await wait_for_state(pg, capped, "RUNNING")
        with Session(engine) as session, session.begin():
            outbox.request_cancel(session, capped)
        await wait_for_state(pg, capped, "CANCELLED")


async def test_explain_a_job_behind_a_backlog(services, engine: Engine, pg) -> None:
    registry = Registry()

    @registry.handler("slow")
    async def slow(j: consumers.Job) -> None:
        await asyncio.sleep(0.4)

    ids = enqueue_many(engine, [NewJob("slow", {"n": i}) for i in range(14)])
    last = ids[-1]
    async with (
        relay_running(*services, window=2),
        consumer_running(*services, registry, concurrency=1),
    ):
        await until(
            lambda: (
                pg.execute("SELECT count(*) FROM jobs WHERE state = 'SUCCEEDED'").fetchone()[0] >= 2
            ),
            "something to drain",
        )
        why = explain(engine, last)
        assert why.state == "QUEUED" and "BACKLOG" in why.codes, why
        facts = why.blocker("BACKLOG").facts  # type: ignore[union-attr]
        assert facts["ahead"] >= 5 and not facts["ahead_at_least"]
        assert facts["ahead"] == facts["in_flight"] + facts["pending_ahead"]
        assert facts["in_flight"] <= 2, "the window"
        assert facts["drain_per_s"] > 0
        assert facts["estimated_start_in_seconds"] == pytest.approx(
            facts["ahead"] / facts["drain_per_s"], abs=0.1
        )
        # One tenant, a full window: the relay held the rest back for the window.
        assert facts["held_reason"] == "WINDOW"
        assert "WAKEUP_PENDING" in why.codes, "its wake-up waits behind the window"
        assert why.summary.startswith("QUEUED: ")
        for job_id in ids:
            await wait_for_state(pg, job_id, "SUCCEEDED")


# ------------------------------------------------------------------------- retention


async def test_retention_deletes_only_old_finished_jobs_and_frees_their_dedup_keys(
    services, engine: Engine, pg
) -> None:
    registry = Registry()
    release = asyncio.Event()

    @registry.handler("noop")
    async def noop(j: consumers.Job) -> None:
        return None

    @registry.handler("effect")
    async def effect(j: consumers.Job) -> None:
        async with j.transaction() as tx:
            await tx.once(f"effect:{j.payload['key']}")

    @registry.handler("fails")
    async def fails(j: consumers.Job) -> None:
        raise consumers.Permanent("no")

    @registry.handler("hold")
    async def hold(j: consumers.Job) -> None:
        await release.wait()

    with pytest.raises(ConfigError):
        RelaySettings(services[0], services[1], keep_finished=0)
    old_ok = enqueue(engine, "noop", dedup_key="k1")
    old_failed = enqueue(engine, "fails")
    old_effect = enqueue(engine, "effect", {"key": "old"})
    young = enqueue(engine, "effect", {"key": "young"}, dedup_key="k2")
    waiting = enqueue(engine, "noop", run_after=timedelta(hours=1))
    running = enqueue(engine, "hold")
    old = [old_ok, old_failed, old_effect]
    async with (
        relay_running(*services, keep_finished=600, retention_interval=0.1) as relay,
        consumer_running(*services, registry),
    ):
        for job_id in [old_ok, old_effect, young]:
            await wait_for_state(pg, job_id, "SUCCEEDED")
        await wait_for_state(pg, old_failed, "FAILED")
        await wait_for_state(pg, running, "RUNNING")
        assert enqueue(engine, "noop", dedup_key="k1") == old_ok, "the key is taken"
        assert pg.execute("SELECT count(*) FROM job_effects").fetchone()[0] == 2
        # A replayed job has a replay row, which goes with it.
        with Session(engine) as session, session.begin():
            outbox.retry_job(session, old_failed)
        await until(lambda: job(pg, old_failed)["attempt_count"] == 2, "the replayed attempt")
        await wait_for_state(pg, old_failed, "FAILED")
        # Finished an hour ago: past the horizon. A waiting and a running job get an
        # old finished_at too, which no statement would write: the state still
        # protects them.
        pg.execute(
            "UPDATE jobs SET finished_at = now() - interval '1 hour' WHERE job_id = ANY(%s)",
            [[*old, waiting, running]],
        )
        await until(
            lambda: (
                pg.execute("SELECT count(*) FROM jobs WHERE job_id = ANY(%s)", [old]).fetchone()[0]
                == 0
            ),
            "retention to delete the old jobs",
        )
        await chore_rounds(relay, "retention", 3)
        left = dict(pg.execute("SELECT job_id, state FROM jobs").fetchall())
        assert left == {young: "SUCCEEDED", waiting: "QUEUED", running: "RUNNING"}
        for table in ("job_attempts", "outbox", "job_replays"):
            orphans = pg.execute(
                f"SELECT count(*) FROM {table} WHERE job_id = ANY(%s)", [old]
            ).fetchone()[0]
            assert orphans == 0, f"{table} rows of deleted jobs remain"
        effects = pg.execute("SELECT effect_key FROM job_effects ORDER BY 1").fetchall()
        assert effects == [("effect:old",), ("effect:young",)], "effect keys outlive their job"
        assert attempts(pg, young), "the young job keeps its history"

        fresh = enqueue(engine, "noop", dedup_key="k1")
        assert fresh != old_ok, "the dedup key was freed"
        assert enqueue(engine, "effect", {"key": "young"}, dedup_key="k2") == young
        await wait_for_state(pg, fresh, "SUCCEEDED")
        release.set()
        await wait_for_state(pg, running, "SUCCEEDED")


def test_explain_says_when_no_relay_can_send_a_wake_up(engine: Engine, pg) -> None:
    job_id = enqueue(engine, "known")
    why = explain(engine, job_id)
    assert why.codes == ["WAKEUP_PENDING", "NO_RELAY", "NO_CONSUMER"], why
    # A relay that stopped long ago is named as last seen.
    pg.execute(
        "INSERT INTO relays (relay_id, host, pid, last_seen_at, broker_connected)"
        " VALUES ('old', 'box', 1, now() - interval '10 minutes', true)"
    )
    gone = explain(engine, job_id).blocker("NO_RELAY")
    assert gone is not None and gone.facts["last_seen_at"] is not None
    # Relays run, but none reaches RabbitMQ: another reason, and another fix.
    pg.execute(
        "INSERT INTO relays (relay_id, host, pid, last_seen_at, broker_connected)"
        " VALUES ('a', 'box', 2, now(), false), ('b', 'box', 3, now(), false)"
    )
    why = explain(engine, job_id)
    assert why.codes == ["WAKEUP_PENDING", "RELAY_DISCONNECTED", "NO_CONSUMER"], why
    assert why.blocker("RELAY_DISCONNECTED").facts == {"relays_live": 2}  # type: ignore[union-attr]
    assert "none connected to RabbitMQ" in why.summary
    pg.execute("UPDATE relays SET broker_connected = true WHERE relay_id = 'a'")
    assert explain(engine, job_id).codes == ["WAKEUP_PENDING", "NO_CONSUMER"]
    # A wake-up already out needs no relay.
    pg.execute("DELETE FROM relays")
    pg.execute("UPDATE outbox SET sent_at = now() WHERE job_id = %s", [job_id])
    assert "NO_RELAY" not in explain(engine, job_id).codes


def test_explain_says_when_a_running_jobs_lease_has_expired(engine: Engine, pg) -> None:
    running = enqueue(engine, "known", max_attempts=3)
    asked = enqueue(engine, "known")
    for job_id, state in ((running, "RUNNING"), (asked, "CANCEL_REQUESTED")):
        pg.execute(
            "UPDATE jobs SET state = %s, attempt_count = 1, max_attempts = 3,"
            " lease_owner = 'w-gone', lease_generation = 1,"
            " started_at = now() - interval '2 minutes',"
            " lease_expires_at = now() - interval '42 seconds',"
            " cancel_requested_at = CASE WHEN %s = 'CANCEL_REQUESTED' THEN now() END"
            " WHERE job_id = %s",
            (state, state, job_id),
        )
    why = explain(engine, running)
    assert why.codes == ["LEASE_EXPIRED"], why
    facts = why.blocker("LEASE_EXPIRED").facts  # type: ignore[union-attr]
    assert facts["worker"] == "w-gone" and 40 <= facts["expired_seconds_ago"] < 60
    assert facts["sweeper_moves_to"] == "RETRY_WAIT"
    assert "its lease expired" in why.summary and "move it to RETRY_WAIT" in why.summary
    why = explain(engine, asked)
    assert why.codes == ["CANCEL_REQUESTED", "LEASE_EXPIRED"], why
    assert why.blocker("LEASE_EXPIRED").facts["sweeper_moves_to"] == "CANCELLED"  # type: ignore[union-attr]
    # A lease still running is no blocker.
    pg.execute(
        "UPDATE jobs SET lease_expires_at = now() + interval '1 minute' WHERE job_id = %s",
        [running],
    )
    assert explain(engine, running).codes == []


def test_resuming_a_queue_records_who_resumed_it(engine: Engine, pg) -> None:
    enqueue(engine, "known", queue="p")
    with Session(engine) as session, session.begin():
        outbox.pause_queue(session, "p", by="alice")
        assert outbox.queue_in_use(session, "p") and not outbox.queue_in_use(session, "nope")
    with Session(engine) as session, session.begin():
        assert outbox.resume_queue(session, "p", by="bob") is True
    row = pg.execute(
        "SELECT paused, paused_by, resumed_by, resumed_at IS NOT NULL FROM queues"
    ).fetchone()
    assert row == (False, "alice", "bob", True), "who paused it last stays beside who resumed"
    with Session(engine) as session, session.begin():
        assert outbox.resume_queue(session, "p", by="carol") is False
    assert pg.execute("SELECT resumed_by FROM queues").fetchone() == ("bob",)
    with Session(engine) as session, session.begin():
        outbox.pause_queue(session, "p")
        outbox.resume_queue(session, "p")
    (who,) = pg.execute("SELECT resumed_by FROM queues").fetchone()
    assert who.startswith("root"), "by default the database role (and application)"
