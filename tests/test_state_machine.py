"""A model-based test of the job state machine against real PostgreSQL.

Hypothesis drives every transition statement of schema/queries.py (claim,
heartbeat, complete, fail, retry, cancel, give-back, sweep, cancel request) in
arbitrary interleavings, by several workers holding current and stale fencing
tokens, with leases expiring at will. After every step it checks: every applied
transition is one the state machine allows, terminal states are absorbing, a write
through a stale token or an expired lease changes nothing, generations never go
down, attempts stay within budget, and the history has one row per ended attempt.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from plumbing.config import DatabaseUrl
from schema import queries as q
from schema.states import LEASED, TERMINAL, JobState, is_legal

WORKERS = ["w1", "w2", "w3"]
COLUMNS = (
    "job_id, state, attempt_count, max_attempts, lease_owner, lease_expires_at,"
    " lease_generation, last_error_code, run_after, updated_at"
)


@dataclass(frozen=True)
class Handle:
    """What a worker holds after a claim: it may be stale by the time it is used."""

    job_id: uuid.UUID
    worker: str
    generation: int


class JobMachine(RuleBasedStateMachine):
    def __init__(self, db: DatabaseUrl) -> None:
        super().__init__()
        self.conn = psycopg.connect(db.conninfo, autocommit=True)
        self.conn.execute("TRUNCATE jobs CASCADE")
        self.jobs: list[uuid.UUID] = []
        self.handles: list[Handle] = []
        self.max_generation: dict[uuid.UUID, int] = {}

    def teardown(self) -> None:
        self.conn.close()

    # -------------------------------------------------------------- the model's eyes

    def rows(self) -> dict[uuid.UUID, dict[str, Any]]:
        cur = self.conn.execute(f"SELECT {COLUMNS} FROM jobs")
        names = [d.name for d in cur.description or []]
        return {r[0]: dict(zip(names, r, strict=True)) for r in cur.fetchall()}

    def step(
        self,
        sql: str,
        params: dict[str, Any],
        writer: Handle | None = None,
        *,
        live_lease_only: bool = False,
    ) -> None:
        """Run one transition statement and check what it did to every job.

        ``writer`` is the handle a worker's write goes through; if it does not hold
        the job, nothing may change. ``live_lease_only``: the write must not apply
        through a lease that has already expired either (a heartbeat).
        """
        before = self.rows()
        now = self.conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        self.conn.execute(sql, params)
        after = self.rows()
        for job_id, old in before.items():
            new = after[job_id]
            old_state, new_state = JobState(old["state"]), JobState(new["state"])
            assert is_legal(old_state, new_state), f"{old_state} -> {new_state} by {sql[:60]}"
            if old_state in TERMINAL:
                assert new == old, "terminal states are absorbing"
            assert new["lease_generation"] >= old["lease_generation"]
            if new["lease_generation"] > old["lease_generation"]:
                assert new["lease_generation"] == old["lease_generation"] + 1
                assert new["attempt_count"] == old["attempt_count"] + 1, "counted at claim"
                assert new_state == JobState.RUNNING
        if writer is not None:
            old = before[writer.job_id]
            holds = (
                old["state"] in LEASED
                and old["lease_owner"] == writer.worker
                and old["lease_generation"] == writer.generation
            )
            if not holds:
                assert after[writer.job_id] == old, f"a stale write landed: {sql[:60]}"
            if live_lease_only and holds and old["lease_expires_at"] <= now:
                assert after[writer.job_id] == old, "an expired lease was revived"

    # -------------------------------------------------------------- rules

    @rule(max_attempts=st.one_of(st.none(), st.integers(1, 4)))
    def enqueue(self, max_attempts: int | None) -> None:
        job_id = uuid.uuid4()
        doc = [
            {
                "job_id": str(job_id),
                "job_type": "t",
                "queue": "default",
                "payload": {},
                "max_attempts": max_attempts,
                "priority": 0,
            }
        ]
        self.conn.execute(q.JOB_INSERT_MANY, {"jobs": json.dumps(doc)})
        self.jobs.append(job_id)
        self.max_generation[job_id] = 0

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), worker=st.sampled_from(WORKERS), budget=st.integers(1, 4))
    def claim(self, data: st.DataObject, worker: str, budget: int) -> None:
        job_id = data.draw(st.sampled_from(self.jobs))
        before = self.rows()[job_id]
        self.step(
            q.JOB_CLAIM_MANY,
            {
                "job_ids": [job_id],
                "budgets": json.dumps([{"job_type": "t", "max_attempts": budget}]),
                "worker": worker,
                "lease_seconds": 60,
            },
        )
        after = self.rows()[job_id]
        if after["lease_generation"] > before["lease_generation"]:
            assert before["state"] in ("QUEUED", "RETRY_WAIT")
            self.handles.append(Handle(job_id, worker, after["lease_generation"]))
            if before["max_attempts"] is None:
                assert after["max_attempts"] == max(budget, after["attempt_count"])

    def _finish(self, handle: Handle, kind: str, delay: float = 0) -> None:
        outcome = {
            "job_id": str(handle.job_id),
            "generation": handle.generation,
            "kind": kind,
            "error_code": None if kind == "succeeded" else "E",
            "error_message": "m",
            "delay_seconds": delay,
        }
        self.step(
            q.JOB_FINISH_MANY,
            {"outcomes": json.dumps([outcome]), "worker": handle.worker},
            writer=handle,
        )

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        self._finish(data.draw(st.sampled_from(self.handles)), "succeeded")

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), delay=st.sampled_from([0.0, 3600.0]))
    def fail_and_retry(self, data: st.DataObject, delay: float) -> None:
        self._finish(data.draw(st.sampled_from(self.handles)), "retry", delay)

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def fail_permanently(self, data: st.DataObject) -> None:
        self._finish(data.draw(st.sampled_from(self.handles)), "failed")

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def acknowledge_cancel(self, data: st.DataObject) -> None:
        self._finish(data.draw(st.sampled_from(self.handles)), "cancelled")

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        h = data.draw(st.sampled_from(self.handles))
        fence = json.dumps([{"job_id": str(h.job_id), "generation": h.generation}])
        self.step(
            q.JOB_HEARTBEAT_MANY, {"jobs": fence, "worker": h.worker, "lease_seconds": 60}, writer=h
        )

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def a_worker_wakes_after_its_lease_ran_out(self, data: st.DataObject) -> None:
        """A worker frozen past its lease wakes before the sweeper ran and heartbeats:
        the lease must stay expired (someone may be about to take the job)."""
        h = data.draw(st.sampled_from(self.handles))
        self.conn.execute(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 second'"
            " WHERE job_id = %s AND lease_expires_at IS NOT NULL",
            [h.job_id],
        )
        fence = json.dumps([{"job_id": str(h.job_id), "generation": h.generation}])
        self.step(
            q.JOB_HEARTBEAT_MANY,
            {"jobs": fence, "worker": h.worker, "lease_seconds": 60},
            writer=h,
            live_lease_only=True,
        )

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def give_back(self, data: st.DataObject) -> None:
        h = data.draw(st.sampled_from(self.handles))
        fence = json.dumps([{"job_id": str(h.job_id), "generation": h.generation}])
        self.step(q.JOB_GIVE_BACK_MANY, {"jobs": fence, "worker": h.worker}, writer=h)

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def request_cancel(self, data: st.DataObject) -> None:
        self.step(q.JOB_REQUEST_CANCEL, {"job_id": data.draw(st.sampled_from(self.jobs))})

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def time_passes_for_a_lease(self, data: st.DataObject) -> None:
        """Not a transition: the clock moves past a lease (the worker froze)."""
        job_id = data.draw(st.sampled_from(self.jobs))
        self.conn.execute(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 second'"
            " WHERE job_id = %s AND lease_expires_at IS NOT NULL",
            [job_id],
        )

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def time_passes_for_a_retry(self, data: st.DataObject) -> None:
        """Not a transition: a waiting job's run_after comes due."""
        job_id = data.draw(st.sampled_from(self.jobs))
        self.conn.execute(
            "UPDATE jobs SET run_after = now() WHERE job_id = %s AND state = 'RETRY_WAIT'", [job_id]
        )

    @rule()
    def sweep(self) -> None:
        self.step(q.JOB_SWEEP_EXPIRED, {"limit": 100})

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), thief=st.sampled_from(WORKERS))
    def a_frozen_worker_is_overtaken(self, data: st.DataObject, thief: str) -> None:
        """The story the fence exists for, as one rule so it comes up often: a
        worker's lease lapses, the sweeper re-queues the job, another worker claims
        it; the frozen worker's handle is now stale and later rules will use it."""
        h = data.draw(st.sampled_from(self.handles))
        self.conn.execute(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 second'"
            " WHERE job_id = %s AND lease_expires_at IS NOT NULL",
            [h.job_id],
        )
        self.step(q.JOB_SWEEP_EXPIRED, {"limit": 100})
        self.conn.execute(
            "UPDATE jobs SET run_after = now() WHERE job_id = %s AND state = 'RETRY_WAIT'",
            [h.job_id],
        )
        before = self.rows()[h.job_id]
        self.step(
            q.JOB_CLAIM_MANY,
            {"job_ids": [h.job_id], "budgets": "[]", "worker": thief, "lease_seconds": 60},
        )
        after = self.rows()[h.job_id]
        if after["lease_generation"] > before["lease_generation"]:
            self.handles.append(Handle(h.job_id, thief, after["lease_generation"]))

    # -------------------------------------------------------------- invariants

    @invariant()
    def rows_are_consistent(self) -> None:
        for job_id, row in self.rows().items():
            leased = row["state"] in LEASED
            assert leased == (row["lease_owner"] is not None), "a lease exactly while leased"
            if row["max_attempts"] is not None:
                assert row["attempt_count"] <= row["max_attempts"]
            assert row["lease_generation"] >= self.max_generation[job_id]
            self.max_generation[job_id] = row["lease_generation"]

    @invariant()
    def one_history_row_per_ended_attempt(self) -> None:
        if not self.jobs:
            return
        rows = self.conn.execute(
            "SELECT j.job_id, j.state, j.attempt_count, count(a.*),"
            " count(DISTINCT a.lease_generation)"
            " FROM jobs j LEFT JOIN job_attempts a USING (job_id)"
            " GROUP BY j.job_id, j.state, j.attempt_count"
        ).fetchall()
        for _, state, attempt_count, history, generations in rows:
            assert history == generations, "one row per attempt, each with its own token"
            # Every started attempt has ended with a row, except the running one.
            running = 1 if state in LEASED else 0
            assert history == attempt_count - running


def test_the_state_machine_holds_under_arbitrary_interleavings(db_url: DatabaseUrl) -> None:
    run_state_machine_as_test(
        lambda: JobMachine(db_url),
        settings=settings(
            max_examples=80,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
