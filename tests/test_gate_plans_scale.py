"""Two gates at production shape read a bounded stretch of index, in the custom plan of
a first execution and in the generic plan (plan_cache_mode = force_generic_plan) a
pooled connection settles on, each on its daemon's connection options
(plumbing.db: a consumer's CONTROL_OPTIONS, the relay's RELAY_OPTIONS).

1. Keys: 200,000 keys (200,000 finished keyed jobs, one per key; a million, the
   production shape, in the soak run, ``-m soak``) and, per shape of key, 300 with
   jobs waiting: free ones, ordered heads with a job behind them, ordered jobs
   behind a running one (KEY_ORDER), jobs behind the running one of a busy key
   (KEY_BUSY), and key_usage rows for the running ones. The keyed claim of 50 and
   the end of 20 keyed leases (which release the key and wake the next) read a few
   rows per job of jobs, key_usage and outbox, and never scan jobs.
2. Capped tenants: 10,000 tenants capped at 5, every tenth at its cap, ten waiting
   jobs each with an unsent wake-up (100,000). A plain claim of 50 jobs of 50
   tenants reads their own tenants' rows, not every tenant's; the relay's decision
   reads what its comment (schema/queries/outbox.py) promises: one index probe per
   tenant with a backlog, plus what it fills; asked for the next tenants only, the
   scan and the tenants met there, plus what it fills.

Each database is set up once for its tests, cloned from the session's migrated
template as every test's database is. Every statement runs in a transaction that is
rolled back, and each test (custom or generic) names jobs no other test has touched:
a rolled-back write leaves dead index entries behind, which a later bitmap scan of
the same ids would count, so the figures do not depend on the order of the tests.

Each test fails on a degraded plan (checked by dropping, inside a rolled-back
transaction, an index the statement walks: jobs_pkey, jobs_key_order_idx,
jobs_key_waiting_idx, outbox_job_id_idx, key_usage_pkey, tenant_limits_pkey,
tenant_usage_pkey, outbox_inflight_idx, outbox_turn_idx; outbox_pending_idx
replaced by one on (queue, tenant) alone): the planner then scans the table, or reads
every waiting job or every one of a tenant's wake-ups per probe, and the assertion
fires."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from harness.claim import claim_params
from hybrid_jobs import defaults
from hybrid_jobs.plumbing.db import CONTROL_OPTIONS, RELAY_OPTIONS
from hybrid_jobs.schema import queries as q
from tests.conftest import _database, _url_for
from tests.support.plans import plan as explain_plan
from tests.support.plans import reads

BATCH = 50
WORKER = "w1"
HOLDER = "w-other"

Read = dict[str, list[tuple[str, int, int]]]


def upserts(node: dict[str, Any], relation: str) -> Iterator[dict[str, Any]]:
    """Each INSERT ... ON CONFLICT into ``relation``: it reads the rows it arbitrates
    through the index it names, with no scan node of its own."""
    ours = node["Node Type"] == "ModifyTable" and node.get("Relation Name") == relation
    if ours and "Conflict Arbiter Indexes" in node:
        yield node
    for child in node.get("Plans", []):
        yield from upserts(child, relation)


def read_by(found: list[dict[str, Any]], *relations: str) -> Read:
    return {r: list(reads(found[0]["Plan"], r)) for r in relations}


def total(read: Read, relation: str) -> int:
    return sum(rows for _, rows, _ in read[relation])


def no_seq_scan(read: Read, *relations: str) -> None:
    """No scan of a whole table, not even one this execution left unrun."""
    for relation in relations:
        assert all(node != "Seq Scan" for node, _, _ in read[relation]), (relation, read)


def _report(what: str, generic: bool, found: list[dict[str, Any]], read: Read) -> None:
    rows = {r: total(read, r) for r in read}
    plan = "generic" if generic else "custom"
    print(f"{what} ({plan}): {found[0]['Execution Time']:.1f} ms, rows read {rows}")


def _connect(name: str, options: str | None = None) -> psycopg.Connection:
    """A connection to the database ``name``, with a daemon's ``options``."""
    return psycopg.connect(_url_for(name).conninfo, autocommit=True, options=options)


# A job id as hybrid_jobs.outbox.validation.new_job_id makes them (UUIDv7): the
# milliseconds of ``at`` first, so ids sort by creation, then ``n``.
def _v7(at: str, n: str) -> str:
    return (
        f"(lpad(to_hex((extract(epoch FROM {at}) * 1000)::bigint), 12, '0') || '7000'"
        f" || '8' || lpad(to_hex({n}), 15, '0'))::uuid"
    )


# ------------------------------------------------------------------------- keys

# Keys in the history: 200,000 in every run, a million in the soak run. Each bound
# below is per job of the batch, whatever the history holds; a plan that scans jobs
# reads the whole history, 200,000 rows, 800 times the claim's bound of 250 and 1,000
# times the outcome's 200, so the smaller history fails a degraded plan as surely.
KEYS = [
    pytest.param(200_000, id="200k_keys"),
    pytest.param(1_000_000, id="1M_keys", marks=pytest.mark.soak),
]
PER_SHAPE = 300
FREE, HEAD, RUNNING_ORDERED, BUSY = range(4)
# jobs of a place (shape, pos) per test: each test takes its own slice of the keys
EACH_PLACE = 10

# Finished jobs, one per key, over the last 30 days; every other one was ordered
# (key_seq). None of them is in the keys' partial indexes: they are the history the
# claim and the end of a lease must not walk. In two halves, side by side.
KEY_HISTORY = f"""
INSERT INTO jobs (job_id, job_type, state, key, key_limit, key_order, key_seq, attempt_count,
                  max_attempts, lease_generation, created_at, started_at, finished_at)
SELECT {_v7("t.at", "i")}, 'noop', 'SUCCEEDED', 'k' || i, 1,
       CASE WHEN i %% 2 = 0 THEN 'ordered' END, CASE WHEN i %% 2 = 0 THEN i END,
       1, 3, 1, t.at, t.at, t.at + interval '1 second'
FROM generate_series(%(first)s::int, %(last)s::int) AS i,
     LATERAL (SELECT now() - interval '30 days' + i * interval '2 seconds' AS at) AS t
"""

# PER_SHAPE keys of each shape, spread over the history's keys (769 is prime to
# 200,000 and to a million: they are distinct), each with its jobs, pos 0 first. FREE: one waiting
# job. HEAD: an ordered job and one behind it, both waiting. RUNNING_ORDERED: an
# ordered job running, one behind it waiting. BUSY: a job of key_limit 1 running,
# one behind it waiting.
KEY_SHAPES = f"""
WITH k AS (
    SELECT s, j, 'k' || (((s * %(per)s + j) * 769) %% %(keys)s + 1) AS key
    FROM generate_series(0, 3) AS s, generate_series(1, %(per)s) AS j
), r AS (
    SELECT k.s, k.j, p.pos, k.key,
           k.s IN ({HEAD}, {RUNNING_ORDERED}) AS ordered,
           p.pos = 0 AND k.s IN ({RUNNING_ORDERED}, {BUSY}) AS running
    FROM k CROSS JOIN LATERAL generate_series(0, CASE WHEN k.s = {FREE} THEN 0 ELSE 1 END)
        AS p(pos)
)
INSERT INTO jobs (job_id, job_type, state, key, key_limit, key_order, key_seq, attempt_count,
                  max_attempts, lease_generation, lease_owner, lease_expires_at, started_at,
                  payload, created_at, run_after)
SELECT {_v7("now()", "(r.s * %(per)s + r.j) * 2 + r.pos")}, 'noop',
       CASE WHEN r.running THEN 'RUNNING' ELSE 'QUEUED' END, r.key, 1,
       CASE WHEN r.ordered THEN 'ordered' END,
       CASE WHEN r.ordered THEN %(keys)s + (r.s * %(per)s + r.j) * 2 + r.pos END,
       r.running::int, CASE WHEN r.running THEN 3 END, r.running::int,
       CASE WHEN r.running THEN '{HOLDER}' END,
       CASE WHEN r.running THEN now() + interval '1 hour' END,
       CASE WHEN r.running THEN now() END,
       jsonb_build_object('shape', r.s, 'j', r.j, 'pos', r.pos),
       now() - interval '1 minute', now() - interval '1 minute'
FROM r
RETURNING job_id, payload
"""


@dataclass(frozen=True)
class Keys:
    pg: psycopg.Connection
    # (shape, pos) -> the job ids of that place, key by key
    ids: dict[tuple[int, int], list[Any]]

    def take(self, place: tuple[int, int], part: int) -> list[Any]:
        """The jobs of ``place`` in the test's own ``part`` of the keys."""
        return self.ids[place][part * EACH_PLACE : (part + 1) * EACH_PLACE]


@pytest.fixture(scope="module", params=KEYS)
def keys(request: pytest.FixtureRequest, template_db: str) -> Iterator[Keys]:
    count: int = request.param
    with _database("hj_keys", template=template_db) as name:
        started = time.monotonic()

        def history(first: int, last: int) -> None:
            with _connect(name) as conn:
                conn.execute(KEY_HISTORY, {"first": first, "last": last})

        with ThreadPoolExecutor(2) as pool:
            halves = [
                pool.submit(history, 1, count // 2),
                pool.submit(history, count // 2 + 1, count),
            ]
            for half in halves:
                half.result()
        with _connect(name) as pg:
            ids: dict[tuple[int, int], list[Any]] = {}
            rows = pg.execute(KEY_SHAPES, {"keys": count, "per": PER_SHAPE}).fetchall()
            for job_id, p in sorted(rows, key=lambda r: (r[1]["shape"], r[1]["pos"], r[1]["j"])):
                ids.setdefault((p["shape"], p["pos"]), []).append(job_id)
            pg.execute("SELECT setval('jobs_key_seq', %s)", [count + 10 * PER_SHAPE])
            # the running ones hold their keys
            pg.execute(
                "INSERT INTO key_usage (key, running, key_limit)"
                " SELECT key, 1, 1 FROM jobs WHERE state = 'RUNNING'"
            )
            # every waiting job's wake-up in flight: sent, not yet taken up
            pg.execute(
                "INSERT INTO outbox (job_id, queue, available_at, sent_at)"
                " SELECT job_id, queue, now() - interval '1 minute', now() - interval '1 second'"
                " FROM jobs WHERE state = 'QUEUED'"
            )
            pg.execute("VACUUM ANALYZE")
        print(f"keys ({count:,}): set up in {time.monotonic() - started:.1f} s")
        with _connect(name, CONTROL_OPTIONS) as consumer:
            yield Keys(consumer, ids)


def _key_batch(k: Keys, part: int) -> dict[Any, str]:
    """10 jobs of each place a keyed job can wait in (50 jobs, 40 keys), with what the
    claim answers each."""
    wanted = {
        (FREE, 0): "claimed",
        (HEAD, 0): "claimed",
        (HEAD, 1): "KEY_ORDER",  # behind its head, waiting (in this very batch)
        (RUNNING_ORDERED, 1): "KEY_ORDER",
        (BUSY, 1): "KEY_BUSY",
    }
    return {i: status for place, status in wanted.items() for i in k.take(place, part)}


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_the_keyed_claim_reads_its_batch_not_every_key(keys: Keys, generic: bool) -> None:
    """The claim of 50 keyed jobs of 40 keys, with the key gate's steps alone
    (job_claim_many({"key"}), as the consumer composes it for such a batch), reads a
    few index rows per job. Measured: 160 of jobs (each id looked up a few times:
    locked, refused or claimed, answered; and a probe of jobs_key_order_idx per
    ordered job), 60 of outbox (a used-up wake-up per refusal: 30 index entries and
    their 30 rows), none of key_usage by a scan: its upsert arbitrates 30 rows (20
    inserted, 10 conflicting: a key per admitted job) through the primary key.
    Bounded at 5 rows of jobs and 2 of outbox per job (1.6 times what was measured)
    and a key_usage row per key of the batch (40), far below a scan: every job of
    the history (200,000, or a million), 1,500 wake-ups, 600 key_usage rows."""
    pg = keys.pg
    expected = _key_batch(keys, part=int(generic))
    batch = list(expected)
    statement = q.job_claim_many({"key"})
    params = claim_params(batch, WORKER)
    found = explain_plan(pg, statement, params, generic=generic)
    read = read_by(found, "jobs", "key_usage", "outbox")
    _report("keyed claim", generic, found, read)
    no_seq_scan(read, "jobs", "key_usage", "outbox")
    assert total(read, "jobs") <= 5 * BATCH, read
    assert total(read, "outbox") <= 2 * BATCH, read
    assert total(read, "key_usage") == 0, read
    (upsert,) = upserts(found[0]["Plan"], "key_usage")
    assert upsert["Conflict Arbiter Indexes"] == ["key_usage_pkey"], upsert
    row = pg.execute("SELECT count(DISTINCT key) FROM jobs WHERE job_id = ANY(%s)", [batch])
    (keys_in_batch,) = row.fetchone() or (0,)
    assert upsert["Tuples Inserted"] + upsert["Conflicting Tuples"] <= keys_in_batch, upsert
    # and it decides as it should
    with pg.transaction(force_rollback=True):
        rows = pg.execute(statement, params).fetchall()
    assert {row[1]: row[0] for row in rows} == expected


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_the_end_of_keyed_leases_wakes_the_next_reading_a_few_rows_each(
    keys: Keys, generic: bool
) -> None:
    """The outcomes of 20 leases of keys with a job waiting behind each (10 ordered,
    10 of key_limit 1), in one JOB_FINISH_MANY: each lease ends, its key's usage row
    goes and the job behind it is woken. Measured: 120 rows of jobs (the lease by
    its id, a few times; the key's next waiting job by jobs_key_waiting_idx), 40 of
    key_usage (each key's row, locked, then deleted) and 20 of outbox (the woken
    job's wake-ups, looked for pending ones). Bounded at 10, 3 and 3 per lease: 1.7
    times the jobs measured, 1.5 times key_usage, 3 times outbox (1 each); a scan
    reads every job of the history (200,000, or a million), 600 key_usage rows and
    1,500 wake-ups."""
    pg = keys.pg
    part = 2 + int(generic)
    leases = keys.take((RUNNING_ORDERED, 0), part) + keys.take((BUSY, 0), part)
    behind = keys.take((RUNNING_ORDERED, 1), part) + keys.take((BUSY, 1), part)
    params = {
        "outcomes": json.dumps(
            [{"job_id": str(i), "generation": 1, "kind": "succeeded"} for i in leases]
        ),
        "worker": HOLDER,
    }
    found = explain_plan(pg, q.JOB_FINISH_MANY, params, generic=generic)
    read = read_by(found, "jobs", "key_usage", "outbox")
    _report("keyed outcome", generic, found, read)
    no_seq_scan(read, "jobs", "key_usage", "outbox")
    assert total(read, "jobs") <= 10 * len(leases), read
    assert total(read, "key_usage") <= 3 * len(leases), read
    assert total(read, "outbox") <= 3 * len(leases), read
    # and it does what it should: every lease ended, its key let go, the next woken
    with pg.transaction(force_rollback=True):
        ended = pg.execute(q.JOB_FINISH_MANY, params).fetchall()
        held = pg.execute(
            "SELECT count(*) FROM key_usage"
            " WHERE key IN (SELECT key FROM jobs WHERE job_id = ANY(%s))",
            [leases],
        ).fetchone()
        woken = pg.execute(
            "SELECT job_id FROM outbox WHERE sent_at IS NULL AND job_id = ANY(%s)", [behind]
        ).fetchall()
    assert sorted(ended) == sorted((i, "SUCCEEDED") for i in leases)
    assert held == (0,)
    assert sorted(r[0] for r in woken) == sorted(behind)


# ---------------------------------------------------------------- capped tenants

TENANTS = 10_000
EACH = 10
CAP = 5
QUEUE = "default"
WINDOW = 200

TENANT_SEED = [
    "INSERT INTO tenant_limits (tenant, max_running)"
    " SELECT 't' || lpad(g::text, 5, '0'), %(cap)s FROM generate_series(1, %(tenants)s) AS g",
    # every tenth tenant (its name ends in 0) at its cap, by leases that hold a slot
    "INSERT INTO tenant_usage (tenant, running)"
    " SELECT tenant, CASE WHEN right(tenant, 1) = '0' THEN max_running ELSE 0 END"
    " FROM tenant_limits",
    "INSERT INTO jobs (job_id, job_type, tenant, state, lease_owner, lease_expires_at,"
    "                  lease_generation, attempt_count, max_attempts, holds_slot, started_at)"
    f" SELECT gen_random_uuid(), 'noop', u.tenant, 'RUNNING', '{HOLDER}',"
    "        now() + interval '1 hour', 1, 1, 3, true, now()"
    " FROM tenant_usage AS u, generate_series(1, u.running)",
    # EACH jobs waiting for each tenant, each with an unsent wake-up
    "INSERT INTO jobs (job_id, job_type, tenant, run_after, created_at)"
    " SELECT gen_random_uuid(), 'noop', 't' || lpad((g %% %(tenants)s + 1)::text, 5, '0'),"
    "        now() - interval '1 hour', now() - interval '1 hour'"
    " FROM generate_series(1, %(tenants)s::int * %(each)s) AS g",
    "INSERT INTO outbox (job_id, queue, tenant, available_at)"
    " SELECT job_id, queue, tenant, now() - interval '1 hour' FROM jobs WHERE state = 'QUEUED'",
    # the queue's fair shares as the relay's last pass left them: the capped tenants
    # held back by their cap, the others by the share of the room others got
    "INSERT INTO fair_shares (queue, tenant, vpass, held_reason)"
    f" SELECT '{QUEUE}', u.tenant, 0,"
    "        CASE WHEN u.running >= %(cap)s THEN 'TENANT_CAP' ELSE 'FAIR_SHARE' END"
    " FROM tenant_usage AS u"
    f" UNION ALL SELECT '{QUEUE}', '*', 0, NULL",
]


@dataclass(frozen=True)
class Tenants:
    name: str
    pg: psycopg.Connection
    # per test (custom, generic): a job of each of 50 tenants, and those of them whose
    # tenant is at its cap
    batches: tuple[list[Any], list[Any]]
    at_cap: set[Any]


@pytest.fixture(scope="module")
def tenants(template_db: str) -> Iterator[Tenants]:
    with _database("hj_tenants", template=template_db) as name:
        started = time.monotonic()
        with _connect(name) as pg:
            for statement in TENANT_SEED:
                pg.execute(statement, {"tenants": TENANTS, "each": EACH, "cap": CAP})
            # two batches of 50 tenants, spread over them (197 is prime to 10,000):
            # 45 with room, 5 at their cap; their wake-ups in flight (the relay sent them)
            spread = [f"t{g * 197 % TENANTS + 1:05d}" for g in range(1, 200)]
            room = [t for t in spread if not t.endswith("0")]
            full = [f"t{g * 990:05d}" for g in range(1, 11)]
            chosen = [room[:45] + full[:5], room[45:90] + full[5:]]
            pick = (
                "SELECT DISTINCT ON (tenant) job_id, tenant FROM jobs"
                " WHERE state = 'QUEUED' AND tenant = ANY(%s) ORDER BY tenant, job_id"
            )
            batches = tuple([r[0] for r in pg.execute(pick, [ts]).fetchall()] for ts in chosen)
            at_cap = {r[0] for r in pg.execute(pick, [full]).fetchall()}
            assert [len(b) for b in batches] == [BATCH, BATCH]
            pg.execute(
                "UPDATE outbox SET sent_at = now() WHERE job_id = ANY(%s)",
                [batches[0] + batches[1]],
            )
            pg.execute("VACUUM ANALYZE")
        print(f"tenants: set up in {time.monotonic() - started:.1f} s")
        with _connect(name, CONTROL_OPTIONS) as consumer:
            yield Tenants(name, consumer, (batches[0], batches[1]), at_cap)


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_a_plain_claim_reads_its_own_tenants_of_ten_thousand(
    tenants: Tenants, generic: bool
) -> None:
    """The plain claim of 50 jobs of 50 tenants (5 at their cap) reads those tenants'
    rows: measured 50 of tenant_limits (their limits, and the probe of the dedicated
    ones, none) and 95 of tenant_usage (50 locked, 45 taken), of 10,000 each; and 150
    of jobs. Bounded at 3 rows of each tenant table and 5 of jobs per job (1.6 times
    the most measured): a scan of either tenant table reads 10,000."""
    pg = tenants.pg
    batch = tenants.batches[int(generic)]
    params = claim_params(batch, WORKER)
    found = explain_plan(pg, q.JOB_CLAIM_PLAIN_MANY, params, generic=generic)
    read = read_by(found, "jobs", "tenant_limits", "tenant_usage", "outbox")
    _report("plain claim", generic, found, read)
    no_seq_scan(read, "jobs", "tenant_limits", "tenant_usage", "outbox")
    assert total(read, "tenant_limits") <= 3 * BATCH, read
    assert total(read, "tenant_usage") <= 3 * BATCH, read
    assert total(read, "jobs") <= 5 * BATCH, read
    # and it decides as it should: the capped tenants' jobs are left for the whole claim
    with pg.transaction(force_rollback=True):
        rows = pg.execute(q.JOB_CLAIM_PLAIN_MANY, params).fetchall()
    status = {row[1]: row[0] for row in rows}
    full = tenants.at_cap & set(batch)
    assert len(full) == 5 and {i for i, s in status.items() if s == "full"} == full
    assert {i for i, s in status.items() if s == "claimed"} == set(batch) - full


def _decide(
    tenants: Tenants, generic: bool, *, bulk: int, near: bool, scan: int
) -> tuple[list[Any], Any, Read]:
    """One relay decision over the tenants' queue, as the relay's connection runs
    it, rolled back: the wake-ups it sent, its summary row, and what its plan read."""
    params = {
        "queue": QUEUE,
        "limit": defaults.RELAY_BATCH_SIZE,
        "window": WINDOW,
        "min_window": defaults.RELAY_MIN_WINDOW,
        "slack": 0,
        "worker_ttl": defaults.WORKER_TTL_SECONDS,
        "bulk": bulk,
        "near": near,
        "scan": scan,
    }
    with _connect(tenants.name, RELAY_OPTIONS) as relay:
        found = explain_plan(relay, q.OUTBOX_WAKE_QUEUE, params, generic=generic)
        with relay.transaction(force_rollback=True):
            *sent, summary = relay.execute(q.OUTBOX_WAKE_QUEUE, params).fetchall()
    read = read_by(found, "outbox", "jobs", "tenant_limits", "tenant_usage", "fair_shares")
    _report("relay decision" + (", the next tenants" if near else ""), generic, found, read)
    return sent, summary, read


@pytest.mark.parametrize("bulk", [4, 4 * TENANTS], ids=["first-pass", "tenants-known"])
@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_the_relays_decision_reads_a_probe_per_tenant_with_a_backlog_and_its_room(
    tenants: Tenants, generic: bool, bulk: int
) -> None:
    """OUTBOX_WAKE_QUEUE's comment promises that what a pass reads is bounded by the
    room it fills, plus, per tenant with a backlog, one index probe or a few index
    rows. Here all 10,000 tenants have one (100,000 wake-ups), and 100 wake-ups are
    in flight in a window of 200: a room of 100, filled. The relay's first pass asks
    the decision to read 4 wake-ups in one go, and once it knows of 10,000 tenants,
    40,000 (which find 4,000 tenants' first ones; the other 6,000 are probed).
    Measured with a read of 4: 10,901 rows of outbox, the skip scan's 10,000 probes,
    a row each, and 901 for the window (the 100 in flight read three times, 400
    fetched for the 100 contenders, the 100 chosen locked and marked); and a row per
    tenant of tenant_limits, tenant_usage and fair_shares (10,000 and the clock's).
    The bound is the promise, not better: the rows read in one go, a row per tenant
    with a backlog, and 10 per wake-up of the window (in flight or room). A probe
    that read each tenant's wake-ups reads 110,000, a scan of the backlog 100,000 a
    time."""
    sent, summary, read = _decide(tenants, generic, bulk=bulk, near=False, scan=32)
    room = WINDOW - 2 * BATCH
    assert summary[3] == room and len(sent) == room, summary
    assert summary[7] == TENANTS, "the tenants it found, for the relay's next read"
    # (its summary row scans outbox for a due wake-up when there is no room to fill,
    # stopping at the first: not here, where that never runs)
    assert all(node != "Seq Scan" for node, _, loops in read["outbox"] if loops), read
    assert total(read, "outbox") <= bulk + TENANTS + 10 * WINDOW, read
    for relation in ("tenant_limits", "tenant_usage", "fair_shares"):
        assert total(read, relation) <= TENANTS + 10, read
    # the settling of the wake-ups in flight looks up their jobs, no others
    assert total(read, "jobs") <= 2 * BATCH, read


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_the_relays_decision_asked_for_the_next_tenants_reads_the_room_not_the_tenants(
    tenants: Tenants, generic: bool
) -> None:
    """The same pass asked for the next tenants only, as the relay asks once it knows
    of 10,000 tenants (a scan of twice the room): it reads the scan's 200 wake-ups
    (outbox_turn_idx), looks up the tenants met there by their keys, and fills its
    room of 100 with them, reading no tenant beyond. Bounded at 10 outbox rows per
    wake-up of the window and 3 rows of each tenant table per wake-up scanned; a
    read of every tenant reads 10,000 of each."""
    room = WINDOW - 2 * BATCH
    sent, summary, read = _decide(tenants, generic, bulk=4 * TENANTS, near=True, scan=2 * room)
    assert summary[3] == room and len(sent) == room, summary
    assert summary[8] is True and summary[7] is None, "the next tenants were enough"
    assert all(node != "Seq Scan" for node, _, loops in read["outbox"] if loops), read
    assert total(read, "outbox") <= 10 * WINDOW, read
    for relation in ("tenant_limits", "tenant_usage", "fair_shares"):
        assert total(read, relation) <= 3 * 2 * room + 10, read
    assert total(read, "jobs") <= 2 * BATCH, read
