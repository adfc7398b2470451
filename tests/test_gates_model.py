"""A model test of the gates together, against real PostgreSQL.

Hypothesis enqueues jobs through the producer, each with a random set of gates (a
key with its limit and order, a resource, a rate limit, a capped tenant, a
deadline, a type under a concurrency limit, a weight; and queue "reports" has a
concurrency limit of its own), and runs in arbitrary order the
statements that move them: claims of random batches by two workers (the plain claim
first, then the whole claim composed of the gates the rest use, as the consumer runs
them), each end of a lease (composed of what the lease holds) (success, failure,
retry, a handler's cancel, a give-back, an expiry and the sweep), a cancel request,
the deadline passing, an operator's replay, the resolution of an uncertain resource,
retention, pausing and resuming a queue, and the relay sending wake-ups (none of a
paused queue).
It races two claims, and a claim with an end of a lease, on separate connections:
the first holds its locks in an open transaction while the second arrives.

After every step it checks that:
- a key's lease count (key_usage) is the number of leases of its jobs, and a key
  with limit 1 never has two;
- a resource's hold belongs to the live lease of one of its jobs, or is uncertain,
  and every lease of a job with a resource holds it;
- a capped tenant's slots held are the weights of its leases holding one, never
  above the cap;
- a concurrency limit's running count is the weights of its type's leases holding
  a slot, never above the limit;
- the queue's limit likewise: its running count is the weights of its leases
  holding a slot, never above the limit;
- the rate limit's tokens spent are its jobs' starts (no token for a refused claim);
- no hand-off is lost: a waiting job without a key or resource has a wake-up on its
  way; a key or resource whose waiting jobs have none is held by a lease (whose end
  wakes the next) or, a key, waits behind a strict FAILED job (until a replay); and
  a free resource or unordered key with a waiting job of a queue that runs has a
  wake-up on its way for one of those (not only for one of a paused queue); a
  concurrency limit with free slots and jobs turned down for it that fit them has a
  job of its type on its way (woken, or waiting for its key or resource, whose
  hand-off comes); and so the queue's limit, with a job of the queue on its way
  (or waiting for its type's limit, whose hand-off comes).
At the end of each run, ``jobctl check`` finds nothing wrong.
"""

from __future__ import annotations

import json
import threading
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.check import check, violations
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.gates import GATES

WORKERS = ["w1", "w2"]
QUEUES = ["default", "reports"]
KEYS = ["k1", "k2"]
# Starts are counted against tokens: one token an hour refills nothing in a run.
BURST = 1000.0
# A rule picks jobs and leases by drawing indexes of a fixed range (taken modulo the
# list), and runs even when there is nothing to pick: how many jobs or leases there
# are depends on what the database did (a retry coming due with the clock, say), and
# a draw or a rule's availability that depends on it makes Hypothesis's replay of
# an example draw differently (FlakyStrategyDefinition).
PICK = st.integers(0, 63)


def _picks(most: int) -> st.SearchStrategy[list[int]]:
    return st.lists(PICK, min_size=1, max_size=most)


def _chosen(items: list[Any], picks: list[int]) -> list[Any]:
    return list(dict.fromkeys(items[i % len(items)] for i in picks)) if items else []


# "c" is the type under a concurrency limit (a handler's global_limit); the capped
# tenant's cap is as small. Jobs weigh 1 to 3: one of weight 3 fills either alone.
LIMITED = "c"
LIMIT = 3
CAP = 3
# The queue under a concurrency limit of its own (consumer --queue-limit).
LIMITED_QUEUE = "default"
QUEUE_LIMIT = 3


def _terms(*, limited: bool = True) -> str:
    """The handlers' terms; the plain claim is given no limited type's, as the
    consumer's store gives it."""
    term = {
        "job_type": "t",
        "max_attempts": 3,
        "backoff_base": 1,
        "backoff_cap": 10,
        "backoff_jitter": 0,
        "sync": False,
        "rate_limit": None,
        "global_limit": None,
    }
    return json.dumps([term, *([term | {"job_type": LIMITED, "global_limit": LIMIT}] * limited)])


def _claim_params(job_ids: list[uuid.UUID], worker: str) -> dict[str, Any]:
    return {
        "job_ids": job_ids,
        "types": _terms(),
        "free_threads": 0,
        "concurrency": 10,
        "free_slots": 10,
        "worker": worker,
        "lease_seconds": 60,
        "worker_ttl": 60,
        "tenants": [],
        "queues": QUEUES,
    }


def _outcome(job_id: uuid.UUID, generation: int, kind: str) -> dict[str, Any]:
    return {
        "job_id": str(job_id),
        "generation": generation,
        "kind": kind,
        "error_code": None if kind == "succeeded" else "E",
        "error_message": "m",
        "traceback": None,
        "delay_seconds": 0,
        "result": None,
    }


class GateMachine(RuleBasedStateMachine):
    def __init__(self, db: DatabaseUrl) -> None:
        super().__init__()
        self.db = db
        self.conn = psycopg.connect(db.conninfo, autocommit=True)
        self.other = psycopg.connect(db.conninfo, autocommit=True)
        self.conn.execute(
            "TRUNCATE jobs, outbox, key_usage, resource_holds, rate_limits, rate_buckets,"
            " tenant_limits, tenant_usage, concurrency_limits, queue_limits CASCADE"
        )
        self.conn.execute(
            q.CONCURRENCY_LIMIT_RECORD_MANY,
            {
                "limits": json.dumps([{"job_type": LIMITED, "global_limit": LIMIT}]),
                "worker": "w0",
            },
        )
        self.engine = create_engine(db.sqlalchemy)
        with Session(self.engine) as session, session.begin():
            outbox.set_tenant_limit(session, "capped", max_running=CAP)
            outbox.set_queue_limit(session, LIMITED_QUEUE, QUEUE_LIMIT)
            outbox.set_rate_limit(session, "api", rate=1, per=timedelta(hours=1), burst=BURST)
        self.jobs: list[uuid.UUID] = []
        # (job, worker, generation) of every lease a claim started; some go stale
        self.handles: list[tuple[uuid.UUID, str, int]] = []
        # the gates each lease was claimed through, as the consumer keeps them
        self.gates: dict[tuple[uuid.UUID, int], frozenset[str]] = {}
        self.api_starts = 0

    def teardown(self) -> None:
        try:
            found = violations(check(self.db.conninfo))
            found.pop("lost", None)  # jobs still waiting or running: the run stopped
            assert found == {}, found
        finally:
            self.conn.close()
            self.other.close()
            self.engine.dispose()

    # -------------------------------------------------------------- helpers

    def _claimed(self, rows: list[tuple[Any, ...]], worker: str) -> None:
        for row, gates in rows:
            if row[0] == "claimed":
                self.handles.append((row[1], worker, row[8]))
                self.gates[(row[1], row[8])] = gates
                rate = self.conn.execute(
                    "SELECT rate_limit FROM jobs WHERE job_id = %s", [row[1]]
                ).fetchone()
                self.api_starts += rate == ("api",)

    def _claim_on(
        self,
        conn: psycopg.Connection,
        ids: list[uuid.UUID],
        worker: str,
        expected: frozenset[str] = frozenset(),
    ) -> list[Any]:
        """As the consumer's store: the plain claim, or (``expected``: the gates of
        the batch before) the claim composed of those gates; then, for what that
        left 'full', the claim composed of the gates those jobs use, until none is
        left. Each row with the gates of its job."""
        params = _claim_params(ids, worker)
        taken: list[Any] = []
        if expected:
            pending, used = list(ids), expected
        else:
            plain = params | {"types": _terms(limited=False)}
            rows = conn.execute(q.JOB_CLAIM_PLAIN_MANY, plain).fetchall()
            limit = frozenset({"concurrency"})
            gates = {
                row[1]: frozenset(row[-1]) | (limit if row[2] == LIMITED else frozenset())
                for row in rows
                if row[0] == "full"
            }
            taken += [(row[:-1], frozenset[str]()) for row in rows if row[0] == "claimed"]
            pending, used = list(gates), frozenset().union(*gates.values())
        for _ in range(3):
            if not pending:
                break
            rows = conn.execute(q.job_claim_many(used), params | {"job_ids": pending}).fetchall()
            taken += [(row[:-1], frozenset(row[-1] or ())) for row in rows if row[0] != "full"]
            full = [row for row in rows if row[0] == "full"]
            pending = [row[1] for row in full]
            used = used.union(*(row[-1] for row in full))
        assert not pending, "a job left 'full' by the claim composed of its gates"
        return taken

    def _end(
        self, conn: psycopg.Connection, handle: tuple[uuid.UUID, str, int], kind: str, in_tx: bool
    ) -> None:
        """As the consumer ends a lease: by the statement of what it holds, else (a
        lease holding more: 'full') the whole one."""
        params = self._finish_params(handle, kind)
        held = self.gates.get((handle[0], handle[2]), frozenset())
        rows = conn.execute(q.job_finish_many(held, in_tx=in_tx), params).fetchall()
        if any(row[1] == "full" for row in rows):
            whole = q.JOB_FINISH_MANY_IN_TX if in_tx else q.JOB_FINISH_MANY
            conn.execute(whole, params)

    def _settle(self) -> None:
        """The system runs: the relay sends every due wake-up, and a consumer claims
        each job a wake-up was sent for and not yet taken up."""
        self.the_relay_sends_what_is_due()
        ids = [
            row[0]
            for row in self.conn.execute(
                f"""SELECT DISTINCT o.job_id FROM outbox AS o JOIN jobs AS j USING (job_id)
                    WHERE o.sent_at IS NOT NULL AND {q.UNTAKEN}"""
            )
        ]
        if ids:
            self._claimed(self._claim_on(self.conn, ids, "w1"), "w1")

    def _finish_params(self, handle: tuple[uuid.UUID, str, int], kind: str) -> dict[str, Any]:
        job_id, worker, generation = handle
        return {"outcomes": json.dumps([_outcome(job_id, generation, kind)]), "worker": worker}

    # -------------------------------------------------------------- rules

    @rule(
        settle=st.booleans(),
        queue=st.sampled_from(["default", "default", "reports"]),
        key=st.sampled_from([None, *KEYS]),
        key_limit=st.sampled_from([1, 1, 2]),
        ordered=st.sampled_from([False, False, True, "strict"]),
        resource=st.sampled_from([None, "r1"]),
        rate=st.sampled_from([None, "api"]),
        tenant=st.sampled_from([None, "capped"]),
        deadline=st.booleans(),
        copies=st.integers(1, 3),
        job_type=st.sampled_from(["t", "t", LIMITED]),
        weight=st.sampled_from([1, 1, 2, 3]),
    )
    def enqueue(
        self,
        settle: bool,
        queue: str,
        key: str | None,
        key_limit: int,
        ordered: bool | str,
        resource: str | None,
        rate: str | None,
        tenant: str | None,
        deadline: bool,
        copies: int,
        job_type: str,
        weight: int,
    ) -> None:
        gates: dict[str, Any] = {
            "queue": queue,
            "rate_limit": rate,
            "tenant": tenant,
            "weight": weight,
        }
        if key is not None:
            gates |= {"key": key, "key_limit": 1 if ordered else key_limit, "ordered": ordered}
        elif resource is not None:
            gates["resource"] = resource
        if deadline:
            gates["expires"] = timedelta(hours=1)
        with Session(self.engine) as session, session.begin():
            self.jobs += [outbox.enqueue(session, job_type, {}, **gates) for _ in range(copies)]
        if settle:
            self._settle()

    @rule()
    def the_relay_sends_what_is_due(self) -> None:
        self.conn.execute(
            "UPDATE outbox AS o SET sent_at = now() WHERE sent_at IS NULL AND available_at <= now()"
            " AND NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.queue = o.queue AND p.paused)"
        )

    @rule(settle=st.booleans(), paused=st.booleans())
    def an_operator_pauses_or_resumes_a_queue(self, settle: bool, paused: bool) -> None:
        with Session(self.engine) as session, session.begin():
            if paused:
                outbox.pause_queue(session, "reports")
            else:
                outbox.resume_queue(session, "reports")
        if settle:
            self._settle()

    @rule(
        data=st.data(),
        worker=st.sampled_from(WORKERS),
        # the gates of the batch before, which the consumer claims this one with first
        expected=st.frozensets(st.sampled_from(GATES)),
    )
    def claim(self, data: st.DataObject, worker: str, expected: frozenset[str]) -> None:
        ids = _chosen(self.jobs, data.draw(_picks(4)))
        if ids:
            self._claimed(self._claim_on(self.conn, ids, worker, expected), worker)

    @rule(worker=st.sampled_from(WORKERS))
    def a_consumer_is_woken_for_every_job(self, worker: str) -> None:
        if not self.jobs:
            return
        self._claimed(self._claim_on(self.conn, self.jobs[-20:], worker), worker)

    @rule(
        settle=st.booleans(),
        data=st.data(),
        kind=st.sampled_from(["succeeded", "failed", "retry", "cancelled"]),
    )
    def a_lease_ends(self, settle: bool, data: st.DataObject, kind: str) -> None:
        (handle,) = _chosen(self.handles, [data.draw(PICK)]) or [None]
        if handle is None:
            return
        self._end(self.conn, handle, kind, in_tx=False)
        if settle:
            self._settle()

    @rule(settle=st.booleans(), data=st.data())
    def a_graceful_stop_gives_a_lease_back(self, settle: bool, data: st.DataObject) -> None:
        (handle,) = _chosen(self.handles, [data.draw(PICK)]) or [None]
        if handle is None:
            return
        job_id, worker, generation = handle
        fence = json.dumps([{"job_id": str(job_id), "generation": generation}])
        self.conn.execute(q.JOB_GIVE_BACK_MANY, {"jobs": fence, "worker": worker})
        if settle:
            self._settle()

    @rule(settle=st.booleans(), data=st.data())
    def a_lease_expires_and_is_swept(self, settle: bool, data: st.DataObject) -> None:
        (handle,) = _chosen(self.handles, [data.draw(PICK)]) or [None]
        if handle is None:
            return
        job_id = handle[0]
        self.conn.execute(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 second'"
            " WHERE job_id = %s AND lease_expires_at IS NOT NULL",
            [job_id],
        )
        self.conn.execute(q.JOB_SWEEP_EXPIRED, {"limit": 100, "default_backoff": 0})
        if settle:
            self._settle()

    @rule(settle=st.booleans(), data=st.data())
    def a_cancel_is_requested(self, settle: bool, data: st.DataObject) -> None:
        (job_id,) = _chosen(self.jobs, [data.draw(PICK)]) or [None]
        if job_id is None:
            return
        with Session(self.engine) as session, session.begin():
            outbox.request_cancel(session, job_id)
        if settle:
            self._settle()

    @rule(settle=st.booleans(), data=st.data())
    def a_deadline_passes(self, settle: bool, data: st.DataObject) -> None:
        (job_id,) = _chosen(self.jobs, [data.draw(PICK)]) or [None]
        if job_id is None:
            return
        self.conn.execute(
            "UPDATE jobs SET expires_at = now() - interval '1 millisecond'"
            " WHERE job_id = %s AND expires_at IS NOT NULL",
            [job_id],
        )
        self.conn.execute(q.JOB_EXPIRE_WAITING, {"limit": 100})
        if settle:
            self._settle()

    @rule()
    def retries_come_due(self) -> None:
        self.conn.execute(
            "UPDATE jobs SET run_after = now() - interval '1 millisecond'"
            " WHERE state = 'RETRY_WAIT' AND run_after > now()"
        )
        self.conn.execute(
            "UPDATE outbox SET available_at = now() - interval '1 millisecond'"
            " WHERE sent_at IS NULL AND available_at > now()"
        )

    @rule(settle=st.booleans(), data=st.data())
    def an_operator_replays_a_job(self, settle: bool, data: st.DataObject) -> None:
        (job_id,) = _chosen(self.jobs, [data.draw(PICK)]) or [None]
        if job_id is None:
            return
        self.conn.execute(q.JOB_REPLAY, {"job_id": job_id, "by": "model", "override": False})
        if settle:
            self._settle()

    @rule(settle=st.booleans())
    def an_operator_resolves_an_uncertain_resource(self, settle: bool) -> None:
        self.conn.execute(
            q.RESOURCE_RESOLVE,
            {
                "resource": "r1",
                "job_id": None,
                "lease_generation": None,
                "by": "model",
                "outcome": None,
            },
        )
        if settle:
            self._settle()

    @rule(settle=st.booleans())
    def retention_runs(self, settle: bool) -> None:
        self.conn.execute(q.JOB_RETENTION_DELETE, {"keep_seconds": 0, "limit": 100})
        left = {row[0] for row in self.conn.execute("SELECT job_id FROM jobs")}
        self.jobs = [j for j in self.jobs if j in left]
        self.handles = [h for h in self.handles if h[0] in left]
        if settle:
            self._settle()

    @rule(data=st.data())
    def race_two_claims(self, data: st.DataObject) -> None:
        first = _chosen(self.jobs, data.draw(_picks(3)))
        second = _chosen(self.jobs, data.draw(_picks(3)))
        if len(self.jobs) < 2:
            return
        self._race(
            lambda conn: self._claimed(self._claim_on(conn, first, "w1"), "w1"),
            lambda conn: self._claimed(self._claim_on(conn, second, "w2"), "w2"),
        )

    @rule(data=st.data(), end_first=st.booleans())
    def race_an_end_and_a_claim(self, data: st.DataObject, end_first: bool) -> None:
        (handle,) = _chosen(self.handles, [data.draw(PICK)]) or [None]
        ids = _chosen(self.jobs, data.draw(_picks(3)))
        if handle is None or not ids:
            return

        def end(conn: psycopg.Connection) -> None:
            self._end(conn, handle, "succeeded", in_tx=True)

        def claim(conn: psycopg.Connection) -> None:
            self._claimed(self._claim_on(conn, ids, "w2"), "w2")

        self._race(*((end, claim) if end_first else (claim, end)))

    def _race(self, first: Any, second: Any) -> None:
        """``first`` runs in an open transaction holding its locks; ``second`` arrives
        meanwhile on another connection; then ``first`` commits."""
        failure: list[BaseException] = []

        def run_second() -> None:
            try:
                second(self.other)
            except BaseException as exc:
                failure.append(exc)

        racer = threading.Thread(target=run_second)
        with self.conn.transaction():
            first(self.conn)
            racer.start()
            racer.join(0.2)
        racer.join(10)
        assert not racer.is_alive(), "the second statement never finished"
        # a claim the other one's locks make wait past its own locks may deadlock:
        # PostgreSQL then cancels one, which changes nothing
        assert all(isinstance(e, psycopg.errors.DeadlockDetected) for e in failure), failure

    # -------------------------------------------------------------- invariants

    def _all(self, sql: str) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql).fetchall()  # type: ignore[arg-type]

    @invariant()
    def a_keys_leases_are_counted_once_and_kept_to_its_limit(self) -> None:
        counted = dict(self._all("SELECT key, running FROM key_usage"))
        leased = dict(
            self._all(
                "SELECT key, count(*) FROM jobs"
                " WHERE key IS NOT NULL AND state IN ('RUNNING', 'CANCEL_REQUESTED') GROUP BY key"
            )
        )
        assert counted == leased, "a key's lease leaked or was released twice"
        over = self._all(
            "SELECT key FROM jobs"
            " WHERE state IN ('RUNNING', 'CANCEL_REQUESTED') AND key IS NOT NULL"
            " GROUP BY key HAVING count(*) > min(key_limit)"
        )
        assert over == [], "a key ran past its limit"

    @invariant()
    def a_resource_is_held_exactly_by_its_live_lease(self) -> None:
        holds = {
            row[0]: row[1:]
            for row in self._all(
                "SELECT resource, job_id, lease_generation, uncertain_since IS NOT NULL"
                " FROM resource_holds"
            )
        }
        leases = self._all(
            "SELECT resource, job_id, lease_generation FROM jobs"
            " WHERE resource IS NOT NULL AND state IN ('RUNNING', 'CANCEL_REQUESTED')"
        )
        for resource, job_id, generation in leases:
            assert holds.get(resource) == (job_id, generation, False), "a lease without its hold"
        leased = {(r, j, g) for r, j, g in leases}
        for resource, (job_id, generation, uncertain) in holds.items():
            assert uncertain or (resource, job_id, generation) in leased, "a hold without a lease"

    @invariant()
    def a_capped_tenants_slots_are_its_leases(self) -> None:
        ((recorded,),) = self._all(
            "SELECT COALESCE(sum(running), 0) FROM tenant_usage WHERE tenant = 'capped'"
        )
        ((held,),) = self._all(
            "SELECT COALESCE(sum(COALESCE(weight, 1)), 0) FROM jobs"
            " WHERE tenant = 'capped' AND holds_slot"
        )
        assert recorded == held, "a slot leaked or was released twice"
        assert held <= CAP, "the cap was exceeded"

    @invariant()
    def a_concurrency_limits_slots_are_its_leases(self) -> None:
        ((recorded,),) = self._all(
            f"SELECT COALESCE(sum(running), 0) FROM concurrency_limits WHERE job_type = '{LIMITED}'"
        )
        ((held,),) = self._all(
            "SELECT COALESCE(sum(COALESCE(weight, 1)), 0) FROM jobs"
            f" WHERE job_type = '{LIMITED}' AND limit_held"
            " AND state IN ('RUNNING', 'CANCEL_REQUESTED')"
        )
        ((stray,),) = self._all(
            "SELECT count(*) FROM jobs"
            " WHERE limit_held AND state NOT IN ('RUNNING', 'CANCEL_REQUESTED')"
        )
        assert (recorded, stray) == (held, 0), "a slot leaked or was released twice"
        ((leased,),) = self._all(
            "SELECT COALESCE(sum(COALESCE(weight, 1)), 0) FROM jobs"
            f" WHERE job_type = '{LIMITED}' AND state IN ('RUNNING', 'CANCEL_REQUESTED')"
        )
        assert leased <= LIMIT, "the concurrency limit was exceeded"

    @invariant()
    def a_queue_limits_slots_are_its_leases(self) -> None:
        ((recorded,),) = self._all(
            f"SELECT COALESCE(sum(running), 0) FROM queue_limits WHERE queue = '{LIMITED_QUEUE}'"
        )
        ((held,),) = self._all(
            "SELECT COALESCE(sum(COALESCE(weight, 1)), 0) FROM jobs"
            f" WHERE queue = '{LIMITED_QUEUE}' AND queue_limit_held"
            " AND state IN ('RUNNING', 'CANCEL_REQUESTED')"
        )
        ((stray,),) = self._all(
            "SELECT count(*) FROM jobs"
            " WHERE queue_limit_held AND state NOT IN ('RUNNING', 'CANCEL_REQUESTED')"
        )
        assert (recorded, stray) == (held, 0), "a queue's slot leaked or was released twice"
        ((leased,),) = self._all(
            "SELECT COALESCE(sum(COALESCE(weight, 1)), 0) FROM jobs"
            f" WHERE queue = '{LIMITED_QUEUE}' AND state IN ('RUNNING', 'CANCEL_REQUESTED')"
        )
        assert leased <= QUEUE_LIMIT, "the queue's concurrency limit was exceeded"

    @invariant()
    def tokens_spent_are_starts(self) -> None:
        ((tokens,),) = self._all("SELECT tokens FROM rate_buckets WHERE name = 'api'")
        assert abs(BURST - tokens - self.api_starts) < 0.5, (BURST - tokens, self.api_starts)

    @invariant()
    def no_hand_off_is_lost(self) -> None:
        woken = f"""EXISTS (SELECT 1 FROM outbox AS o JOIN jobs AS j ON j.job_id = o.job_id
                           WHERE o.job_id = w.job_id AND (o.sent_at IS NULL OR ({q.UNTAKEN})))"""
        stranded = self._all(
            f"""SELECT w.job_id FROM jobs AS w
                WHERE w.state IN ('QUEUED', 'RETRY_WAIT') AND w.key IS NULL
                  AND w.resource IS NULL AND NOT {woken}
                  AND w.delay_reason IS DISTINCT FROM 'CONCURRENCY_LIMIT'
                  AND w.delay_reason IS DISTINCT FROM 'QUEUE_CONCURRENCY_LIMIT'"""
        )
        assert stranded == [], "a job without a key or resource waits with no wake-up"
        # one turned down for its type's (or its queue's) concurrency limit while it
        # has fewer free slots than the job weighs: the end of a lease of its type (or
        # queue) wakes it, and with it the turn of its key or resource. Or one behind
        # an older waiter of the same limit that has been woken for the free slots:
        # a limit's waiters are woken oldest first, whatever they weigh, so that one
        # takes the turn and its end hands it on (the limits' own checks below hold
        # a limit with room to having a job on its way).
        ahead = woken.replace("w.job_id", "x.job_id")
        limited = f"""((w.delay_reason = 'CONCURRENCY_LIMIT'
                        AND (EXISTS (SELECT 1 FROM concurrency_limits AS c
                                     WHERE c.job_type = w.job_type
                                       AND c.max_running - c.running < COALESCE(w.weight, 1))
                             OR EXISTS (SELECT 1 FROM jobs AS x
                                        WHERE x.job_type = w.job_type AND x.job_id < w.job_id
                                          AND x.state IN ('QUEUED', 'RETRY_WAIT')
                                          AND x.delay_reason = 'CONCURRENCY_LIMIT'
                                          AND {ahead})))
                       OR (w.delay_reason = 'QUEUE_CONCURRENCY_LIMIT'
                           AND (EXISTS (SELECT 1 FROM queue_limits AS c
                                        WHERE c.queue = w.queue
                                          AND c.max_running - c.running
                                              < COALESCE(w.weight, 1))
                                OR EXISTS (SELECT 1 FROM jobs AS x
                                           WHERE x.queue = w.queue AND x.job_id < w.job_id
                                             AND x.state IN ('QUEUED', 'RETRY_WAIT')
                                             AND x.delay_reason = 'QUEUE_CONCURRENCY_LIMIT'
                                             AND {ahead}))))"""
        limits = self._all(
            f"""SELECT c.job_type FROM concurrency_limits AS c
                WHERE c.running < c.max_running
                  AND EXISTS (SELECT 1 FROM jobs AS w
                              WHERE w.job_type = c.job_type
                                AND w.state IN ('QUEUED', 'RETRY_WAIT')
                                AND COALESCE(w.weight, 1) <= c.max_running - c.running
                                AND w.delay_reason = 'CONCURRENCY_LIMIT' AND NOT {woken})
                  AND NOT EXISTS (SELECT 1 FROM jobs AS w
                                  WHERE w.job_type = c.job_type
                                    AND w.state IN ('QUEUED', 'RETRY_WAIT')
                                    AND ({woken} OR w.delay_reason IN (
                                        'KEY_BUSY', 'KEY_ORDER', 'RESOURCE_BUSY',
                                        'RESOURCE_UNCERTAIN')))"""
        )
        assert limits == [], "a free concurrency limit's waiting jobs wait with no wake-up"
        queues = self._all(
            f"""SELECT c.queue FROM queue_limits AS c
                WHERE c.running < c.max_running
                  AND EXISTS (SELECT 1 FROM jobs AS w
                              WHERE w.queue = c.queue
                                AND w.state IN ('QUEUED', 'RETRY_WAIT')
                                AND COALESCE(w.weight, 1) <= c.max_running - c.running
                                AND w.delay_reason = 'QUEUE_CONCURRENCY_LIMIT' AND NOT {woken})
                  AND NOT EXISTS (SELECT 1 FROM jobs AS w
                                  WHERE w.queue = c.queue
                                    AND w.state IN ('QUEUED', 'RETRY_WAIT')
                                    AND ({woken} OR w.delay_reason IN (
                                        'KEY_BUSY', 'KEY_ORDER', 'RESOURCE_BUSY',
                                        'RESOURCE_UNCERTAIN')))"""
        )
        assert queues == [], "a free queue limit's waiting jobs wait with no wake-up"
        keys = self._all(
            f"""SELECT w.key FROM jobs AS w
                WHERE w.state IN ('QUEUED', 'RETRY_WAIT') AND w.key IS NOT NULL
                GROUP BY w.key
                HAVING NOT bool_or({woken}) AND NOT bool_or({limited})
                   AND NOT EXISTS (SELECT 1 FROM jobs AS x
                                   WHERE x.key = w.key
                                     AND (x.state IN ('RUNNING', 'CANCEL_REQUESTED')
                                          OR (x.state = 'FAILED' AND x.key_order = 'strict')))"""
        )
        assert keys == [], "a key's waiting jobs wait with no wake-up and nothing to wake them"
        resources = self._all(
            f"""SELECT w.resource FROM jobs AS w
                WHERE w.state IN ('QUEUED', 'RETRY_WAIT') AND w.resource IS NOT NULL
                GROUP BY w.resource
                HAVING NOT bool_or({woken}) AND NOT bool_or({limited})
                   AND NOT EXISTS (SELECT 1 FROM resource_holds AS h
                                   WHERE h.resource = w.resource)"""
        )
        assert resources == [], "a free resource's waiting jobs wait with no wake-up"
        runs = "NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.queue = w.queue AND p.paused)"
        passed_over = self._all(
            f"""SELECT w.key FROM jobs AS w
                WHERE w.state IN ('QUEUED', 'RETRY_WAIT') AND w.key IS NOT NULL
                GROUP BY w.key
                HAVING bool_and(w.key_seq IS NULL) AND bool_or({runs})
                   AND NOT bool_or({woken} AND {runs}) AND NOT bool_or({limited})
                   AND NOT EXISTS (SELECT 1 FROM jobs AS x
                                   WHERE x.key = w.key
                                     AND x.state IN ('RUNNING', 'CANCEL_REQUESTED'))
                UNION ALL
                SELECT w.resource FROM jobs AS w
                WHERE w.state IN ('QUEUED', 'RETRY_WAIT') AND w.resource IS NOT NULL
                GROUP BY w.resource
                HAVING bool_or({runs}) AND NOT bool_or({woken} AND {runs})
                   AND NOT bool_or({limited})
                   AND NOT EXISTS (SELECT 1 FROM resource_holds AS h
                                   WHERE h.resource = w.resource)
                UNION ALL
                SELECT c.job_type FROM concurrency_limits AS c
                WHERE c.running < c.max_running
                  AND EXISTS (SELECT 1 FROM jobs AS w
                              WHERE w.job_type = c.job_type
                                AND w.state IN ('QUEUED', 'RETRY_WAIT')
                                AND w.delay_reason = 'CONCURRENCY_LIMIT'
                                AND COALESCE(w.weight, 1) <= c.max_running - c.running
                                AND {runs} AND NOT {woken})
                  AND NOT EXISTS (SELECT 1 FROM jobs AS w
                                  WHERE w.job_type = c.job_type
                                    AND w.state IN ('QUEUED', 'RETRY_WAIT')
                                    AND (({woken} AND {runs}) OR w.delay_reason IN (
                                        'KEY_BUSY', 'KEY_ORDER', 'RESOURCE_BUSY',
                                        'RESOURCE_UNCERTAIN')))"""
        )
        assert passed_over == [], (
            "a free key, resource or concurrency limit woke only a job of a paused queue"
        )


@pytest.mark.parametrize(
    "examples",
    # Each example runs up to 40 steps against PostgreSQL, every invariant read after
    # each: the default suite's share, and a deeper search in ./scripts/test-soak.
    [pytest.param(20, id="quick"), pytest.param(150, id="deep", marks=pytest.mark.soak)],
)
def test_the_gates_hold_together_under_arbitrary_interleavings_and_races(
    db_url: DatabaseUrl, examples: int
) -> None:
    run_state_machine_as_test(
        lambda: GateMachine(db_url),
        settings=settings(
            max_examples=examples,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
