"""The tables as SQLAlchemy Core metadata: the durable record.

These tables are the reference the migrations are checked against
(``tests/test_migrations.py`` compares a migrated database with this metadata), and
what a producer can query with SQLAlchemy. The transitions themselves are plain SQL
in :mod:`schema.queries`; the names and SQL fragments the statements and these
definitions share are in :mod:`schema.tables`, which also gives each object here by
its name (``from hybrid_jobs.schema.tables import metadata, jobs``), importing this
module, and SQLAlchemy, only then.
"""

from __future__ import annotations

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Sequence,
    SmallInteger,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import DOUBLE_PRECISION, JSONB, UUID

from hybrid_jobs.schema.states import DelayReason
from hybrid_jobs.schema.tables import (
    ALL_STATES,
    APPROVAL_HOLD,
    APPROVALS_SQL,
    ATTEMPT_OUTCOMES,
    CATCHUP_MODES_SQL,
    CLAIMABLE_SQL,
    FIRE_OUTCOMES_SQL,
    LEASED_SQL,
    MAX_DEDUP_KEY_LENGTH,
    MAX_JOB_TYPE_LENGTH,
    MAX_KEY_LENGTH,
    MAX_META_STORED_BYTES,
    MAX_SCHEDULE_NAME_LENGTH,
    MAX_STEP_NAME_LENGTH,
    MAX_TAGS,
    MAX_WEBHOOK_URL_LENGTH,
    MAX_WEIGHT,
    RATE_LIMIT_NAME_PATTERN,
    REPLAYABLE_SQL,
    RESOURCE_REFUSALS_SQL,
    TAGS_PATTERN,
    TERMINAL_SQL,
    UNIQUE_SCOPES_SQL,
    name_valid,
    unique_held,
)

metadata = MetaData()

NOW = text("now()")


def _ts(name: str, *, nullable: bool = True, default: bool = False) -> Column[object]:
    return Column(
        name, DateTime(timezone=True), nullable=nullable, server_default=NOW if default else None
    )


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
    _ts("created_at", nullable=False, default=True),
    _ts("updated_at", nullable=False, default=True),
    _ts("started_at"),
    _ts("finished_at"),
    # NULL: the job belongs to no tenant, and no tenant limit applies to it.
    Column("tenant", Text),
    # True while this lease holds one of its tenant's running slots (tenant_usage):
    # set by the claim that reserved it, cleared by the fenced statement that ends
    # the lease, so a slot is released exactly once.
    Column("holds_slot", Boolean, nullable=False, server_default=text("false")),
    # True while this lease holds one of its job type's concurrency_limits slots:
    # set by a claim through the limit, cleared by the statement that ends the lease.
    Column("limit_held", Boolean, nullable=False, server_default=text("false")),
    # True while this lease holds one of its queue's queue_limits slots: set by a
    # claim through the queue's limit, cleared by the statement that ends the lease.
    Column("queue_limit_held", Boolean, nullable=False, server_default=text("false")),
    # The slots one lease of the job takes (enqueue's weight=): of its consumer's
    # concurrency, its tenant's cap and its type's concurrency limit. NULL is one,
    # so a plain job's row and statements never mention it.
    Column("weight", Integer),
    # The handler's backoff for this attempt, fixed at claim: the sweeper, which
    # knows no handlers, waits this long before retrying an expired lease.
    Column("expiry_backoff", Float),
    # Why a consumer turned the job's last wake-up down (TENANT_CAP, QUEUE_PAUSED,
    # NO_HANDLER), and since when that has been so; cleared by the claim.
    Column("delay_reason", Text),
    _ts("delay_since"),
    _ts("cancel_requested_at"),
    # Set when the cancel was asked with force: the lease holder learns it at its
    # next heartbeat and interrupts the handler (outbox.request_cancel(force=True)).
    _ts("cancel_forced_at"),
    # Who asked this running job to stop although its type's policy forbids it
    # (request_cancel(..., override_policy=True)); when is cancel_requested_at.
    Column("cancel_override_by", Text),
    # What the handler reported while running (job.progress) and returned.
    Column("progress", JSONB),
    _ts("progress_at"),
    Column("result", JSONB),
    # The nominal instant of the schedule occurrence that fired the job (NULL: not
    # fired by a schedule), so jobs of one schedule can tell their periods apart.
    _ts("scheduled_for"),
    # NULL: enqueued without needs_approval. REQUIRED: it waits, held not due
    # (run_after = APPROVAL_HOLD, no wake-up) until outbox.approve makes it due and
    # wakes it (APPROVED) or outbox.reject cancels it (REJECTED); who decided, when.
    Column("approval", Text),
    Column("approval_by", Text),
    _ts("approval_at"),
    # The W3C trace context ({"traceparent": ..., "tracestate": ...}) of the code
    # that enqueued the job, when it ran in a trace (the otel extra); NULL otherwise.
    Column("trace_context", JSONB),
    # A job not started by then never starts: the claim, or the relay's sweep of
    # jobs nobody wakes, ends it CANCELLED with last_error_code EXPIRED.
    _ts("expires_at"),
    # A debounced job's dedup key (its own column: a debounced key is free again
    # once its job starts, see jobs_debounce_idx), and the latest its start may be
    # moved to by a new enqueue (debounce_max after the first).
    Column("debounce_key", Text),
    _ts("debounce_until"),
    # The rate limit (rate_limits) the job takes a token of when it is claimed.
    Column("rate_limit", Text),
    # The entity the job is about (key_usage): at most key_limit jobs with one key
    # hold a lease at once. NULL: no key, no such limit.
    Column("key", Text),
    Column("key_limit", Integer),
    # 'ordered' or 'strict': jobs of the key start in key_seq order, one after the
    # other; 'strict' also holds the key behind one of them that FAILED, until it is
    # replayed. key_seq comes from jobs_key_seq under the key's advisory lock, so it
    # follows the commit order of the enqueues.
    Column("key_order", Text),
    # Dependencies (job_dependencies): how many of the job's parents have not
    # settled yet (SUCCEEDED, or ended otherwise under on_parent_failure 'run').
    # Kept by the triggers jobs_release_dependants and jobs_count_dependants
    # (migrations 0015, 0018) in the statement that ends each parent, so the last one
    # wakes the job without a count(*). While above 0 the job is held not due
    # (run_after = APPROVAL_HOLD, no wake-up).
    Column("parents_pending", Integer, nullable=False, server_default=text("0")),
    # 'cancel' or 'run' for a job enqueued with after=; NULL otherwise.
    Column("on_parent_failure", Text),
    # Set when a job is named in another's after=: the trigger's WHEN clause skips
    # the end of every job nobody waits for without looking at job_dependencies.
    Column("has_dependants", Boolean, nullable=False, server_default=text("false")),
    Column("key_seq", BigInteger),
    # The exclusive resource the job acts on (resource_holds): at most one lease of
    # any job with it at once, and none while it is uncertain. NULL: none.
    Column("resource", Text),
    # What the producer labelled the job with (enqueue's tags= and meta=): shown by
    # every surface, searched by the operator's lists. A few short names, and a small
    # JSON object, NULL when none was given so that a plain job's row stays narrow.
    # The search by tag reads job_tags, which holds the same tags one row each.
    Column("tags", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("meta", JSONB),
    # A dedup key held under a scope other than 'forever' (enqueue's unique=): the
    # key, its scope ('waiting', 'active' or 'period') and, for a period, the end of
    # the window it was enqueued in. Held while unique_held() is true of the row
    # (jobs_unique_idx); kept afterwards, for the surfaces to show. NULL: none.
    Column("unique_key", Text),
    Column("unique_scope", Text),
    _ts("unique_until"),
    # The URL called when the job ends (enqueue's on_complete_url=; trigger
    # jobs_finished owes a call to it); NULL: none of its own, its type's if any.
    Column("webhook_url", Text),
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
    CheckConstraint(name_valid("queue"), name="jobs_queue_name_valid"),
    CheckConstraint(
        f"dedup_key IS NULL OR char_length(dedup_key) BETWEEN 1 AND {MAX_DEDUP_KEY_LENGTH}",
        name="jobs_dedup_key_length",
    ),
    CheckConstraint(f"tenant IS NULL OR ({name_valid('tenant')})", name="jobs_tenant_name_valid"),
    CheckConstraint(f"NOT holds_slot OR state IN ({LEASED_SQL})", name="jobs_slot_only_leased"),
    CheckConstraint(
        f"weight IS NULL OR weight BETWEEN 2 AND {MAX_WEIGHT}", name="jobs_weight_range"
    ),
    CheckConstraint(f"approval IN ({APPROVALS_SQL})", name="jobs_approval_valid"),
    CheckConstraint("parents_pending >= 0", name="jobs_parents_pending_non_negative"),
    CheckConstraint("on_parent_failure IN ('cancel', 'run')", name="jobs_on_parent_failure_valid"),
    # A job that waits for a parent is never due: nothing claims it early.
    CheckConstraint(
        f"parents_pending = 0 OR state <> 'QUEUED' OR run_after = {APPROVAL_HOLD}",
        name="jobs_dependency_held",
    ),
    # Nothing claims a job that waits for approval: it is never due (and no
    # statement but a cancel, from QUEUED, moves it).
    CheckConstraint(
        f"approval IS DISTINCT FROM 'REQUIRED'"
        f" OR (state IN ('QUEUED', 'CANCELLED') AND run_after = {APPROVAL_HOLD})",
        name="jobs_unapproved_held",
    ),
    CheckConstraint(
        "(approval IN ('APPROVED', 'REJECTED')) = (approval_at IS NOT NULL)",
        name="jobs_approval_decided_at",
    ),
    CheckConstraint(
        f"key IS NULL OR char_length(key) BETWEEN 1 AND {MAX_KEY_LENGTH}", name="jobs_key_length"
    ),
    CheckConstraint(
        "(key IS NULL) = (key_limit IS NULL) AND (key_limit IS NULL OR key_limit >= 1)",
        name="jobs_key_limit_valid",
    ),
    CheckConstraint(
        "key_order IS NULL OR (key_order IN ('ordered', 'strict') AND key IS NOT NULL"
        " AND key_seq IS NOT NULL)",
        name="jobs_key_order_valid",
    ),
    CheckConstraint(
        f"resource IS NULL OR char_length(resource) BETWEEN 1 AND {MAX_KEY_LENGTH}",
        name="jobs_resource_length",
    ),
    # A job takes its key's leases or its resource, never both: the claim could take
    # one and then be refused the other, and neither can be given back in the statement
    # that took it.
    CheckConstraint("key IS NULL OR resource IS NULL", name="jobs_key_or_resource"),
    # The comma-joined list against the pattern (a CHECK takes no subquery to test
    # each element): no NULL element, which array_to_string would skip, one dimension.
    CheckConstraint(
        f"cardinality(tags) = 0 OR (cardinality(tags) <= {MAX_TAGS} AND array_ndims(tags) = 1"
        " AND array_position(tags, NULL) IS NULL"
        f" AND array_to_string(tags, ',') ~ '{TAGS_PATTERN}')",
        name="jobs_tags_valid",
    ),
    CheckConstraint(
        "meta IS NULL OR (jsonb_typeof(meta) = 'object'"
        f" AND pg_column_size(meta) <= {MAX_META_STORED_BYTES})",
        name="jobs_meta_valid",
    ),
    CheckConstraint(
        "(unique_key IS NULL) = (unique_scope IS NULL)"
        f" AND (unique_scope IS NULL OR unique_scope IN ({UNIQUE_SCOPES_SQL}))"
        " AND (unique_scope IS NOT DISTINCT FROM 'period') = (unique_until IS NOT NULL)"
        " AND (unique_key IS NULL"
        f" OR char_length(unique_key) BETWEEN 1 AND {MAX_DEDUP_KEY_LENGTH})",
        name="jobs_unique_valid",
    ),
)

# The numbers of ordered jobs, in the commit order of their enqueues per key.
jobs_key_seq = Sequence("jobs_key_seq", metadata=metadata)

# Jobs waiting to run, per queue and state, oldest first: the oldest runnable job
# per queue is one probe, and counts per state read only the backlog.
Index(
    "jobs_claimable_idx",
    jobs.c.queue,
    jobs.c.state,
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
# The sweeper's and the counts' index. It deliberately leaves lease_expires_at out:
# a heartbeat only moves lease_expires_at, so with no index on that column it stays
# a HOT update.
Index(
    "jobs_leased_idx",
    jobs.c.queue,
    jobs.c.state,
    postgresql_where=text(f"state IN ({LEASED_SQL})"),
)
# Retention walks finished jobs oldest first; the operator surface lists failed and
# cancelled ones, which stay few, newest first.
Index(
    "jobs_finished_idx",
    jobs.c.finished_at,
    postgresql_where=text(f"state IN ({TERMINAL_SQL})"),
)
Index(
    "jobs_unsuccessful_idx",
    jobs.c.queue,
    jobs.c.finished_at,
    postgresql_where=text(f"state IN ({REPLAYABLE_SQL})"),
)
# The operator surface's lists of failed and cancelled jobs, newest finished first
# across queues: a bounded walk of this index, never of the succeeded history.
Index(
    "jobs_unsuccessful_finished_idx",
    jobs.c.finished_at,
    jobs.c.job_id,
    postgresql_where=text(f"state IN ({REPLAYABLE_SQL})"),
)
# A tenant's waiting jobs, for its backpressure count (max_queued).
Index(
    "jobs_tenant_waiting_idx",
    jobs.c.tenant,
    jobs.c.created_at,
    postgresql_where=text(f"state IN ({CLAIMABLE_SQL}) AND tenant IS NOT NULL"),
)
# The relay's sweep of waiting jobs past their deadline (expires_at), soonest first.
Index(
    "jobs_expiring_idx",
    jobs.c.expires_at,
    postgresql_where=text(f"expires_at IS NOT NULL AND state IN ({CLAIMABLE_SQL})"),
)
# Jobs waiting for a rate limit's token, and jobs that expired (kept until
# retention deletes them): the metrics' gauges count these, and no other rows.
Index(
    "jobs_rate_limited_idx",
    jobs.c.queue,
    postgresql_where=text(f"delay_reason = 'RATE_LIMITED' AND state IN ({CLAIMABLE_SQL})"),
)
Index(
    "jobs_expired_idx",
    jobs.c.queue,
    postgresql_where=text("state = 'CANCELLED' AND last_error_code = 'EXPIRED'"),
)
# A debounce key is held while its job has not started, and only then: an enqueue
# with the key replaces that job (ON CONFLICT ... DO UPDATE), and once it has
# started, makes a new one.
Index(
    "jobs_debounce_idx",
    jobs.c.job_type,
    jobs.c.debounce_key,
    unique=True,
    postgresql_where=text("debounce_key IS NOT NULL AND state = 'QUEUED' AND started_at IS NULL"),
)
# A scoped dedup key (enqueue's unique=) is held while the predicate is true of its
# job: an enqueue with a held key inserts nothing (ON CONFLICT DO NOTHING) and
# returns the holder, and whatever moves the holder out of its scope frees the key.
# NULLS NOT DISTINCT: the scopes without a window hold (job_type, key, NULL).
Index(
    "jobs_unique_idx",
    jobs.c.job_type,
    jobs.c.unique_key,
    jobs.c.unique_until,
    unique=True,
    postgresql_nulls_not_distinct=True,
    postgresql_where=text(unique_held()),
)
# A key's waiting jobs in the order the end of a lease wakes the next of them
# (order, then age); and the jobs an ordered job may wait behind (those waiting,
# running, or strictly held FAILED), so neither walks a key's finished history.
Index(
    "jobs_key_waiting_idx",
    jobs.c.key,
    jobs.c.key_seq,
    jobs.c.job_id,
    postgresql_where=text(f"key IS NOT NULL AND state IN ({CLAIMABLE_SQL})"),
)
Index(
    "jobs_key_order_idx",
    jobs.c.key,
    jobs.c.key_seq,
    postgresql_where=text(
        f"key_seq IS NOT NULL AND (state IN ({CLAIMABLE_SQL}, {LEASED_SQL})"
        " OR (state = 'FAILED' AND key_order = 'strict'))"
    ),
)
# Who holds a key now (explain, the checks).
Index(
    "jobs_key_leased_idx",
    jobs.c.key,
    postgresql_where=text(f"key IS NOT NULL AND state IN ({LEASED_SQL})"),
)
# A resource's waiting jobs in the order the end of its hold wakes the next: the
# oldest (job ids are time-ordered).
Index(
    "jobs_resource_waiting_idx",
    jobs.c.resource,
    jobs.c.job_id,
    postgresql_where=text(f"resource IS NOT NULL AND state IN ({CLAIMABLE_SQL})"),
)
# The jobs turned down for their type's concurrency limit, oldest first: the ones
# a freed slot wakes are the first entries, however many wait (limit_wake_next).
Index(
    "jobs_limit_waiting_idx",
    jobs.c.job_type,
    jobs.c.job_id,
    postgresql_where=text(
        f"state IN ({CLAIMABLE_SQL}) AND delay_reason = '{DelayReason.CONCURRENCY_LIMIT}'"
    ),
)
# The jobs turned down for their queue's concurrency limit, oldest first: the ones
# a freed slot wakes are the first entries, however many wait
# (queue_limit_wake_next).
Index(
    "jobs_queue_limit_waiting_idx",
    jobs.c.queue,
    jobs.c.job_id,
    postgresql_where=text(
        f"state IN ({CLAIMABLE_SQL}) AND delay_reason = '{DelayReason.QUEUE_CONCURRENCY_LIMIT}'"
    ),
)
# The jobs turned down for their resource, oldest first: the one a freed resource
# wakes is the first entry, however many wait (resource_wake_next).
Index(
    "jobs_resource_refused_idx",
    jobs.c.resource,
    jobs.c.job_id,
    postgresql_where=text(
        f"resource IS NOT NULL AND state IN ({CLAIMABLE_SQL})"
        f" AND delay_reason IN ({RESOURCE_REFUSALS_SQL})"
    ),
)
# Jobs no live consumer can run wait here until one that knows their type starts.
Index(
    "jobs_no_handler_idx",
    jobs.c.queue,
    jobs.c.job_type,
    postgresql_where=text(
        f"delay_reason = '{DelayReason.NO_HANDLER}' AND state IN ({CLAIMABLE_SQL})"
    ),
)

# Jobs turned down as heavier than the whole concurrency of their consumer: found
# when a larger consumer starts, which brings their wake-ups forward.
Index(
    "jobs_too_heavy_idx",
    jobs.c.queue,
    jobs.c.job_type,
    postgresql_where=text(
        f"delay_reason = '{DelayReason.WEIGHT_OVER_CONCURRENCY}' AND state IN ({CLAIMABLE_SQL})"
    ),
)

# Jobs of a dedicated tenant no live consumer naming it could take wait here until
# one starts.
Index(
    "jobs_no_runner_idx",
    jobs.c.tenant,
    jobs.c.queue,
    postgresql_where=text(
        f"delay_reason = '{DelayReason.NO_AUTHORIZED_RUNNER}' AND state IN ({CLAIMABLE_SQL})"
    ),
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
    _ts("started_at", nullable=False),
    _ts("finished_at", nullable=False),
    # The state the attempt left the job in.
    Column("outcome", Text, nullable=False),
    Column("error_code", Text),
    Column("error_message", Text),
    # When the job became runnable for this attempt: started_at minus this is the
    # time it waited in the queue.
    _ts("ready_at"),
    # The handler's traceback, bounded, when the attempt ended in an exception.
    Column("traceback", Text),
    # A generation is unique per claim; an attempt number is not, since an attempt
    # given back at a graceful stop is refunded and its number used again.
    PrimaryKeyConstraint("job_id", "lease_generation", name="job_attempts_pkey"),
    CheckConstraint(f"outcome IN ({ATTEMPT_OUTCOMES})", name="job_attempts_outcome_valid"),
    CheckConstraint("attempt >= 1", name="job_attempts_attempt_positive"),
)
# The metrics collector reads the history incrementally, by when attempts ended.
Index("job_attempts_finished_idx", job_attempts.c.finished_at)

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
    _ts("available_at", nullable=False, default=True),
    _ts("created_at", nullable=False, default=True),
    # NULL: waiting for the relay (the backlog). Set: published, and not yet taken up
    # by a consumer (in flight); the relay deletes it once the job was claimed since.
    _ts("sent_at"),
    # Copied from the job, so the relay orders the backlog from this table alone.
    Column("tenant", Text, nullable=False, server_default=text("''")),
    Column("priority", SmallInteger, nullable=False, server_default=text("0")),
)

# The backlog in the order the relay wakes it: per queue and tenant, higher
# priority first, then oldest. Its leading columns also enumerate the queues and the
# tenants that have a backlog (a loose index scan).
Index(
    "outbox_pending_idx",
    outbox.c.queue,
    outbox.c.tenant,
    outbox.c.priority.desc(),
    outbox.c.available_at,
    outbox.c.id,
    postgresql_where=text("sent_at IS NULL"),
)
# The backlog of the jobs that have a tenant in the order the relay wakes it across
# tenants: higher priority first, then oldest. Where a queue has many tenants, the
# relay finds the tenants whose turn comes next from its first rows. No entry for a
# job of no tenant.
Index(
    "outbox_turn_idx",
    outbox.c.queue,
    outbox.c.priority.desc(),
    outbox.c.available_at,
    outbox.c.id,
    postgresql_include=["tenant"],
    postgresql_where=text("sent_at IS NULL AND tenant <> ''"),
)
# The oldest unsent wake-up, and the queues that have one due.
Index(
    "outbox_due_idx",
    outbox.c.available_at,
    outbox.c.queue,
    postgresql_where=text("sent_at IS NULL"),
)
# Wake-ups in flight, which the window counts: at most a window's worth per queue.
Index(
    "outbox_inflight_idx",
    outbox.c.queue,
    outbox.c.tenant,
    postgresql_where=text("sent_at IS NOT NULL"),
)
# A job's wake-ups, for the re-waker and the cascade when a job is deleted.
Index("outbox_job_id_idx", outbox.c.job_id)

# Effects a handler marked done, once per key (see consumers.JobTransaction.once).
# No foreign key: the record of an effect outlives the job that performed it (its
# retention deletes jobs, never effect keys), for as long as `relay --keep-effects`
# says, by default for ever.
job_effects = Table(
    "job_effects",
    metadata,
    Column("effect_key", Text, primary_key=True),
    Column("job_id", UUID(as_uuid=True), nullable=False),
    _ts("created_at", nullable=False, default=True),
)
# The effects' own retention deletes the oldest first.
Index("job_effects_created_idx", job_effects.c.created_at)

# One row per edge of enqueue(..., after=[...]): the child waits for the parent.
# position is the parent's place in after= (job.parent_results() keeps it); done is
# set, once, by the end of the parent that settles the edge (jobs_release_dependants),
# so a replayed parent that succeeds again never counts twice. Both ends cascade:
# retention deletes finished jobs, and a deleted parent has settled already (or its
# cancelled children went with it being finished).
job_dependencies = Table(
    "job_dependencies",
    metadata,
    Column(
        "child_id",
        UUID(as_uuid=True),
        ForeignKey("jobs.job_id", ondelete="CASCADE", name="job_dependencies_child_id_fkey"),
        nullable=False,
    ),
    Column(
        "parent_id",
        UUID(as_uuid=True),
        ForeignKey("jobs.job_id", ondelete="CASCADE", name="job_dependencies_parent_id_fkey"),
        nullable=False,
    ),
    Column("position", Integer, nullable=False),
    Column("done", Boolean, nullable=False, server_default=text("false")),
    # Set with done by the statement that settled the edge, once its child's count
    # went down (jobs_count_dependants, once per statement and child).
    Column("counted", Boolean, nullable=False, server_default=text("false")),
    PrimaryKeyConstraint("child_id", "parent_id", name="job_dependencies_pkey"),
)
# The end of a parent finds its children (the pkey finds a child's parents).
Index("job_dependencies_parent_idx", job_dependencies.c.parent_id, job_dependencies.c.child_id)
# The edges settled and not yet counted: empty but inside the statement that
# settles them, and read after every statement that sets a job's state.
Index(
    "job_dependencies_uncounted_idx",
    job_dependencies.c.child_id,
    postgresql_where=text("done AND NOT counted"),
)

# A job's tags, one row each, for the search by tag (jobs.tags holds the same list,
# for showing it): "the newest jobs with tag X" is a walk of the primary key
# backwards from (X, the page's start), bounded by the page however common or rare
# the tag, where a GIN index on jobs.tags would hand over every job with the tag
# unordered. Written by the statement that inserts the job (none for a job without
# tags); deleted with it.
job_tags = Table(
    "job_tags",
    metadata,
    Column("tag", Text, nullable=False),
    Column(
        "job_id",
        UUID(as_uuid=True),
        ForeignKey("jobs.job_id", ondelete="CASCADE", name="job_tags_job_id_fkey"),
        nullable=False,
    ),
    PrimaryKeyConstraint("tag", "job_id", name="job_tags_pkey"),
)
# The cascade when retention deletes a job. A hash index, which has no order: one on
# job_id in order would offer the search a walk of every job newest first, filtered
# on the tag, which the planner takes for a common tag and which for a rare one
# reads the whole table.
Index("job_tags_job_id_idx", job_tags.c.job_id, postgresql_using="hash")

# The finished steps of a job (job.step): one row per step name, written once,
# through the fence, by the attempt that finished it (attempt and lease_generation
# say which). A retry, a recovered lease or a replay reads them and skips those
# steps. They go with their job (ON DELETE CASCADE): retention deletes both; the
# primary key, job_id first, serves the cascade and the read of a job's steps.
job_steps = Table(
    "job_steps",
    metadata,
    Column(
        "job_id",
        UUID(as_uuid=True),
        ForeignKey("jobs.job_id", ondelete="CASCADE", name="job_steps_job_id_fkey"),
        nullable=False,
    ),
    Column("name", Text, nullable=False),
    # The step's return value as JSON; NULL for None.
    Column("result", JSONB),
    Column("attempt", Integer, nullable=False),
    Column("lease_generation", BigInteger, nullable=False),
    _ts("finished_at", nullable=False, default=True),
    PrimaryKeyConstraint("job_id", "name", name="job_steps_pkey"),
    CheckConstraint(
        f"char_length(name) BETWEEN 1 AND {MAX_STEP_NAME_LENGTH}", name="job_steps_name_length"
    ),
)

# ------------------------------------------------------------------ operator state

# One row per queue an operator paused (or that the relay keeps a clock for).
queues = Table(
    "queues",
    metadata,
    Column("queue", Text, primary_key=True),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    # The last pause, kept after a resume; who resumed it since, and when.
    _ts("paused_at"),
    Column("paused_by", Text),
    _ts("updated_at", nullable=False, default=True),
    _ts("resumed_at"),
    Column("resumed_by", Text),
    # The queue has a concurrency limit (a row in queue_limits, written with it):
    # every claim reads this row already, so the mark sends the queue's jobs to the
    # claim composed with the limit at no cost to a queue without one.
    Column("limited", Boolean, nullable=False, server_default=text("false")),
    CheckConstraint(name_valid("queue"), name="queues_name_valid"),
)

# A tenant's limits, written by operators in their own transactions. The counters
# the claim moves live in tenant_usage, so an operator's open transaction never
# blocks a claim.
tenant_limits = Table(
    "tenant_limits",
    metadata,
    Column("tenant", Text, primary_key=True),
    # NULL: unlimited.
    Column("max_running", Integer),
    Column("weight", Float, nullable=False, server_default=text("1")),
    Column("max_queued", Integer),
    _ts("created_at", nullable=False, default=True),
    _ts("updated_at", nullable=False, default=True),
    # Jobs per second the tenant may enqueue (NULL: any), as a token bucket of one
    # second's worth, taken from in the enqueue's transaction.
    Column("max_enqueue_rate", Float),
    Column("enqueue_tokens", Float),
    _ts("enqueue_refilled_at"),
    # 'dedicated': only consumers that name the tenant (consumer --tenant) take its
    # jobs; 'shared': any consumer of the queue.
    Column("runners", Text, nullable=False, server_default=text("'shared'")),
    CheckConstraint(name_valid("tenant"), name="tenant_limits_name_valid"),
    CheckConstraint("max_running IS NULL OR max_running >= 0", name="tenant_limits_running"),
    CheckConstraint("weight > 0 AND weight <= 1000", name="tenant_limits_weight"),
    CheckConstraint("max_queued IS NULL OR max_queued >= 0", name="tenant_limits_queued"),
    CheckConstraint(
        "max_enqueue_rate IS NULL OR max_enqueue_rate > 0", name="tenant_limits_enqueue_rate"
    ),
    CheckConstraint("runners IN ('shared', 'dedicated')", name="tenant_limits_runners"),
)
# The dedicated tenants, read by every claim: one probe of an empty index while
# there are none.
Index(
    "tenant_limits_dedicated_idx",
    tenant_limits.c.tenant,
    postgresql_where=text("runners = 'dedicated'"),
)

# Rate limits: at most ``burst`` starts at once and ``rate`` per ``per_seconds``
# after that, across every consumer (a token bucket per name, rate_buckets).
rate_limits = Table(
    "rate_limits",
    metadata,
    Column("name", Text, primary_key=True),
    Column("rate", Float, nullable=False),
    Column("per_seconds", Float, nullable=False),
    Column("burst", Float, nullable=False),
    _ts("created_at", nullable=False, default=True),
    _ts("updated_at", nullable=False, default=True),
    CheckConstraint(f"name ~ '{RATE_LIMIT_NAME_PATTERN}'", name="rate_limits_name_valid"),
    CheckConstraint("rate > 0 AND per_seconds > 0", name="rate_limits_rate_positive"),
    CheckConstraint("burst >= 1", name="rate_limits_burst_positive"),
)

# The token bucket of each rate-limited name in use, written by the claim that
# takes from it: the tokens left as of refilled_at, and how many that claim took.
rate_buckets = Table(
    "rate_buckets",
    metadata,
    Column("name", Text, primary_key=True),
    Column("tokens", Float, nullable=False),
    Column("taken", Integer, nullable=False, server_default=text("0")),
    _ts("refilled_at", nullable=False, default=True),
)

tenant_usage = Table(
    "tenant_usage",
    metadata,
    Column(
        "tenant",
        Text,
        ForeignKey("tenant_limits.tenant", ondelete="CASCADE", name="tenant_usage_tenant_fkey"),
        primary_key=True,
    ),
    # Slots held: leases whose claim reserved one (jobs.holds_slot).
    Column("running", Integer, nullable=False, server_default=text("0")),
    # Jobs waiting, as the relay last counted them, and how fast they drained.
    Column("queued", Integer, nullable=False, server_default=text("0")),
    _ts("queued_at"),
    Column("drain_per_s", Float),
    # Claims of the tenant's jobs ever made: the drain rate is its rate of change.
    Column("claimed", BigInteger, nullable=False, server_default=text("0")),
    # ``claimed`` as of queued_at.
    Column("claimed_seen", BigInteger, nullable=False, server_default=text("0")),
    CheckConstraint("running >= 0", name="tenant_usage_running_non_negative"),
)

# The leases each key holds now (jobs.key): a row only while it holds one. The
# claim upserts it (keys in sorted order, as tenants), every end of a lease
# decrements it and deletes it at zero, so idle keys cost no row.
key_usage = Table(
    "key_usage",
    metadata,
    Column("key", Text, primary_key=True),
    Column("running", Integer, nullable=False),
    # The limit the last claim of the key applied (the jobs' key_limit).
    Column("key_limit", Integer, nullable=False),
    CheckConstraint("running >= 0", name="key_usage_running_non_negative"),
)

# The exclusive resources held now (jobs.resource): a row only while one is held.
# The claim inserts it for the lease it starts (job_id, lease_generation); a clean
# end of that lease deletes it. A lease that expires leaves it, marked
# uncertain_since: whatever the vanished holder did to the target is unknown, so no
# job of the resource starts until outbox.resolve_resource deletes it.
resource_holds = Table(
    "resource_holds",
    metadata,
    Column("resource", Text, primary_key=True),
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("lease_generation", BigInteger, nullable=False),
    _ts("held_since", nullable=False, default=True),
    _ts("uncertain_since"),
)

# Who resolved an uncertain resource, when, and which job's lease had left it so.
resource_resolutions = Table(
    "resource_resolutions",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("resource", Text, nullable=False),
    Column("job_id", UUID(as_uuid=True), nullable=False),
    _ts("uncertain_since", nullable=False),
    _ts("resolved_at", nullable=False, default=True),
    Column("resolved_by", Text, nullable=False),
    Column("outcome", Text),
)
Index(
    "resource_resolutions_resource_idx",
    resource_resolutions.c.resource,
    resource_resolutions.c.resolved_at,
)

# Weighted fair share between the tenants of a queue, kept by the relay: each
# tenant's virtual pass, the queue's virtual clock (the row with tenant '*'), and
# why a tenant's wake-ups are being held back, written when that changes.
fair_shares = Table(
    "fair_shares",
    metadata,
    Column("queue", Text, nullable=False),
    Column("tenant", Text, nullable=False),
    Column("vpass", Float, nullable=False, server_default=text("0")),
    Column("held_reason", Text),
    _ts("held_since"),
    PrimaryKeyConstraint("queue", "tenant", name="fair_shares_pkey"),
    # Rewritten by nearly every pass of the relay (passes, held reasons); room left
    # in each page keeps those updates HOT (no index entry per update).
    postgresql_with={"fillfactor": "50"},
)

# Live consumers, kept fresh by their heartbeats; the relay deletes stale rows.
workers = Table(
    "workers",
    metadata,
    Column("worker_id", Text, primary_key=True),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("queues", ARRAY(Text), nullable=False),
    Column("job_types", ARRAY(Text), nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("prefetch", Integer, nullable=False),
    _ts("started_at", nullable=False, default=True),
    _ts("last_seen_at", nullable=False, default=True),
    Column("stopping", Boolean, nullable=False, server_default=text("false")),
    # Cumulative counters of the process (claimed, succeeded, fence rejections...).
    Column("counts", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # The dedicated tenants it may serve (consumer --tenant); it serves shared ones too.
    Column("tenants", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    # When the sweeper last expired a lease of it: killed or frozen, it is not live
    # (LIVE_WORKER) until its row is refreshed after that.
    _ts("lease_lapsed_at"),
)

# One row per running relay, refreshed by its heartbeat: whether one is there and
# connected to RabbitMQ, which the outbox's backlog cannot tell (it holds every
# queue's work beyond its window by design).
relays = Table(
    "relays",
    metadata,
    Column("relay_id", Text, primary_key=True),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    _ts("started_at", nullable=False, default=True),
    _ts("last_seen_at", nullable=False, default=True),
    Column("broker_connected", Boolean, nullable=False, server_default=text("false")),
    Column("published", BigInteger, nullable=False, server_default=text("0")),
    # The queues this relay cannot publish to right now (each backed off alone),
    # {queue: {reason, detail, since, failures}}: written by its heartbeat.
    Column("failing_queues", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
)

# Who put a failed or cancelled job back in the queue, and when.
job_replays = Table(
    "job_replays",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column(
        "job_id",
        UUID(as_uuid=True),
        ForeignKey("jobs.job_id", ondelete="CASCADE", name="job_replays_job_id_fkey"),
        nullable=False,
    ),
    _ts("replayed_at", nullable=False, default=True),
    Column("replayed_by", Text, nullable=False),
    Column("from_state", Text, nullable=False),
    Column("attempts_before", Integer, nullable=False),
    # The replay overrode its type's policy (retry_job(..., override_policy=True)).
    Column("forced", Boolean, nullable=False, server_default=text("false")),
)
Index("job_replays_job_id_idx", job_replays.c.job_id)

# What a job type allows, as its handler declares it (replay=, cancel_running=,
# on_cancel=): written by each consumer at start-up, the last to start winning, and
# read by the replay and cancel statements, whose callers load no handler registry.
# A type without a row allows everything.
# The concurrency limit of a job type across all consumers (a handler's
# global_limit, written by consumers at start-up): at most max_running leases of
# its jobs at once; running counts the leases that hold a slot (jobs.limit_held).
concurrency_limits = Table(
    "concurrency_limits",
    metadata,
    Column("job_type", Text, primary_key=True),
    Column("max_running", Integer, nullable=False),
    Column("running", Integer, nullable=False, server_default=text("0")),
    _ts("updated_at", nullable=False, default=True),
    # The consumer (worker id) that wrote the limit last.
    Column("updated_by", Text, nullable=False),
    CheckConstraint("max_running >= 1", name="concurrency_limits_max_running_positive"),
    CheckConstraint("running >= 0", name="concurrency_limits_running_not_negative"),
)

# The concurrency limit of a queue across all consumers (consumer --queue-limit,
# or an operator's): at most max_running leases of its jobs at once; running
# counts the leases that hold a slot (jobs.queue_limit_held). queues.limited marks
# the queues whose row here has a max_running.
queue_limits = Table(
    "queue_limits",
    metadata,
    Column("queue", Text, primary_key=True),
    # NULL once the limit is removed: the row stays, still counting the leases
    # that hold a slot until they end, for a limit set again to count them.
    Column("max_running", Integer),
    Column("running", Integer, nullable=False, server_default=text("0")),
    _ts("updated_at", nullable=False, default=True),
    # The consumer (worker id) or operator that wrote the limit last.
    Column("updated_by", Text, nullable=False),
    CheckConstraint("max_running >= 1", name="queue_limits_max_running_positive"),
    CheckConstraint("running >= 0", name="queue_limits_running_not_negative"),
)

job_type_policies = Table(
    "job_type_policies",
    metadata,
    Column("job_type", Text, primary_key=True),
    Column("replay", Boolean, nullable=False, server_default=text("true")),
    Column("cancel_running", Boolean, nullable=False, server_default=text("true")),
    # What a cancel of this type promises, for operators to read ("compensate": its
    # handler undoes what it did); NULL: nothing said.
    Column("on_cancel", Text),
    _ts("updated_at", nullable=False, default=True),
    # The consumer (worker id) that wrote it last.
    Column("updated_by", Text, nullable=False),
)

# The URL a job type's handler declares (@consumers.handler(..., webhook=)), called
# when a job of the type without one of its own ends: written by consumers at
# start-up (the last to start wins; a type that declares none loses its row), read
# by trigger jobs_finished, joined to the jobs a statement ended.
job_type_webhooks = Table(
    "job_type_webhooks",
    metadata,
    Column("job_type", Text, primary_key=True),
    Column("url", Text, nullable=False),
    _ts("updated_at", nullable=False, default=True),
    Column("updated_by", Text, nullable=False),
    CheckConstraint(
        f"url ~* '^https?://' AND char_length(url) <= {MAX_WEBHOOK_URL_LENGTH}",
        name="job_type_webhooks_url_valid",
    ),
)

# A call owed to a webhook: written by trigger jobs_finished in the transaction that
# ends the job, delivered by a relay (relay/webhooks.py). A relay claims a due row by
# pushing next_attempt_at past the call's timeout, with lease_owner and attempts + 1
# (the fence its outcome carries), so a relay killed mid-call leaves it due again.
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("delivery_id", BigInteger, Identity(always=True), primary_key=True),
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("url", Text, nullable=False),
    # scheme://host[:port] of the URL: failures back the endpoint off, not the job.
    Column("endpoint", Text, nullable=False),
    # What is sent: the job's end, never its payload.
    Column("body", JSONB, nullable=False),
    Column("state", Text, nullable=False, server_default=text("'PENDING'")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    # PENDING: when it is due (a claimed one: when its lease ends).
    _ts("next_attempt_at", nullable=False, default=True),
    Column("lease_owner", Text),
    # The last call's HTTP status (NULL: none came back), and what went wrong.
    Column("last_status", Integer),
    Column("last_error", Text),
    _ts("delivered_at"),
    _ts("gave_up_at"),
    _ts("created_at", nullable=False, default=True),
    _ts("updated_at", nullable=False, default=True),
    CheckConstraint(
        "state IN ('DELIVERED', 'GAVE_UP', 'PENDING')", name="webhook_deliveries_state_valid"
    ),
    CheckConstraint(
        f"url ~* '^https?://' AND char_length(url) <= {MAX_WEBHOOK_URL_LENGTH}",
        name="webhook_deliveries_url_valid",
    ),
    CheckConstraint("attempts >= 0", name="webhook_deliveries_attempts_non_negative"),
)
Index(
    "webhook_deliveries_due_idx",
    webhook_deliveries.c.next_attempt_at,
    postgresql_where=text("state = 'PENDING'"),
)
Index(
    "webhook_deliveries_done_idx",
    webhook_deliveries.c.updated_at,
    postgresql_where=text("state <> 'PENDING'"),
)
Index("webhook_deliveries_job_id_idx", webhook_deliveries.c.job_id)

# Inputs stored by reference (outbox.store_input): a large or sensitive payload held
# once, under its own rules, and named by jobs.payload_ref, so the hot table stays
# narrow and several jobs share one input. Redaction empties content for good and
# says when, by whom and why; the jobs and their history stay as they were.
# Retention deletes an input no job names (a trigger refuses the others).
job_inputs = Table(
    "job_inputs",
    metadata,
    Column("input_id", UUID(as_uuid=True), primary_key=True),
    # The input's JSON; NULL once redacted.
    Column("content", JSONB),
    # Its size as stored JSON text, kept after a redaction.
    Column("size_bytes", Integer, nullable=False),
    # No operator surface ever shows the content of any input; sensitive says why
    # it matters for this one (and is shown).
    Column("sensitive", Boolean, nullable=False, server_default=text("false")),
    _ts("created_at", nullable=False, default=True),
    _ts("redacted_at"),
    Column("redacted_by", Text),
    Column("redaction_reason", Text),
    CheckConstraint(
        "(content IS NULL) = (redacted_at IS NOT NULL)", name="job_inputs_content_or_redacted"
    ),
    CheckConstraint("size_bytes >= 0", name="job_inputs_size_non_negative"),
)
# Retention walks unreferenced inputs oldest first.
Index("job_inputs_created_idx", job_inputs.c.created_at)
# The job's input, when its payload is stored by reference; NULL for a job that
# carries its payload (most). Only the jobs that have one are in the index. Kept by
# triggers, not a foreign key (migration 0028): a foreign key's check would be
# queued for every job inserted, NULL or not; the triggers' WHEN clause passes over
# a job without a reference.
jobs.append_column(Column("payload_ref", UUID(as_uuid=True)))
Index(
    "jobs_payload_ref_idx",
    jobs.c.payload_ref,
    postgresql_where=text("payload_ref IS NOT NULL"),
)

# The request behind a job enqueued through the HTTP API with an Idempotency-Key: the
# key (its own namespace, not a dedup key) and a hash of what was asked, so a repeat
# of the key with a different request is refused rather than answered with a job it
# did not describe. The job's own columns cannot tell: max_attempts and run_after
# move after enqueue. Several keys may name one job (a dedup key made them meet);
# the key goes with its job (ON DELETE CASCADE), so it lasts as long as the job.
job_requests = Table(
    "job_requests",
    metadata,
    Column("idempotency_key", Text, primary_key=True),
    Column(
        "job_id",
        UUID(as_uuid=True),
        ForeignKey("jobs.job_id", ondelete="CASCADE", name="job_requests_job_id_fkey"),
        nullable=False,
    ),
    Column("fingerprint", Text, nullable=False),
    _ts("created_at", nullable=False, default=True),
)
Index("job_requests_job_id_idx", job_requests.c.job_id)

# The dashboard's sessions: the cookie holds a random secret, this table its hash,
# so signing out ends a session for good and a copied cookie stops working. A
# session also ends when the API token changes (token_digest no longer matches).
dashboard_sessions = Table(
    "dashboard_sessions",
    metadata,
    Column("session_hash", Text, primary_key=True),
    Column("token_digest", Text, nullable=False),
    _ts("created_at", nullable=False, default=True),
    _ts("expires_at", nullable=False),
)
Index("dashboard_sessions_expires_at_idx", dashboard_sessions.c.expires_at)


# --------------------------------------------------------------- recurring schedules
# A schedule enqueues a job at each of its occurrences; the relay fires
# them. schedule_fires is the ledger of occurrences: its primary key makes the
# database the arbiter between relays, so one occurrence fires at most once, and a
# skipped one says why.

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
    # Firings that failed in a row (0: the last one worked), the last failure and
    # when it was; a failing schedule is not looked at again before retry_at.
    Column("failures", Integer, nullable=False, server_default=text("0")),
    Column("last_error", Text),
    Column("last_error_at", DateTime(timezone=True)),
    Column("retry_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    # A definition's changes only; firing moves next_fire_at and last_fire_at alone.
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    # The tags and meta of each occurrence's job (checked as a job's when the
    # schedule is written; the job's own CHECKs hold at every fire).
    Column("tags", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("meta", JSONB),
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
    CheckConstraint(name_valid("queue"), name="schedules_queue_name_valid"),
    CheckConstraint(f"tenant IS NULL OR ({name_valid('tenant')})", name="schedules_tenant_valid"),
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
# The metrics collector reads the fires that enqueued a job since its last round
# (scheduler delay), by when they fired.
Index(
    "schedule_fires_fired_idx",
    schedule_fires.c.fired_at,
    postgresql_where=text("outcome = 'enqueued'"),
)
