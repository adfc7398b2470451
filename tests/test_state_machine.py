"""A model-based test of the job state machine against real PostgreSQL.

Hypothesis drives every transition statement of schema/queries/ but retention
(enqueue, claim, heartbeat, complete, the completion of job.transaction(), fail,
retry, snooze, cancel, give-back, sweep, cancel request, the relay's wake-up, an operator's
replay) in arbitrary orders, by several workers holding current and stale fencing
tokens, with leases expiring at will; and it races pairs of them on separate
connections: one statement holds its row locks in an open transaction while the
other arrives, then the first commits (sweeper against heartbeat, finish and claim;
a cancel request against finish; two claims; a replay against a claim and against
another replay).

After every step it checks safety: every change of state (a new job included) is
an edge that the index in schema/states.py lists for the statement that made it,
each step knowing its statement by the text it sent; terminal states are absorbing
but for an operator's replay, which moves only FAILED and CANCELLED jobs, to
QUEUED, keeping their attempts and history, with a fresh budget of the job's own
size and a record of the replay; a write through a stale token or an expired lease
changes nothing, generations never go down, attempts stay within budget, the
history has one row per ended attempt, tenant slots held equal leases holding one.
And liveness: every job waiting to run has a wake-up on its way (one waiting in the
outbox, or one sent and not yet taken up, which the re-waker sends again if it was
lost), unless it waits for a consumer that knows its type.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.states import CLAIMABLE, LEASED, REPLAYABLE, TERMINAL, JobState, edges_of

WORKERS = ["w1", "w2", "w3"]
TENANTS = [None, "capped"]
# What a rule that acts on a lease draws: an index into the handles there are.
PICK = st.integers(0, 1_000_000)
COLUMNS = (
    "job_id, state, attempt_count, max_attempts, lease_owner, lease_expires_at,"
    " lease_generation, last_error_code, run_after, updated_at, holds_slot, tenant,"
    " delay_reason, approval"
)


def terms(budget: int, known: bool = True) -> str:
    if not known:
        return "[]"
    return json.dumps(
        [
            {
                "job_type": "t",
                "max_attempts": budget,
                "backoff_base": 1,
                "backoff_cap": 10,
                "backoff_jitter": 0.25,
                "sync": False,
            }
        ]
    )


# Each statement's name, by its text: what a step ran is known by what it sent.
NAMES = {text: name for name in q.__all__ if isinstance(text := getattr(q, name), str)}


def _made_by(ran: Sequence[str], before: JobState | None, after: JobState | None) -> bool:
    """Whether the named statements, run in this order, each making at most one of
    the edges the index lists for it, can take a job from ``before`` to ``after``
    (None: no row)."""
    states = {before}
    for name in ran:
        states |= {to for frm, to in edges_of(name) if frm in states}
    return after in states


def _held(rows: dict[uuid.UUID, dict[str, Any]], h: Handle) -> bool:
    old = rows[h.job_id]
    return bool(
        old["state"] in LEASED
        and old["lease_owner"] == h.worker
        and old["lease_generation"] == h.generation
    )


def _applied(rows: list[tuple[Any, ...]]) -> bool:
    """Whether a worker statement's result says it changed its job: a heartbeat or
    an outcome returns the job's state when it applied, LOCKED or nothing when not."""
    return any(len(row) > 1 and row[1] not in (None, "LOCKED") for row in rows)


def _cancel(job_id: Any, force: bool) -> dict[str, Any]:
    """A cancel request's parameters: no job type here declares a policy."""
    return {"job_id": job_id, "force": force, "override": False, "by": "model"}


@dataclass(frozen=True)
class Handle:
    """What a worker holds after a claim: it may be stale by the time it is used."""

    job_id: uuid.UUID
    worker: str
    generation: int


@dataclass(frozen=True)
class Step:
    sql: LiteralString
    params: dict[str, Any]
    writer: Handle | None = None
    # An operator's statement (a replay), which may leave FAILED and CANCELLED.
    by_operator: bool = False

    @property
    def name(self) -> str:
        """The statement of schema.queries this step runs (KeyError: none)."""
        return NAMES[self.sql]


class JobMachine(RuleBasedStateMachine):
    def __init__(self, db: DatabaseUrl) -> None:
        super().__init__()
        self.conn = psycopg.connect(db.conninfo, autocommit=True)
        self.other = psycopg.connect(db.conninfo, autocommit=True)
        self.conn.execute("TRUNCATE jobs, tenant_limits, fair_shares, workers CASCADE")
        self.conn.execute(
            q.TENANT_LIMIT_SET,
            {
                "tenant": "capped",
                "max_running": 1,
                "weight": 1.0,
                "max_queued": None,
                "max_enqueue_rate": None,
                "runners": "shared",
            },
        )
        self.jobs: list[uuid.UUID] = []
        self.handles: list[Handle] = []
        self.max_generation: dict[uuid.UUID, int] = {}
        # attempt_count at each job's latest replay: its budget counts from there.
        self.replayed_at: dict[uuid.UUID, int] = {}

    def teardown(self) -> None:
        self.conn.close()
        self.other.close()

    # -------------------------------------------------------------- the model's eyes

    def rows(self) -> dict[uuid.UUID, dict[str, Any]]:
        cur = self.conn.execute(f"SELECT {COLUMNS} FROM jobs")
        names = [d.name for d in cur.description or []]
        return {r[0]: dict(zip(names, r, strict=True)) for r in cur.fetchall()}

    def now(self) -> Any:
        return self.conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]

    def check(
        self,
        before: dict[uuid.UUID, dict[str, Any]],
        writer: Handle | None = None,
        *,
        ran: Sequence[str],
        live_lease_only: bool = False,
        now: Any = None,
        by_operator: bool = False,
    ) -> dict[uuid.UUID, dict[str, Any]]:
        """What the statements just run (``ran``, in order) did to every job must be
        what the index lists for them; a write through a handle that no longer held
        its job must have changed nothing."""
        after = self.rows()
        for job_id in after.keys() - before.keys():
            new_state = JobState(after[job_id]["state"])
            assert _made_by(ran, None, new_state), f"{ran} made a new job {new_state}"
        for job_id, old in before.items():
            old_state = JobState(old["state"])
            if job_id not in after:
                assert _made_by(ran, old_state, None), f"{ran} deleted a {old_state} job"
                continue
            new = after[job_id]
            new_state = JobState(new["state"])
            assert _made_by(ran, old_state, new_state), (
                f"{old_state} -> {new_state} is not an edge schema/states.py lists for {ran}"
            )
            if old_state in TERMINAL and new_state == old_state:
                assert new == old, "terminal states are absorbing"
            elif old_state in TERMINAL:
                assert by_operator and old_state in REPLAYABLE, "only a replay leaves"
                self.check_replayed(job_id, old, new)
            assert new["lease_generation"] >= old["lease_generation"]
            if new["lease_generation"] > old["lease_generation"]:
                assert new["lease_generation"] == old["lease_generation"] + 1, "one claim wins"
                assert new["attempt_count"] == old["attempt_count"] + 1, "counted at claim"
        if writer is not None:
            old = before[writer.job_id]
            holds = (
                old["state"] in LEASED
                and old["lease_owner"] == writer.worker
                and old["lease_generation"] == writer.generation
            )
            if not holds:
                assert after[writer.job_id] == old, "a stale write landed"
            if live_lease_only and holds and old["lease_expires_at"] <= now:
                assert after[writer.job_id] == old, "an expired lease was revived"
        return after

    def check_replayed(self, job_id: uuid.UUID, old: dict[str, Any], new: dict[str, Any]) -> None:
        """A replayed job keeps its attempts and generation, gets a fresh budget of
        its own size (or keeps it unset), and the replay is recorded."""
        if new["state"] != JobState.QUEUED or new["attempt_count"] != old["attempt_count"]:
            return  # replayed, then moved on by a second statement of a race
        assert new["lease_generation"] == old["lease_generation"]
        if old["max_attempts"] is None:
            assert new["max_attempts"] is None
        else:
            budget = old["max_attempts"] - self.replayed_at.get(job_id, 0)
            assert new["max_attempts"] == new["attempt_count"] + budget, "a fresh budget"
        row = self.conn.execute(
            "SELECT from_state, attempts_before FROM job_replays WHERE job_id = %s"
            " ORDER BY id DESC LIMIT 1",
            [job_id],
        ).fetchone()
        assert row == (old["state"], old["attempt_count"]), "the replay is recorded"
        self.replayed_at[job_id] = old["attempt_count"]

    def step(self, s: Step, *, live_lease_only: bool = False) -> list[tuple[Any, ...]]:
        before, now = self.rows(), self.now()
        rows = self.conn.execute(s.sql, s.params).fetchall()
        self.check(
            before,
            s.writer,
            ran=[s.name],
            live_lease_only=live_lease_only,
            now=now,
            by_operator=s.by_operator,
        )
        return rows

    def race(self, first: Step, second: Step) -> None:
        """``first`` runs in an open transaction holding its row locks; ``second``
        arrives meanwhile on another connection (it waits or skips, as its
        statement says); then ``first`` commits and ``second`` finishes."""
        before = self.rows()
        done = threading.Event()
        results: dict[str, list[tuple[Any, ...]]] = {}
        failure: list[BaseException] = []

        def run_second() -> None:
            try:
                results["second"] = self.other.execute(second.sql, second.params).fetchall()
            except BaseException as exc:
                failure.append(exc)
            finally:
                done.set()

        with self.conn.transaction():
            results["first"] = self.conn.execute(first.sql, first.params).fetchall()
            racer = threading.Thread(target=run_second)
            racer.start()
            # Either it finished (skipped the locks) or it waits on them.
            done.wait(0.2)
        racer.join(10)
        assert not racer.is_alive(), "the second statement never finished"
        assert not failure, failure
        self.check(
            before,
            ran=[first.name, second.name],
            by_operator=first.by_operator or second.by_operator,
        )
        for key, step in (("first", first), ("second", second)):
            if step.writer is not None and not _held(before, step.writer):
                assert not _applied(results[key]), f"a stale {key} write was applied"
        self.remember_claims(before)

    def handle(self, pick: int) -> Handle | None:
        """The handle a rule acts on, picked from a fixed range whatever there is:
        how many handles there are depends on what the database did (a race), and a
        precondition or a draw that followed it would make Hypothesis replay an
        example differently (FlakyStrategyDefinition)."""
        return self.handles[pick % len(self.handles)] if self.handles else None

    def remember_claims(self, before: dict[uuid.UUID, dict[str, Any]]) -> None:
        for job_id, row in self.rows().items():
            if row["lease_generation"] > before[job_id]["lease_generation"]:
                self.handles.append(Handle(job_id, row["lease_owner"], row["lease_generation"]))

    # -------------------------------------------------------------- statements

    def claim_step(self, job_id: uuid.UUID, worker: str, budget: int = 3) -> Step:
        return Step(
            q.JOB_CLAIM_MANY,
            {
                "job_ids": [job_id],
                "types": terms(budget),
                "free_threads": 0,
                "concurrency": 10,
                "free_slots": 10,
                "worker": worker,
                "lease_seconds": 60,
                "worker_ttl": 60,
                "tenants": [],
                "queues": ["default"],
            },
        )

    def finish_step(
        self, h: Handle, kind: str, delay: float = 0, sql: LiteralString = q.JOB_FINISH_MANY
    ) -> Step:
        outcome = {
            "job_id": str(h.job_id),
            "generation": h.generation,
            "kind": kind,
            "error_code": None if kind == "succeeded" else "E",
            "error_message": "m",
            "traceback": None,
            "delay_seconds": delay,
            "result": None,
        }
        return Step(sql, {"outcomes": json.dumps([outcome]), "worker": h.worker}, h)

    def heartbeat_step(self, h: Handle) -> Step:
        fence = json.dumps([{"job_id": str(h.job_id), "generation": h.generation}])
        return Step(
            q.JOB_HEARTBEAT_MANY, {"jobs": fence, "worker": h.worker, "lease_seconds": 60}, h
        )

    SWEEP = Step(q.JOB_SWEEP_EXPIRED, {"limit": 100, "default_backoff": 1})

    def replay_step(self, job_id: uuid.UUID) -> Step:
        return Step(
            q.JOB_REPLAY, {"job_id": job_id, "by": "model", "override": False}, by_operator=True
        )

    def expire(self, job_id: uuid.UUID) -> None:
        """Not a transition: the clock moves past a lease (the worker froze)."""
        self.conn.execute(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 second'"
            " WHERE job_id = %s AND lease_expires_at IS NOT NULL",
            [job_id],
        )

    def come_due(self, job_id: uuid.UUID) -> None:
        """Not a transition: a waiting job's run_after, and its wake-up, come due.
        Only forward: a time already past stays (moved later, it would fall after
        the wake-up sent for it, which then no longer counts as untaken)."""
        self.conn.execute(
            "UPDATE jobs SET run_after = now() - interval '1 millisecond'"
            " WHERE job_id = %s AND run_after > now()"
            " AND (state = 'RETRY_WAIT' OR (state = 'QUEUED' AND delay_reason = 'SNOOZED'))",
            [job_id],
        )
        self.conn.execute(
            "UPDATE outbox SET available_at = now() - interval '1 millisecond'"
            " WHERE job_id = %s AND sent_at IS NULL AND available_at > now()",
            [job_id],
        )

    # -------------------------------------------------------------- rules

    @rule(
        max_attempts=st.one_of(st.none(), st.integers(1, 4)),
        tenant=st.sampled_from(TENANTS),
        approval=st.sampled_from([None, None, "REQUIRED"]),
    )
    def enqueue(
        self, max_attempts: int | None, tenant: str | None, approval: str | None = None
    ) -> None:
        job_id = uuid.uuid4()
        doc = [
            {
                "job_id": str(job_id),
                "job_type": "t",
                "queue": "default",
                "tenant": tenant,
                "payload": {},
                "max_attempts": max_attempts,
                "priority": 0,
                "approval": approval,
            }
        ]
        self.step(Step(q.JOB_INSERT_MANY, {"jobs": json.dumps(doc)}))
        self.jobs.append(job_id)
        self.max_generation[job_id] = 0

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), worker=st.sampled_from(WORKERS), budget=st.integers(1, 4))
    def claim(self, data: st.DataObject, worker: str, budget: int) -> None:
        job_id = data.draw(st.sampled_from(self.jobs))
        before = self.rows()
        self.step(self.claim_step(job_id, worker, budget))
        after = self.rows()[job_id]
        if after["lease_generation"] > before[job_id]["lease_generation"]:
            assert before[job_id]["state"] in CLAIMABLE
            assert before[job_id]["approval"] != "REQUIRED", "claimed before approval"
            self.handles.append(Handle(job_id, worker, after["lease_generation"]))
            if before[job_id]["max_attempts"] is None:
                assert after["max_attempts"] == max(budget, after["attempt_count"])

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), worker=st.sampled_from(WORKERS))
    def a_consumer_without_the_handler_is_woken(self, data: st.DataObject, worker: str) -> None:
        """It turns the job down: the job waits for a consumer that knows its type,
        spending nothing."""
        job_id = data.draw(st.sampled_from(self.jobs))
        before = self.rows()[job_id]
        step = self.claim_step(job_id, worker)
        self.step(Step(step.sql, step.params | {"types": terms(1, known=False)}))
        after = self.rows()[job_id]
        assert after["attempt_count"] == before["attempt_count"], "no attempt spent"

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def a_consumer_with_the_handler_announces_itself(self, data: st.DataObject) -> None:
        self.step(
            Step(q.JOB_WAKE_PARKED, {"queues": ["default"], "job_types": ["t"], "tenants": []})
        )

    @rule(pick=PICK)
    def complete(self, pick: int) -> None:
        if (h := self.handle(pick)) is None:
            return
        self.step(self.finish_step(h, "succeeded"))

    @rule(pick=PICK)
    def complete_in_the_jobs_own_transaction(self, pick: int) -> None:
        """job.transaction(): the completion that commits with the handler's writes,
        which waits for a row lock where the reporter's would skip it."""
        if (h := self.handle(pick)) is None:
            return
        self.step(self.finish_step(h, "succeeded", sql=q.JOB_FINISH_MANY_IN_TX))

    @rule(pick=PICK, delay=st.sampled_from([0.0, 3600.0]))
    def fail_and_retry(self, pick: int, delay: float) -> None:
        if (h := self.handle(pick)) is None:
            return
        self.step(self.finish_step(h, "retry", delay))

    @rule(pick=PICK, delay=st.sampled_from([0.0, 3600.0]))
    def snooze(self, pick: int, delay: float) -> None:
        """Not yet: back to waiting, the attempt refunded."""
        if (h := self.handle(pick)) is None:
            return
        self.step(self.finish_step(h, "snoozed", delay))

    @rule(pick=PICK)
    def fail_permanently(self, pick: int) -> None:
        if (h := self.handle(pick)) is None:
            return
        self.step(self.finish_step(h, "failed"))

    @rule(pick=PICK)
    def acknowledge_cancel(self, pick: int) -> None:
        if (h := self.handle(pick)) is None:
            return
        self.step(self.finish_step(h, "cancelled"))

    @rule(pick=PICK)
    def heartbeat(self, pick: int) -> None:
        if (h := self.handle(pick)) is None:
            return
        self.step(self.heartbeat_step(h))

    @rule(pick=PICK)
    def a_worker_wakes_after_its_lease_ran_out(self, pick: int) -> None:
        """A worker frozen past its lease wakes before the sweeper ran and heartbeats:
        the lease must stay expired (someone may be about to take the job)."""
        if (h := self.handle(pick)) is None:
            return
        self.expire(h.job_id)
        self.step(self.heartbeat_step(h), live_lease_only=True)

    @rule(pick=PICK)
    def give_back(self, pick: int) -> None:
        if (h := self.handle(pick)) is None:
            return
        fence = json.dumps([{"job_id": str(h.job_id), "generation": h.generation}])
        self.step(Step(q.JOB_GIVE_BACK_MANY, {"jobs": fence, "worker": h.worker}, h))

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def request_cancel(self, data: st.DataObject) -> None:
        job_id, force = data.draw(st.sampled_from(self.jobs)), data.draw(st.booleans())
        self.step(Step(q.JOB_REQUEST_CANCEL, _cancel(job_id, force)))

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def an_operator_replays_a_job(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.jobs))
        before = self.rows()[job_id]
        rows = self.step(self.replay_step(job_id))
        assert bool(rows) == (before["state"] in REPLAYABLE), "only FAILED and CANCELLED move"

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def an_operator_approves_a_job(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.jobs))
        before = self.rows()[job_id]
        rows = self.step(Step(q.JOB_APPROVE, {"job_id": job_id, "by": "model"}))
        waited = before["state"] == "QUEUED" and before["approval"] == "REQUIRED"
        assert bool(rows) == waited, "only a job that waits for approval is approved"

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def an_operator_rejects_a_job(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.jobs))
        before = self.rows()[job_id]
        params = {"job_id": job_id, "by": "model", "reason": "no"}
        rows = self.step(Step(q.JOB_REJECT, params))
        waited = before["state"] == "QUEUED" and before["approval"] == "REQUIRED"
        assert bool(rows) == waited, "only a job that waits for approval is rejected"

    @rule(limit=st.integers(1, 3))
    def an_operator_replays_by_filter(self, limit: int) -> None:
        before = self.rows()
        filters = {"queue": "default", "job_type": None, "error_code": None}
        params = filters | {
            "finished_after": None,
            "limit": limit,
            "by": "model",
            "states": ["CANCELLED", "FAILED"],
            "override": False,
        }
        ((replayed, _),) = self.step(Step(q.JOB_REPLAY_MATCHING, params, by_operator=True))
        replayable = sum(1 for r in before.values() if r["state"] in REPLAYABLE)
        assert len(replayed) == min(limit, replayable), "the oldest, up to the limit"

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def time_passes_for_a_lease(self, data: st.DataObject) -> None:
        self.expire(data.draw(st.sampled_from(self.jobs)))

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def time_passes_for_a_retry(self, data: st.DataObject) -> None:
        self.come_due(data.draw(st.sampled_from(self.jobs)))

    @rule()
    def sweep(self) -> None:
        self.step(self.SWEEP)

    @rule(window=st.sampled_from([1, 3, 100]))
    def the_relay_wakes_the_queue(self, window: int) -> None:
        """Marks wake-ups sent, within the window; the messages themselves are not
        part of this model (a lost one is the re-waker's, below)."""
        with self.conn.transaction():
            self.step(
                Step(
                    q.OUTBOX_WAKE_QUEUE,
                    {
                        "queue": "default",
                        "limit": 100,
                        "window": window,
                        "min_window": 1,
                        "slack": 0,
                        "worker_ttl": 60,
                        "bulk": 1000,
                        "near": False,
                        "scan": 32,
                    },
                )
            )

    @rule()
    def the_rewaker_resends_lost_wakeups(self) -> None:
        self.step(Step(q.OUTBOX_REWAKE_LOST, {"queues": ["default"], "grace_seconds": 0}))

    @rule()
    def the_relay_brings_refused_wakeups_forward(self) -> None:
        """For a consumer with the handler and a free slot, if any is live."""
        self.step(Step(q.OUTBOX_WAKE_REFUSED, {"worker_ttl": 60}))

    @rule(pick=PICK, thief=st.sampled_from(WORKERS))
    def a_frozen_worker_is_overtaken(self, pick: int, thief: str) -> None:
        """The story the fence exists for, as one rule so it comes up often: a
        worker's lease lapses, the sweeper re-queues the job, another worker claims
        it; the frozen worker's handle is now stale and later rules will use it."""
        if (h := self.handle(pick)) is None:
            return
        self.expire(h.job_id)
        self.step(self.SWEEP)
        self.come_due(h.job_id)
        before = self.rows()
        self.step(self.claim_step(h.job_id, thief))
        self.remember_claims(before)

    # -------------------------------------------------------------- races

    @rule(pick=PICK, sweeper_first=st.booleans())
    def race_the_sweeper_and_a_heartbeat(self, pick: int, sweeper_first: bool) -> None:
        if (h := self.handle(pick)) is None:
            return
        self.expire(h.job_id)
        pair = (self.SWEEP, self.heartbeat_step(h))
        self.race(*(pair if sweeper_first else pair[::-1]))

    @rule(
        pick=PICK,
        sweeper_first=st.booleans(),
        kind=st.sampled_from(["succeeded", "retry", "snoozed", "failed", "cancelled", "in_tx"]),
    )
    def race_the_sweeper_and_an_outcome(self, pick: int, sweeper_first: bool, kind: str) -> None:
        """in_tx: the completion of job.transaction(), which waits for the lock."""
        if (h := self.handle(pick)) is None:
            return
        self.expire(h.job_id)
        outcome = (
            self.finish_step(h, "succeeded", sql=q.JOB_FINISH_MANY_IN_TX)
            if kind == "in_tx"
            else self.finish_step(h, kind)
        )
        pair = (self.SWEEP, outcome)
        self.race(*(pair if sweeper_first else pair[::-1]))

    @rule(pick=PICK, sweeper_first=st.booleans(), thief=st.sampled_from(WORKERS))
    def race_the_sweeper_and_a_claim(self, pick: int, sweeper_first: bool, thief: str) -> None:
        if (h := self.handle(pick)) is None:
            return
        self.expire(h.job_id)
        pair = (self.SWEEP, self.claim_step(h.job_id, thief))
        self.race(*(pair if sweeper_first else pair[::-1]))

    @rule(
        pick=PICK,
        force=st.booleans(),
        cancel_first=st.booleans(),
        kind=st.sampled_from(["succeeded", "retry", "snoozed", "failed"]),
    )
    def race_a_cancel_request_and_an_outcome(
        self, pick: int, force: bool, cancel_first: bool, kind: str
    ) -> None:
        if (h := self.handle(pick)) is None:
            return
        cancel = Step(q.JOB_REQUEST_CANCEL, _cancel(h.job_id, force))
        pair = (cancel, self.finish_step(h, kind))
        self.race(*(pair if cancel_first else pair[::-1]))

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), first=st.sampled_from(WORKERS), second=st.sampled_from(WORKERS))
    def race_two_claims(self, data: st.DataObject, first: str, second: str) -> None:
        job_id = data.draw(st.sampled_from(self.jobs))
        self.race(self.claim_step(job_id, first), self.claim_step(job_id, second))

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def race_two_replays(self, data: st.DataObject) -> None:
        """Two operators replay the same job at once: the second waits for the
        first, then finds it QUEUED and leaves it; one replay is recorded."""
        job_id = data.draw(st.sampled_from(self.jobs))
        count = "SELECT count(*) FROM job_replays WHERE job_id = %s"
        replays = self.conn.execute(count, [job_id]).fetchone()[0]  # type: ignore[index]
        replayable = self.rows()[job_id]["state"] in REPLAYABLE
        self.race(self.replay_step(job_id), self.replay_step(job_id))
        after = self.conn.execute(count, [job_id]).fetchone()[0]  # type: ignore[index]
        assert after == replays + (1 if replayable else 0), "replayed once"

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), replay_first=st.booleans(), worker=st.sampled_from(WORKERS))
    def race_a_replay_and_a_claim(
        self, data: st.DataObject, replay_first: bool, worker: str
    ) -> None:
        job_id = data.draw(st.sampled_from(self.jobs))
        pair = (self.replay_step(job_id), self.claim_step(job_id, worker))
        self.race(*(pair if replay_first else pair[::-1]))

    # -------------------------------------------------------------- invariants

    @invariant()
    def rows_are_consistent(self) -> None:
        for job_id, row in self.rows().items():
            leased = row["state"] in LEASED
            assert leased == (row["lease_owner"] is not None), "a lease exactly while leased"
            assert not row["holds_slot"] or leased, "a slot only with a lease"
            if row["max_attempts"] is not None:
                assert row["attempt_count"] <= row["max_attempts"]
            assert row["lease_generation"] >= self.max_generation[job_id]
            self.max_generation[job_id] = row["lease_generation"]

    @invariant()
    def one_history_row_per_ended_attempt(self) -> None:
        if not self.jobs:
            return
        rows = self.conn.execute(
            "SELECT j.job_id, j.state, j.attempt_count,"
            " count(a.*) FILTER (WHERE a.outcome <> 'QUEUED'), count(a.*),"
            " count(DISTINCT a.lease_generation)"
            " FROM jobs j LEFT JOIN job_attempts a USING (job_id)"
            " GROUP BY j.job_id, j.state, j.attempt_count"
        ).fetchall()
        for _, state, attempt_count, ended, history, generations in rows:
            assert history == generations, "one row per claim, each with its own token"
            # Every started attempt has ended with a row, except the running one;
            # a given-back claim has its row but was refunded.
            running = 1 if state in LEASED else 0
            assert ended == attempt_count - running

    @invariant()
    def slots_held_equal_leases_holding_one(self) -> None:
        recorded = self.conn.execute(
            "SELECT running FROM tenant_usage WHERE tenant = 'capped'"
        ).fetchone()[0]  # type: ignore[index]
        held = self.conn.execute(
            "SELECT count(*) FROM jobs WHERE tenant = 'capped' AND holds_slot"
        ).fetchone()[0]  # type: ignore[index]
        assert recorded == held, "a slot released twice, or leaked"
        assert held <= 1, "the cap of one was exceeded"

    @invariant()
    def every_waiting_job_has_a_wakeup_on_its_way(self) -> None:
        stranded = self.conn.execute(
            f"""
            SELECT w.job_id, w.state FROM jobs AS w
            WHERE w.state IN ('QUEUED', 'RETRY_WAIT')
              AND w.delay_reason IS DISTINCT FROM 'NO_HANDLER'
              AND w.approval IS DISTINCT FROM 'REQUIRED'
              AND NOT EXISTS (
                SELECT 1 FROM outbox AS o JOIN jobs AS j ON j.job_id = o.job_id
                WHERE o.job_id = w.job_id AND (o.sent_at IS NULL OR ({q.UNTAKEN})))
            """
        ).fetchall()
        assert stranded == [], "a job waits with no wake-up on its way"

    @invariant()
    def a_job_that_waits_for_approval_has_no_wakeup_that_counts(self) -> None:
        woken = self.conn.execute(
            f"""
            SELECT j.job_id FROM jobs AS j JOIN outbox AS o ON o.job_id = j.job_id
            WHERE j.approval = 'REQUIRED' AND j.state = 'QUEUED'
              AND (o.sent_at IS NULL OR ({q.UNTAKEN}))
            """
        ).fetchall()
        assert woken == [], "a wake-up before approval"


def test_the_state_machine_holds_under_arbitrary_interleavings_and_races(
    db_url: DatabaseUrl,
) -> None:
    run_state_machine_as_test(
        lambda: JobMachine(db_url),
        settings=settings(
            max_examples=40,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


@pytest.mark.parametrize("way_back", ["retry", "snooze", "give_back", "lease_expired", "replay"])
def test_each_way_back_to_waiting_sends_a_new_wakeup(db_url: DatabaseUrl, way_back: str) -> None:
    """The liveness invariant on the path random runs reach only some of the time:
    the job's first wake-up was sent and taken up, so only a new one can wake it."""
    m = JobMachine(db_url)
    try:
        m.enqueue(max_attempts=None, tenant=None)
        (job_id,) = m.jobs
        m.the_relay_wakes_the_queue(window=100)
        m.step(m.claim_step(job_id, "w1"))
        h = Handle(job_id, "w1", 1)
        if way_back == "retry":
            m.step(m.finish_step(h, "retry"))
        elif way_back == "snooze":
            m.step(m.finish_step(h, "snoozed"))
        elif way_back == "give_back":
            fence = json.dumps([{"job_id": str(job_id), "generation": 1}])
            m.step(Step(q.JOB_GIVE_BACK_MANY, {"jobs": fence, "worker": "w1"}, h))
        elif way_back == "lease_expired":
            m.expire(job_id)
            m.step(m.SWEEP)
        else:
            m.step(m.finish_step(h, "failed"))
            m.step(m.replay_step(job_id))
        assert m.rows()[job_id]["state"] in CLAIMABLE
        m.every_waiting_job_has_a_wakeup_on_its_way()
    finally:
        m.teardown()
