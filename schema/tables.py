"""Table definitions: the durable record.

These SQLAlchemy Core tables are the reference the migrations are checked against
(``tests/test_migrations.py`` compares a migrated database with this metadata), and
what a producer can query with SQLAlchemy. The transitions themselves are plain SQL
in :mod:`schema.queries`.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

from schema.states import CLAIMABLE, LEASED, JobState

metadata = MetaData()


def _in(states: frozenset[JobState] | list[JobState]) -> str:
    return ", ".join(f"'{s}'" for s in sorted(states))


ALL_STATES = _in(list(JobState))
CLAIMABLE_SQL = _in(CLAIMABLE)
LEASED_SQL = _in(LEASED)

# Queue names become RabbitMQ queue names, so they keep to a conservative alphabet.
QUEUE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$"
# The attempt budget of a job enqueued without one and claimed by no handler that
# sets one.
DEFAULT_MAX_ATTEMPTS = 5
MAX_JOB_TYPE_LENGTH = 200
MAX_DEDUP_KEY_LENGTH = 500

NOW = text("now()")

jobs = Table(
    "jobs",
    metadata,
    Column("job_id", UUID(as_uuid=True), primary_key=True),
    Column("job_type", Text, nullable=False),
    Column("queue", Text, nullable=False, server_default=text("'default'")),
    Column("state", Text, nullable=False, server_default=text("'QUEUED'")),
    Column("priority", SmallInteger, nullable=False, server_default=text("0")),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("dedup_key", Text),
    Column("attempt_count", Integer, nullable=False, server_default=text("0")),
    # NULL until a handler that knows the job type first claims it: the producer
    # does not know the handler registry, so the handler's own setting must apply.
    Column("max_attempts", Integer),
    Column("run_after", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("lease_owner", Text),
    Column("lease_expires_at", DateTime(timezone=True)),
    Column("lease_generation", BigInteger, nullable=False, server_default=text("0")),
    Column("last_error_code", Text),
    Column("last_error_message", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    CheckConstraint(f"state IN ({ALL_STATES})", name="jobs_state_valid"),
    CheckConstraint(
        f"(state IN ({LEASED_SQL})) = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)",
        name="jobs_lease_iff_leased",
    ),
    CheckConstraint(
        "attempt_count >= 0 AND (max_attempts IS NULL OR attempt_count <= max_attempts)",
        name="jobs_attempts_within_budget",
    ),
    CheckConstraint("max_attempts IS NULL OR max_attempts >= 1", name="jobs_max_attempts_positive"),
    CheckConstraint("lease_generation >= 0", name="jobs_generation_non_negative"),
    CheckConstraint(
        f"char_length(job_type) BETWEEN 1 AND {MAX_JOB_TYPE_LENGTH}", name="jobs_job_type_length"
    ),
    CheckConstraint(f"queue ~ '{QUEUE_NAME_PATTERN}'", name="jobs_queue_name_valid"),
    CheckConstraint(
        f"dedup_key IS NULL OR char_length(dedup_key) BETWEEN 1 AND {MAX_DEDUP_KEY_LENGTH}",
        name="jobs_dedup_key_length",
    ),
)

# The claim itself goes by primary key (a delivery names the job); this index serves
# the re-waker, which looks for due claimable jobs, and stays as small as the backlog.
Index(
    "jobs_claimable_idx",
    jobs.c.run_after,
    postgresql_where=text(f"state IN ({CLAIMABLE_SQL})"),
)
Index(
    "jobs_dedup_idx",
    jobs.c.job_type,
    jobs.c.dedup_key,
    unique=True,
    postgresql_where=text("dedup_key IS NOT NULL"),
)
# The sweeper's index. It deliberately leaves lease_expires_at out: a heartbeat only
# moves lease_expires_at, so with no index on that column it stays a HOT update.
Index(
    "jobs_leased_idx",
    jobs.c.lease_owner,
    postgresql_where=text(f"state IN ({LEASED_SQL})"),
)

ATTEMPT_OUTCOMES = _in(
    [JobState.SUCCEEDED, JobState.RETRY_WAIT, JobState.FAILED, JobState.CANCELLED]
)

job_attempts = Table(
    "job_attempts",
    metadata,
    Column(
        "job_id",
        UUID(as_uuid=True),
        ForeignKey("jobs.job_id", ondelete="CASCADE", name="job_attempts_job_id_fkey"),
        nullable=False,
    ),
    Column("attempt", Integer, nullable=False),
    Column("lease_generation", BigInteger, nullable=False),
    Column("worker", Text, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False),
    # The state the attempt left the job in.
    Column("outcome", Text, nullable=False),
    Column("error_code", Text),
    Column("error_message", Text),
    PrimaryKeyConstraint("job_id", "attempt", name="job_attempts_pkey"),
    CheckConstraint(f"outcome IN ({ATTEMPT_OUTCOMES})", name="job_attempts_outcome_valid"),
    CheckConstraint("attempt >= 1", name="job_attempts_attempt_positive"),
)

outbox = Table(
    "outbox",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column(
        "job_id",
        UUID(as_uuid=True),
        ForeignKey("jobs.job_id", ondelete="CASCADE", name="outbox_job_id_fkey"),
        nullable=False,
    ),
    Column("queue", Text, nullable=False),
    # A wake-up may be due later: delayed jobs and retries are woken when they are due.
    Column("available_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("sent_at", DateTime(timezone=True)),
)

Index(
    "outbox_unsent_idx",
    outbox.c.available_at,
    outbox.c.id,
    postgresql_where=text("sent_at IS NULL"),
)
# The re-waker asks "was this job woken lately?" and the job's delete cascades here.
Index("outbox_job_id_idx", outbox.c.job_id)
# Pruning walks sent rows oldest first and stops at the retention cutoff.
Index("outbox_sent_idx", outbox.c.sent_at, postgresql_where=text("sent_at IS NOT NULL"))

# The channel the outbox trigger (migration 0001) notifies on every insert.
OUTBOX_CHANNEL = "outbox"

# Effects a handler marked done, once per key (see consumers.JobTransaction.once).
# No foreign key: the record of an effect outlives the job that performed it.
job_effects = Table(
    "job_effects",
    metadata,
    Column("effect_key", Text, primary_key=True),
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)
