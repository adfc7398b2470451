"""The names and SQL fragments the tables are defined with: the durable record.

The statements of :mod:`schema.queries` and the table definitions share these
(the states a column may hold, the patterns a name must match, the notification
channels). The tables themselves, SQLAlchemy Core metadata (the reference the
migrations are checked against, ``tests/test_migrations.py``, and what a producer
can query with SQLAlchemy), are in :mod:`schema.metadata`; they are importable from
here by their names too (``from hybrid_jobs.schema.tables import metadata, jobs``),
which imports SQLAlchemy only then: the daemons need only the names, and importing
SQLAlchemy would add a fifth of a second to each one's start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from hybrid_jobs import defaults
from hybrid_jobs.schema.states import CLAIMABLE, LEASED, REPLAYABLE, TERMINAL, DelayReason, JobState

if TYPE_CHECKING:
    from hybrid_jobs.schema.metadata import (
        NOW,
        concurrency_limits,
        dashboard_sessions,
        fair_shares,
        job_attempts,
        job_dependencies,
        job_effects,
        job_inputs,
        job_replays,
        job_requests,
        job_steps,
        job_tags,
        job_type_policies,
        job_type_webhooks,
        jobs,
        jobs_key_seq,
        key_usage,
        metadata,
        outbox,
        queue_limits,
        queues,
        rate_buckets,
        rate_limits,
        relays,
        resource_holds,
        resource_resolutions,
        schedule_fires,
        schedules,
        tenant_limits,
        tenant_usage,
        webhook_deliveries,
        workers,
    )


def _in(states: frozenset[JobState] | list[JobState]) -> str:
    return ", ".join(f"'{s}'" for s in sorted(states))


ALL_STATES = _in(list(JobState))
CLAIMABLE_SQL = _in(CLAIMABLE)
LEASED_SQL = _in(LEASED)
TERMINAL_SQL = _in(TERMINAL)
# FAILED and CANCELLED: the unsuccessful ends, which an operator may replay.
REPLAYABLE_SQL = _in(REPLAYABLE)
# The reasons a job waits for its resource, without a wake-up of its own.
RESOURCE_REFUSALS_SQL = f"'{DelayReason.RESOURCE_BUSY}', '{DelayReason.RESOURCE_UNCERTAIN}'"

# Queue and tenant names become RabbitMQ queue names and metric labels, so they keep
# to a conservative alphabet.
QUEUE_NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{defaults.MAX_QUEUE_NAME_LENGTH - 1}}}$"


def name_valid(column: str) -> str:
    """The CHECK that ``column`` holds a queue or tenant name: QUEUE_NAME_PATTERN,
    with its length counted apart. PostgreSQL checks every CHECK of a table at every
    write of a row, and its regular expressions expand a bounded repetition
    (``{0,99}``) into as many states: matched so, the name cost 6 microseconds a
    row, at every claim, outcome and heartbeat of every job, against 0.3 with ``*``
    and the length compared (migration 0037)."""
    return (
        f"char_length({column}) <= {defaults.MAX_QUEUE_NAME_LENGTH}"
        f" AND {column} ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$'"
    )


DEFAULT_MAX_ATTEMPTS = defaults.MAX_ATTEMPTS
MAX_JOB_TYPE_LENGTH = defaults.MAX_JOB_TYPE_LENGTH
MAX_DEDUP_KEY_LENGTH = defaults.MAX_DEDUP_KEY_LENGTH
# A webhook URL (enqueue's on_complete_url=, a handler's webhook=): http or https.
MAX_WEBHOOK_URL_LENGTH = 2048
MAX_KEY_LENGTH = defaults.MAX_KEY_LENGTH
MAX_WEIGHT = defaults.MAX_WEIGHT
# outbox.tenant of a job that belongs to no tenant: the fair-share grouping key needs
# a value that an index can order and compare, which NULL is not.
NO_TENANT = ""
# fair_shares.tenant of the row that holds a queue's virtual clock; not a valid
# tenant name, so it can never collide with one.
CLOCK_ROW = "*"

APPROVALS_SQL = "'APPROVED', 'REJECTED', 'REQUIRED'"
# The scopes a dedup key may be held under other than 'forever' (which is
# jobs.dedup_key, held until retention deletes the job): jobs.unique_key, held
# while unique_held() is true of the row, so that whatever statement moves the job
# out of its scope frees the key, with no write of its own. 'waiting': until its
# first claim (started_at is set by every claim and never cleared, so a retry or a
# snooze never takes it back); 'active': until it ends; 'period': for the window of
# the clock it was enqueued in, whatever its state (unique_until, the window's end,
# is part of the index, so the next window's enqueue holds another key).
UNIQUE_SCOPES_SQL = "'waiting', 'active', 'period'"


def unique_held(alias: str = "") -> str:
    """Whether a job's unique_key is held now: jobs_unique_idx's predicate, with its
    columns qualified by ``alias`` (``"j."``) for a statement's WHERE."""
    a = alias
    return (
        f"{a}unique_key IS NOT NULL AND CASE {a}unique_scope"
        f" WHEN 'waiting' THEN {a}state = 'QUEUED' AND {a}started_at IS NULL"
        f" WHEN 'active' THEN {a}state IN ({_in(CLAIMABLE | LEASED)})"
        " ELSE true END"
    )


# The end of the window of ``seconds`` (a period, windows counted from the Unix
# epoch, as River's ByPeriod does) that the transaction's now() falls in: the same
# in the insert and the look-up that follows it in the transaction.
def unique_window_end(seconds: str) -> str:
    return (
        f"to_timestamp((floor(extract(epoch FROM now()) / {seconds}::numeric) + 1)"
        f" * {seconds}::numeric)"
    )


# The run_after of a job that waits for approval: never due, so no claim, re-waker
# or orphan walk (each looks only at due jobs) can take it before outbox.approve
# makes it due. Finite, unlike 'infinity', which Python's datetime cannot hold.
APPROVAL_HOLD = "'9999-12-31 00:00:00+00'::timestamptz"

# How an attempt ended (job_attempts.outcome).
ATTEMPT_OUTCOMES = _in(
    [
        JobState.SUCCEEDED,
        JobState.RETRY_WAIT,
        JobState.FAILED,
        JobState.CANCELLED,
        # given back at a graceful stop: the attempt was refunded
        JobState.QUEUED,
    ]
)

# NOTIFY channels are per instance, "<schema>.<name>" (the schema's name cut to 48
# characters, as the triggers cut TG_TABLE_SCHEMA: a channel name has 63 bytes at
# most), so two instances in one database do not wake each other's listeners.
# The outbox trigger (migration 0001) notifies OUTBOX_CHANNEL on every insert (the
# queues of the wake-ups due, comma-separated; empty: any), and a freed tenant slot
# (migration 0003) too, with TENANT_SLOTS_FREED (migration 0035): no queue name.
OUTBOX_CHANNEL = "outbox"
TENANT_SLOTS_FREED = "*"
# A job's end is announced on JOB_FINISHED_CHANNEL, its id the payload: a trigger on
# jobs (migration 0012) notifies it whenever an update moves a job into a final
# state, delivered at that commit (outbox.wait_for listens).
JOB_FINISHED_CHANNEL = "job_finished"
# The instance's schema, as the statement's search_path finds its jobs table.
INSTANCE_SCHEMA_SQL = (
    "(SELECT n.nspname FROM pg_catalog.pg_namespace AS n"
    " JOIN pg_catalog.pg_class AS c ON c.relnamespace = n.oid WHERE c.oid = 'jobs'::regclass)"
)


def channel(schema: str, name: str) -> str:
    """The instance's NOTIFY channel ``name`` (OUTBOX_CHANNEL, JOB_FINISHED_CHANNEL)."""
    return f"{schema[:48]}.{name}"


def channel_sql(name: str) -> str:
    """:func:`channel` in SQL, for the instance the statement's search_path finds."""
    return f"left({INSTANCE_SCHEMA_SQL}, 48) || '.{name}'"


# A rate limit name: a tenant-like name, or a prefix of names followed by ':*'
# (the limit of every name with that prefix, each its own bucket).
RATE_LIMIT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}(:\*)?$"

# The recurring schedules' names, and what schedule_fires records of each occurrence.
MAX_SCHEDULE_NAME_LENGTH = defaults.MAX_SCHEDULE_NAME_LENGTH
# A resumable step's name, bounded by a CHECK on job_steps.name.
MAX_STEP_NAME_LENGTH = defaults.MAX_STEP_NAME_LENGTH
CATCHUP_MODES_SQL = "'all', 'latest', 'skip'"

# A job's tags: a few short names (in URLs, on the command line and as chips on the
# dashboard), so a conservative alphabet without commas or spaces; the CHECK on
# jobs.tags matches the comma-joined list against TAGS_PATTERN.
MAX_TAGS = defaults.MAX_TAGS
MAX_TAG_LENGTH = defaults.MAX_TAG_LENGTH
_TAG = rf"[A-Za-z0-9][A-Za-z0-9_.:/=-]{{0,{defaults.MAX_TAG_LENGTH - 1}}}"
TAG_PATTERN = rf"^{_TAG}$"
TAGS_PATTERN = rf"^{_TAG}(,{_TAG})*$"
# The CHECK's bound on jobs.meta as stored (pg_column_size of the jsonb): a backstop
# for rows written by hand. The producer bounds the compact JSON text at
# MAX_META_BYTES, which stores in at most about six times that (an array of zeros),
# so nothing the producer accepts meets this one.
MAX_META_STORED_BYTES = 16 * defaults.MAX_META_BYTES
FIRE_OUTCOMES_SQL = "'enqueued', 'skipped'"

__all__ = [
    "ALL_STATES",
    "APPROVALS_SQL",
    "APPROVAL_HOLD",
    "ATTEMPT_OUTCOMES",
    "CATCHUP_MODES_SQL",
    "CLAIMABLE_SQL",
    "CLOCK_ROW",
    "DEFAULT_MAX_ATTEMPTS",
    "FIRE_OUTCOMES_SQL",
    "INSTANCE_SCHEMA_SQL",
    "JOB_FINISHED_CHANNEL",
    "LEASED_SQL",
    "MAX_DEDUP_KEY_LENGTH",
    "MAX_JOB_TYPE_LENGTH",
    "MAX_KEY_LENGTH",
    "MAX_META_STORED_BYTES",
    "MAX_SCHEDULE_NAME_LENGTH",
    "MAX_STEP_NAME_LENGTH",
    "MAX_TAGS",
    "MAX_TAG_LENGTH",
    "MAX_WEBHOOK_URL_LENGTH",
    "MAX_WEIGHT",
    "NOW",
    "NO_TENANT",
    "OUTBOX_CHANNEL",
    "QUEUE_NAME_PATTERN",
    "RATE_LIMIT_NAME_PATTERN",
    "REPLAYABLE_SQL",
    "RESOURCE_REFUSALS_SQL",
    "TAGS_PATTERN",
    "TAG_PATTERN",
    "TENANT_SLOTS_FREED",
    "TERMINAL_SQL",
    "UNIQUE_SCOPES_SQL",
    "channel",
    "channel_sql",
    "concurrency_limits",
    "dashboard_sessions",
    "fair_shares",
    "job_attempts",
    "job_dependencies",
    "job_effects",
    "job_inputs",
    "job_replays",
    "job_requests",
    "job_steps",
    "job_tags",
    "job_type_policies",
    "job_type_webhooks",
    "jobs",
    "jobs_key_seq",
    "key_usage",
    "metadata",
    "name_valid",
    "outbox",
    "queue_limits",
    "queues",
    "rate_buckets",
    "rate_limits",
    "relays",
    "resource_holds",
    "resource_resolutions",
    "schedule_fires",
    "schedules",
    "tenant_limits",
    "tenant_usage",
    "unique_held",
    "unique_window_end",
    "webhook_deliveries",
    "workers",
]

# The SQLAlchemy objects of schema.metadata (the names above not defined here), given
# from here by their names on first use (PEP 562): tests/unit/test_lazy_imports.py checks
# that they are all there.
FROM_METADATA: Final = frozenset(__all__).difference(globals())


def __getattr__(name: str) -> Any:
    if name not in FROM_METADATA:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from hybrid_jobs.schema import metadata

    value = getattr(metadata, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *FROM_METADATA})
