"""The consumer's side of the tables: every read and write goes through here, by
name, to the statements in schema/queries/."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any, LiteralString, NamedTuple

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from hybrid_jobs import defaults
from hybrid_jobs.consumers.outcome import Outcome
from hybrid_jobs.plumbing.db import native
from hybrid_jobs.plumbing.logfmt import describe_error
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.gates import GATES, HELD_GATES
from hybrid_jobs.schema.states import JobState

# What a claim says of a wake-up it did not turn into a running job. The reasons a
# consumer turned the job down are recorded on the row; the rest say where the job
# is, or that its row was held by another transaction ('locked': try it again).
LOCKED = "locked"
NO_THREAD = "no_thread"
# The job belongs to a queue this consumer does not serve: the wake-up was not the
# relay's to this queue (anyone with access to the broker may publish one). The job
# is left as it was, for a consumer of its own queue.
OTHER_QUEUE = "other_queue"
# A lease this worker holds already. Unless the job runs here, a claim of it committed
# and its answer was lost: the worker fetches it (held_by_me) and starts it.
HELD_HERE = "held_here"
# A weighed job whose weight is more than this worker's free slots: it waits here
# until enough of its jobs end (the claimer claims nothing lighter meanwhile).
NO_ROOM = "no_room"

log = logging.getLogger("consumer")

ALL_GATES = frozenset(GATES)
NO_GATES: frozenset[str] = frozenset()
# A claim answers 'full' for a job that uses a gate the claim left out, and the job
# goes on to the claim composed of the gates it uses: at most this many such claims
# for one batch (a job whose gates keep changing meanwhile is tried again later).
_COMPOSED_AT_MOST = 3
_LIMITED: frozenset[str] = frozenset({"concurrency"})
_RATE: frozenset[str] = frozenset({"rate"})
_WEIGHED: frozenset[str] = frozenset({"weight"})


@dataclass(frozen=True)
class Claimed:
    job_id: uuid.UUID
    job_type: str
    queue: str
    tenant: str | None
    payload: Any
    attempt: int
    max_attempts: int | None
    generation: int
    created_at: datetime
    # The schedule occurrence that fired the job (None: not fired by a schedule).
    scheduled_for: datetime | None = None
    # The W3C trace context of the code that enqueued it (the otel extra), as stored.
    trace_context: Any = None
    # The job's meta (enqueue's ``meta``), None for none.
    meta: dict[str, Any] | None = None
    # The stored input it runs on (enqueue's ``payload_ref``), None for a job that
    # carries its payload; once read (with_inputs) its content is ``payload``.
    payload_ref: uuid.UUID | None = None
    # The slots of this worker its lease takes (enqueue's weight=).
    weight: int = 1
    # The gates it was claimed through (schema/gates), so that its outcome runs the
    # end of a lease composed of what it holds; None: not known (a lease recovered
    # by held_by_me), and its outcome finds out.
    gates: frozenset[str] | None = None
    # Why its stored input cannot be read (redacted): the job fails INPUT_REDACTED
    # instead of running.
    input_redacted: str | None = None


# The fields of Claimed that a claim's row gives, in its order (job_id to
# payload_ref): a claimed job is built from them directly, once per job.
_CLAIMED_COLUMNS: tuple[str, ...] = tuple(
    f.name for f in fields(Claimed) if f.name not in ("weight", "gates", "input_redacted")
)


@dataclass(frozen=True)
class ClaimResult:
    claimed: list[Claimed]
    # job id -> why it was not claimed
    missed: dict[uuid.UUID, str]


Fence = tuple[uuid.UUID, int]  # (job_id, lease_generation)


def _fences(held: Sequence[Fence]) -> str:
    return json.dumps([{"job_id": str(i), "generation": g} for i, g in held])


def finish_params(worker: str, batch: Sequence[tuple[uuid.UUID, int, Outcome]]) -> dict[str, str]:
    """Parameters of JOB_FINISH_MANY for these (job_id, generation, outcome) triples."""
    outcomes = json.dumps(
        [
            {
                "job_id": str(job_id),
                "generation": generation,
                "kind": o.kind,
                "error_code": o.error_code,
                "error_message": o.error_message,
                "traceback": o.traceback,
                "delay_seconds": o.delay_seconds,
                "result": None if o.result is None else json.loads(o.result),
                "progress": None if o.progress is None else json.loads(o.progress),
            }
            for job_id, generation, o in batch
        ],
        ensure_ascii=False,
    )
    return {"outcomes": outcomes, "worker": worker}


async def finish_on(
    conn: AsyncConnection,
    worker: str,
    batch: Sequence[tuple[uuid.UUID, int, Outcome]],
    statement: LiteralString,
) -> dict[uuid.UUID, str]:
    """Apply outcomes on ``conn`` (in the caller's transaction): each applied one's
    new state, or 'LOCKED'. An outcome missing from the result was stale. (In
    PostgreSQL's own placeholders, made once: psycopg converts a statement of more
    than 4 KB again at every execution, and this one runs for every batch.)"""
    cur = await native(statement).execute(conn, finish_params(worker, batch))
    return {row[0]: row[1] for row in await cur.fetchall()}


class Beat(NamedTuple):
    """What a heartbeat says of one lease (see JOB_HEARTBEAT_MANY)."""

    state: str | None
    # the cancel was requested with force: interrupt the handler
    forced: bool = False


@dataclass(frozen=True)
class Finished:
    applied: dict[uuid.UUID, JobState]
    locked: set[uuid.UUID]
    stale: set[uuid.UUID]


@dataclass(frozen=True)
class GivenBack:
    # job id -> its new state (QUEUED, or CANCELLED if a cancel was requested)
    returned: dict[uuid.UUID, JobState]
    # leases still ours whose row another transaction held: try them again
    locked: set[uuid.UUID]


def _with_input(c: Claimed, found: dict[uuid.UUID, tuple[Any, ...]]) -> Claimed:
    if c.payload_ref is None:
        return c
    content, redacted_at, reason = found[c.payload_ref]  # jobs_payload_ref_check keeps it
    if redacted_at is not None:
        why = f"its stored input {c.payload_ref} was redacted at {redacted_at.isoformat()}"
        return replace(c, payload=None, input_redacted=f"{why} ({reason}): nothing to run on")
    return replace(c, payload=content)


class JobStore:
    def __init__(
        self,
        pool: AsyncConnectionPool[AsyncConnection],
        worker: str,
        lease_seconds: float,
        tenants: Sequence[str] = (),
    ) -> None:
        self.pool = pool
        self.worker = worker
        self.lease_seconds = lease_seconds
        # The dedicated tenants this worker names: only it and their likes take
        # those tenants' jobs.
        self.tenants = list(tenants)
        # The gates the last batch's jobs used: the next batch goes straight to the
        # claim composed of them (claim).
        self.expected_gates: frozenset[str] = NO_GATES
        # the handlers' terms last claimed with, and their JSON (see _terms_json)
        self._terms: list[dict[str, Any]] | None = None
        self._terms_encoded = ""

    def _terms_json(self, terms: list[dict[str, Any]]) -> str:
        """``terms`` as the claim's JSON, encoded again only for another list: the
        registry hands every claim the same one until a handler is registered."""
        if terms is not self._terms:
            self._terms, self._terms_encoded = terms, json.dumps(terms)
        return self._terms_encoded

    async def claim(
        self,
        job_ids: Sequence[uuid.UUID],
        terms: list[dict[str, Any]],
        *,
        queues: Sequence[str],
        free_threads: int,
        worker_ttl: float,
        free_slots: int | None = None,
        concurrency: int = defaults.CONSUMER_CONCURRENCY,
    ) -> ClaimResult:
        """Claim the jobs of ``job_ids`` that may run here: ``terms`` are the
        handlers' (Registry.claim_terms), ``queues`` the queues this worker serves (a
        job of any other comes back OTHER_QUEUE, untouched). ``free_slots`` of this
        worker's ``concurrency`` are free: a weighed job is claimed only if its
        weight fits them (NO_ROOM), and turned down if it is above the whole
        concurrency (WEIGHT_OVER_CONCURRENCY); None: all of them.

        Which statements run: a batch goes first to the plain claim, which has no
        gate's SQL in it, unless the batch before held jobs that use gates. Then it
        goes straight to the claim composed of those gates (``expected_gates``),
        which takes plain jobs too: a stream of gated jobs pays for one statement a
        batch, not two. Whatever a claim leaves 'full' (a job that uses a gate it
        left out) goes on to the claim composed of the gates that job uses. A batch
        that holds no gated job sends the next one to the plain claim again."""
        free_slots = concurrency if free_slots is None else free_slots
        params: dict[str, Any] = {
            "job_ids": list(job_ids),
            "queues": list(queues),
            "types": self._terms_json(terms),
            "free_threads": free_threads,
            "worker": self.worker,
            "lease_seconds": self.lease_seconds,
            "tenants": self.tenants,
            "concurrency": concurrency,
            "worker_ttl": worker_ttl,
            "free_slots": free_slots,
        }
        sync = {t["job_type"] for t in terms if t["sync"]}
        claimed: list[Claimed] = []
        missed: dict[uuid.UUID, str] = {}
        # the gates of the batch's jobs that a claim left 'full'
        gated = NO_GATES
        async with self.pool.connection() as conn:
            if self.expected_gates:
                pending, used = list(job_ids), self.expected_gates
            else:
                pending, used = await self._claim_plain(conn, params, terms, claimed)
                gated = used
            for _ in range(_COMPOSED_AT_MOST):
                if not pending:
                    break
                statement = q.JOB_CLAIM_MANY if used == ALL_GATES else q.job_claim_many(used)
                try:
                    cur = await native(statement).execute(
                        conn,
                        {
                            **params,
                            "job_ids": pending,
                            # the threads and slots the jobs claimed already hold are not free
                            "free_threads": max(
                                free_threads - sum(c.job_type in sync for c in claimed), 0
                            ),
                            "free_slots": max(free_slots - sum(c.weight for c in claimed), 0),
                        },
                    )
                    rows = await cur.fetchall()
                except Exception as exc:
                    if not claimed:
                        raise
                    # An earlier claim committed: its jobs are this worker's, and only
                    # it can start them. The rest are tried again alone, as rows
                    # another transaction held would be.
                    log.warning(
                        "consumer.claim_left_for_later",
                        extra={"jobs": len(pending), "error": describe_error(exc)},
                    )
                    break
                pending = []
                for row in rows:
                    if row[0] == "claimed":
                        claimed.append(replace(Claimed(*row[1:-1]), gates=frozenset(row[-1])))
                    elif row[0] == "full":
                        pending.append(row[1])
                        gated = gated | frozenset(row[-1])
                        used = used | gated
                    else:
                        missed[row[1]] = row[0]
            # (left 'full' by every claim tried: its gates changed meanwhile)
            for job_id in pending:
                missed[job_id] = LOCKED
        self.expected_gates = gated.union(*(c.gates or NO_GATES for c in claimed))
        return ClaimResult(await self.with_inputs(claimed), missed)

    async def _claim_plain(
        self,
        conn: AsyncConnection,
        params: dict[str, Any],
        terms: list[dict[str, Any]],
        claimed: list[Claimed],
    ) -> tuple[list[uuid.UUID], frozenset[str]]:
        """The plain claim: the plain jobs it takes go to ``claimed``; the ids it
        leaves ('full': not plain, turned down, of a queue this worker does not
        serve, held by another transaction, no longer waiting), with the gates
        their jobs use, are for the claim composed of those gates to decide. A type
        under a concurrency limit, or whose handler weighs its jobs, is not given to
        the plain claim (which then has none of their SQL): its jobs come back
        'full', named by type, and go to a claim composed with those gates (and its
        handler's rate limit's)."""
        limited = {
            t["job_type"]: (_LIMITED if t.get("global_limit") is not None else NO_GATES)
            | (_WEIGHED if t.get("weight") is not None else NO_GATES)
            | (_RATE if t.get("rate_limit") else NO_GATES)
            for t in terms
            if t.get("global_limit") is not None or t.get("weight") is not None
        }
        if limited:
            plain_terms = [t for t in terms if t["job_type"] not in limited]
            params = {**params, "types": json.dumps(plain_terms)}
        cur = await native(q.JOB_CLAIM_PLAIN_MANY).execute(conn, params)
        rest: list[uuid.UUID] = []
        used = NO_GATES
        for row in await cur.fetchall():
            if row[0] == "claimed":
                claimed.append(
                    Claimed(**dict(zip(_CLAIMED_COLUMNS, row[1:-1], strict=True)), gates=NO_GATES)
                )
            else:
                rest.append(row[1])
                used = used | frozenset(row[-1]) | limited.get(row[2], NO_GATES)
        return rest, used

    async def with_inputs(self, claimed: list[Claimed]) -> list[Claimed]:
        """The claimed jobs, those with a stored input (payload_ref) given its
        content as their payload, read in one statement for the batch; a batch
        without one reads nothing. Should the read fail, the claim has committed:
        the caller's retry finds these leases held here (held_by_me), which reads
        them again."""
        refs = sorted({c.payload_ref for c in claimed if c.payload_ref is not None})
        if not refs:
            return claimed
        async with self.pool.connection() as conn:
            cur = await conn.execute(q.INPUT_READ, {"input_ids": refs})
            found = {row[0]: row[1:] for row in await cur.fetchall()}
        return [_with_input(c, found) for c in claimed]

    async def uncertain_for(self, job_ids: Sequence[uuid.UUID]) -> list[tuple[Any, ...]]:
        """The uncertain holds of these jobs' resources (RESOURCE_UNCERTAIN_FOR): the
        resource, the lease that left each (job, generation), that job's type and
        payload (None once retention deleted it), since when, and the types of
        these jobs turned down for it."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(q.RESOURCE_UNCERTAIN_FOR, {"job_ids": list(job_ids)})
            return list(await cur.fetchall())

    async def resolve_resource(
        self, resource: str, job_id: uuid.UUID, lease_generation: int, by: str, outcome: str
    ) -> bool:
        """Resolve the uncertain hold the lease of ``job_id``, ``lease_generation``
        left on ``resource`` (RESOURCE_RESOLVE, fenced by that holder); False, nothing
        changed, if that hold is gone: someone resolved it first, whoever holds the
        resource now."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                q.RESOURCE_RESOLVE,
                {
                    "resource": resource,
                    "job_id": job_id,
                    "lease_generation": lease_generation,
                    "by": by,
                    "outcome": outcome,
                },
            )
            return await cur.fetchone() is not None

    async def held_by_me(self, job_ids: Sequence[uuid.UUID]) -> list[Claimed]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                q.JOB_HELD_BY, {"job_ids": list(job_ids), "worker": self.worker}
            )
            held = [Claimed(*row[1:]) for row in await cur.fetchall()]
        return await self.with_inputs(held)

    async def heartbeat(self, held: Sequence[Fence]) -> dict[uuid.UUID, Beat]:
        """Extend the leases still ours: each one's state (CANCEL_REQUESTED shows
        here, with whether it was forced), 'LOCKED' for one whose row another
        transaction holds, None for one that is gone."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                q.JOB_HEARTBEAT_MANY,
                {"jobs": _fences(held), "worker": self.worker, "lease_seconds": self.lease_seconds},
            )
            return {row[0]: Beat(row[1], row[2]) for row in await cur.fetchall()}

    async def finish(
        self,
        batch: Sequence[tuple[uuid.UUID, int, Outcome]],
        gates: frozenset[str] | None = NO_GATES,
    ) -> Finished:
        """Record outcomes. ``gates``: the gates the batch's jobs were claimed
        through, all together (None: not known), which the end of their leases is
        composed of.

        Safe to call again after a failure: an outcome that did commit makes its
        repeat match nothing, and is then recognised by its attempt row, not
        reported as stale.
        """
        async with self.pool.connection() as conn:
            # By the statement composed of what the leases hold (the plain one, for
            # most); the outcomes of leases holding more ('full': their gates were
            # not known) by the whole one. Each commits on its own: if the second
            # fails, the caller's retry finds the first's outcomes recorded
            # (below), not stale.
            held = (gates or NO_GATES) & HELD_GATES
            first = (
                q.JOB_FINISH_PLAIN_MANY
                if not held
                else q.JOB_FINISH_MANY
                if held == HELD_GATES
                else q.job_finish_many(held)
            )
            result = await finish_on(conn, self.worker, batch, first)
            rest = [row for row in batch if result.get(row[0]) == "full"]
            if rest:
                # (one the whole outcome then finds stale is missing, as below)
                for job_id, _, _ in rest:
                    del result[job_id]
                result.update(await finish_on(conn, self.worker, rest, q.JOB_FINISH_MANY))
            missing = [(job_id, gen) for job_id, gen, _ in batch if job_id not in result]
            recorded: set[uuid.UUID] = set()
            if missing:
                cur = await conn.execute(
                    q.JOB_ATTEMPT_RECORDED_MANY, {"jobs": _fences(missing), "worker": self.worker}
                )
                recorded = {row[0] for row in await cur.fetchall()}
        applied = {i: JobState(s) for i, s in result.items() if s != "LOCKED"}
        locked = {i for i, s in result.items() if s == "LOCKED"}
        return Finished(applied, locked, {job_id for job_id, _ in missing} - recorded)

    async def give_back(self, held: Sequence[Fence]) -> GivenBack:
        """Give back these claims (JOB_GIVE_BACK_MANY): the ones given back, with
        their new states, and the ones whose row another transaction held (still
        ours, untouched). A claim in neither was no longer ours."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                q.JOB_GIVE_BACK_MANY, {"jobs": _fences(held), "worker": self.worker}
            )
            rows = await cur.fetchall()
        return GivenBack(
            {row[0]: JobState(row[1]) for row in rows if row[1] != "LOCKED"},
            {row[0] for row in rows if row[1] == "LOCKED"},
        )

    async def hand_back(self, job_ids: Sequence[uuid.UUID], delay: float = 0.0) -> set[uuid.UUID]:
        """Put these wake-ups back in the outbox's backlog, due in ``delay``
        seconds, for the relay to send to a consumer with room; the jobs that still
        wanted one."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                q.OUTBOX_HAND_BACK, {"job_ids": list(job_ids), "delay_seconds": delay}
            )
            return {row[0] for row in await cur.fetchall()}

    async def refresh_held(self, job_ids: Sequence[uuid.UUID]) -> int:
        """Mark the wake-ups this worker holds as sent now (see OUTBOX_HELD_REFRESH)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(q.OUTBOX_HELD_REFRESH, {"job_ids": list(job_ids)})
            return cur.rowcount

    async def seen(self, params: dict[str, Any]) -> bool:
        """The worker's row: who it is, what it runs, its counters. Whether it
        comes back: its row had expired, or a lease of it had lapsed since it was
        last seen (WORKER_SEEN)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(q.WORKER_SEEN, {"worker": self.worker, **params})
            row = await cur.fetchone()
            return bool(row and row[0])

    async def record_policies(self, policies: list[dict[str, Any]]) -> list[str]:
        """Record what the handlers' job types allow (JOB_TYPE_POLICY_RECORD_MANY);
        the types whose recorded policy this changed."""
        return await self._record_per_type(q.JOB_TYPE_POLICY_RECORD_MANY, "policies", policies)

    async def record_limits(self, limits: list[dict[str, Any]]) -> list[str]:
        """Record the handlers' concurrency limits (CONCURRENCY_LIMIT_RECORD_MANY);
        the types whose recorded limit this changed."""
        return await self._record_per_type(q.CONCURRENCY_LIMIT_RECORD_MANY, "limits", limits)

    async def record_queue_limits(self, limits: Sequence[tuple[str, int]]) -> list[str]:
        """Record this consumer's queue limits (QUEUE_LIMIT_RECORD_MANY); the queues
        whose recorded limit this changed."""
        rows = [{"queue": queue, "max_running": n} for queue, n in limits]
        return await self._record_per_type(q.QUEUE_LIMIT_RECORD_MANY, "limits", rows)

    async def record_webhooks(self, webhooks: list[dict[str, Any]]) -> list[str]:
        """Record the handlers' webhook URLs (JOB_TYPE_WEBHOOK_RECORD_MANY); the
        types whose recorded URL this changed."""
        return await self._record_per_type(q.JOB_TYPE_WEBHOOK_RECORD_MANY, "webhooks", webhooks)

    async def _record_per_type(
        self, statement: str, name: str, rows: list[dict[str, Any]]
    ) -> list[str]:
        """What a consumer records at start-up, a row per job type of its handlers
        (or per queue of its --queue-limit), the last to start winning: the names
        whose recorded row this changed."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(statement, {name: json.dumps(rows), "worker": self.worker})
            return [row[0] for row in await cur.fetchall()]

    async def gone(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(q.WORKER_GONE, {"worker": self.worker})

    async def wake_parked(
        self, queues: Sequence[str], job_types: Sequence[str], concurrency: int
    ) -> int:
        """Wake the jobs that waited for a consumer knowing their type, or naming
        their dedicated tenant, and bring forward those turned down as heavier than
        their consumer that fit in ``concurrency``."""
        served = {"queues": list(queues), "job_types": list(job_types)}
        async with self.pool.connection() as conn:
            cur = await conn.execute(q.JOB_WAKE_PARKED, served | {"tenants": self.tenants})
            woken = cur.rowcount
            cur = await conn.execute(q.JOB_WAKE_HEAVY, served | {"concurrency": concurrency})
            return woken + cur.rowcount

    async def ping(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute("SELECT 1")
