"""Table definitions: the durable record.

These SQLAlchemy Core tables are the reference the migrations are checked against
(``tests/test_migrations.py`` compares a migrated database with this metadata), and
what a producer can query with SQLAlchemy. The transitions themselves are plain SQL
in :mod:`schema.queries`.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
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
from sqlalchemy.dialects.postgresql import DOUBLE_PRECISION, JSONB, UUID

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

# --------------------------------------------------------------- recurring schedules
# (issue 10.) A schedule enqueues a job at each of its occurrences; the relay fires
# them. schedule_fires is the ledger of occurrences: its primary key makes the
# database the arbiter between relays, so one occurrence fires at most once, and a
# skipped one says why.

MAX_SCHEDULE_NAME_LENGTH = 200
CATCHUP_MODES_SQL = "'all', 'latest', 'skip'"
FIRE_OUTCOMES_SQL = "'enqueued', 'skipped'"

schedules = Table(
    "schedules",
    metadata,
    Column("name", Text, primary_key=True),
    Column("job_type", Text, nullable=False),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # Exactly one of the two: a cron expression (read in `timezone`), or an interval
    # whose occurrences are its multiples since the Unix epoch.
    Column("cron", Text),
    Column("every_seconds", DOUBLE_PRECISION),
    Column("timezone", Text, nullable=False, server_default=text("'UTC'")),
    Column("queue", Text, nullable=False, server_default=text("'default'")),
    Column("tenant", Text),
    Column("priority", SmallInteger, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer),
    Column("catchup", Text, nullable=False, server_default=text("'latest'")),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    # The nominal UTC instant of the next occurrence: the relay walks forward from
    # here, never from "now", so no occurrence is skipped or shifted by a restart.
    Column("next_fire_at", DateTime(timezone=True), nullable=False),
    # The nominal instant of the latest occurrence decided, fired or skipped.
    Column("last_fire_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    # A definition's changes only; firing moves next_fire_at and last_fire_at alone.
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    CheckConstraint(
        f"char_length(name) BETWEEN 1 AND {MAX_SCHEDULE_NAME_LENGTH}", name="schedules_name_length"
    ),
    CheckConstraint(
        f"char_length(job_type) BETWEEN 1 AND {MAX_JOB_TYPE_LENGTH}",
        name="schedules_job_type_length",
    ),
    CheckConstraint("(cron IS NULL) <> (every_seconds IS NULL)", name="schedules_cron_xor_every"),
    CheckConstraint(
        "every_seconds IS NULL OR every_seconds >= 1", name="schedules_every_at_least_1s"
    ),
    CheckConstraint(f"queue ~ '{QUEUE_NAME_PATTERN}'", name="schedules_queue_name_valid"),
    CheckConstraint(
        f"tenant IS NULL OR tenant ~ '{QUEUE_NAME_PATTERN}'", name="schedules_tenant_valid"
    ),
    CheckConstraint(
        "max_attempts IS NULL OR max_attempts >= 1", name="schedules_max_attempts_positive"
    ),
    CheckConstraint(f"catchup IN ({CATCHUP_MODES_SQL})", name="schedules_catchup_valid"),
)

# The relay's question, "which schedules are due?", reads only the active ones.
Index("schedules_due_idx", schedules.c.next_fire_at, postgresql_where=text("NOT paused"))

schedule_fires = Table(
    "schedule_fires",
    metadata,
    Column(
        "schedule_name",
        Text,
        ForeignKey("schedules.name", ondelete="CASCADE", name="schedule_fires_schedule_name_fkey"),
        nullable=False,
    ),
    # The occurrence's nominal UTC instant: with the name, its identity.
    Column("scheduled_for", DateTime(timezone=True), nullable=False),
    Column("fired_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    # How late the relay decided (database now minus nominal instant).
    Column("delay_seconds", DOUBLE_PRECISION, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("skip_reason", Text),
    # No foreign key: retention deletes finished jobs, and the record of the
    # occurrence must stay (else the occurrence could look unfired).
    Column("job_id", UUID(as_uuid=True)),
    PrimaryKeyConstraint("schedule_name", "scheduled_for", name="schedule_fires_pkey"),
    CheckConstraint(f"outcome IN ({FIRE_OUTCOMES_SQL})", name="schedule_fires_outcome_valid"),
    CheckConstraint(
        "(outcome = 'enqueued') = (job_id IS NOT NULL AND skip_reason IS NULL)",
        name="schedule_fires_job_iff_enqueued",
    ),
)
