"""Every statement that changes a job, the outbox or the control tables, named, in
one package, a module per noun (fragments, job, lease, outbox, tenant, worker,
schedule, resource, control). Import them from here: ``from schema.queries import JOB_CLAIM_MANY``.

Each transition is a single guarded statement: its WHERE clause carries the state it
may leave and, when a worker writes, the fence (``lease_owner`` and
``lease_generation``, see :data:`FENCE`). Statements that apply to a batch take the
fence per row, so a batch is many fenced updates in one commit. Times are always the
database's clock, never a worker's. Parameters use psycopg's ``%(name)s`` style and
are always bound, never formatted in.

A worker's statements lock their rows ``FOR NO KEY UPDATE SKIP LOCKED``: a row some
other transaction holds (a producer's open cancel request, say) delays that row only;
the statement reports it as ``LOCKED`` and the worker tries it again on its own.

Names are noun first, the way River names its queries: ``job_claim_many``,
``outbox_wake_queue``. The relay, the consumer and the producer API call them by
name and never write SQL of their own. The rules:

- The noun is singular and names the table the statement is about (``JOB_``,
  ``OUTBOX_``, ``TENANT_``, ``WORKER_``, ``RELAY_``, ``SCHEDULE_``, ``QUEUE_``, ``RESOURCE_``,
  ``DASHBOARD_SESSION_``); then the verb (``JOB_CLAIM_MANY``, ``WORKER_EXPIRE``) or,
  for a read, what it returns (``JOB_STATE``, ``OUTBOX_DUE_QUEUES``). A read of a
  whole set ends in ``_LIST`` (``TENANT_LIMIT_LIST``).
- ``_MANY`` marks a batch form: its input is a list of rows, each with its own
  values (a jsonb recordset of jobs with their generation, outcomes, fires, dedup
  keys, handler types), and it does for each row what a one-row statement would, in
  one round trip. A plain array of ids, queues, tenants or names that only chooses
  the rows a statement touches does not make it ``_MANY``. A variant of a statement
  keeps its name and adds a suffix (``JOB_FINISH_MANY_IN_TX``).
- One fact, one bind name, in every statement: ``worker`` is the consumer's worker
  id, ``relay`` the relay's, ``job_id``/``job_ids`` the jobs named, ``jobs`` a
  jsonb list of ``(job_id, generation)`` handles, ``queue``/``queues``,
  ``tenant``/``tenants`` (always names, never a count), ``job_types`` the type
  names, ``limit`` the most rows a statement touches, ``worker_ttl`` the seconds
  after which a silent consumer counts as gone; other durations are
  ``<what>_seconds`` (``lease_seconds``, ``grace_seconds``, ``delay_seconds``).
- A long statement's steps are numbered in its SQL (``-- 1a. ...``): a number per
  phase, a letter per CTE within it, in the order they are written.
"""

from __future__ import annotations

from hybrid_jobs.schema.queries.concurrency import (
    CONCURRENCY_LIMIT_LIST,
    CONCURRENCY_LIMIT_RECORD_MANY,
)
from hybrid_jobs.schema.queries.control import (
    EFFECT_RETENTION_DELETE,
    JOB_APPROVAL,
    JOB_APPROVE,
    JOB_EDIT,
    JOB_EDIT_HAND_ON,
    JOB_EDIT_REFUSAL,
    JOB_EXPLAIN,
    JOB_EXPLAIN_BACKLOG,
    JOB_REJECT,
    JOB_REPLAY,
    JOB_REPLAY_MATCHING,
    JOB_RETENTION_DELETE,
    QUEUE_IN_USE,
    QUEUE_PAUSE,
    QUEUE_PAUSED_LIST,
    QUEUE_RESUME,
)
from hybrid_jobs.schema.queries.dashboard import (
    DASHBOARD_SESSION_CREATE,
    DASHBOARD_SESSION_END,
    DASHBOARD_SESSION_EXPIRE,
    DASHBOARD_SESSION_VALID,
)
from hybrid_jobs.schema.queries.fragments import (
    FENCE,
    LEASE_LAPSED,
    LIVE_WORKER,
    UNTAKEN,
    WORKER_TTL_SECONDS,
)
from hybrid_jobs.schema.queries.inputs import (
    INPUT_GET,
    INPUT_LOCK,
    INPUT_OF_JOB,
    INPUT_READ,
    INPUT_REDACT,
    INPUT_REDACTION,
    INPUT_RETENTION_DELETE,
    INPUT_STORE,
)
from hybrid_jobs.schema.queries.job import (
    JOB_DEBOUNCE_MANY,
    JOB_EFFECT_CLAIM,
    JOB_EXPIRE_WAITING,
    JOB_FIND_BY_DEDUP_MANY,
    JOB_FIND_BY_UNIQUE_MANY,
    JOB_INSERT_MANY,
    JOB_INSERT_PLAIN_MANY,
    JOB_INSERT_REF_MANY,
    JOB_INSERT_UNIQUE_MANY,
    JOB_INSERT_UNIQUE_REF_MANY,
    JOB_KEYS_LOCK,
    JOB_OUTCOME,
    JOB_PARENT_RESULTS,
    JOB_PARENTS_LOCK,
    JOB_PARENTS_PENDING,
    JOB_PROGRESS,
    JOB_REQUEST_BY_KEY,
    JOB_REQUEST_CANCEL,
    JOB_REQUEST_RECORD,
    JOB_RETRIES_DUE_NOW,
    JOB_STATE,
    JOB_STEP_CLEAR,
    JOB_STEP_LIST,
    JOB_STEP_RECORD,
    JOB_TAGS_PRUNE,
    JOB_TRACE_CONTEXTS,
)
from hybrid_jobs.schema.queries.lease import (
    JOB_ATTEMPT_RECORDED_MANY,
    JOB_CLAIM_MANY,
    JOB_CLAIM_PLAIN_MANY,
    JOB_FINISH_MANY,
    JOB_FINISH_MANY_IN_TX,
    JOB_FINISH_PLAIN_MANY,
    JOB_GIVE_BACK_MANY,
    JOB_HEARTBEAT_MANY,
    JOB_HELD_BY,
    JOB_SNOOZES,
    JOB_SWEEP_EXPIRED,
    job_claim_many,
    job_finish_many,
)
from hybrid_jobs.schema.queries.outbox import (
    JOB_WAKE_HEAVY,
    JOB_WAKE_ORPHANS,
    JOB_WAKE_PARKED,
    OUTBOX_BACKLOG,
    OUTBOX_DUE_QUEUES,
    OUTBOX_HAND_BACK,
    OUTBOX_HELD_REFRESH,
    OUTBOX_LOST_QUEUES,
    OUTBOX_REWAKE_LOST,
    OUTBOX_SETTLE,
    OUTBOX_WAKE_QUEUE,
    OUTBOX_WAKE_REFUSED,
)
from hybrid_jobs.schema.queries.policy import (
    JOB_TYPE_POLICY,
    JOB_TYPE_POLICY_RECORD_MANY,
    JOB_TYPE_POLICY_REFUSAL,
)
from hybrid_jobs.schema.queries.queue_limit import (
    QUEUE_LIMIT_LIST,
    QUEUE_LIMIT_RECORD_MANY,
    QUEUE_LIMIT_REMOVE,
)
from hybrid_jobs.schema.queries.rate import RATE_LIMIT_REMOVE, RATE_LIMIT_SET, RATE_LIMITS
from hybrid_jobs.schema.queries.resource import (
    RESOURCE_HOLD_LIST,
    RESOURCE_RESOLVE,
    RESOURCE_UNCERTAIN_FOR,
)
from hybrid_jobs.schema.queries.schedule import (
    SCHEDULE_ADVANCE,
    SCHEDULE_CLAIM_DUE,
    SCHEDULE_CLOCK,
    SCHEDULE_DELETE,
    SCHEDULE_FAILED,
    SCHEDULE_FIRE_PRUNE,
    SCHEDULE_FIRE_RECORD_MANY,
    SCHEDULE_FIRE_SET_JOB,
    SCHEDULE_NEXT_DUE,
    SCHEDULE_PAUSE,
    SCHEDULE_RESUME,
    SCHEDULE_RULE_FOR_UPDATE,
    SCHEDULE_TEMPLATE,
    SCHEDULE_UPSERT,
)
from hybrid_jobs.schema.queries.tenant import (
    TENANT_BACKPRESSURE,
    TENANT_ENQUEUE_TAKE,
    TENANT_LIMIT_LIST,
    TENANT_LIMIT_SET,
    TENANT_USAGE_DRIFTED,
    TENANT_USAGE_LOCK,
    TENANT_USAGE_RECONCILE,
    TENANT_USAGE_REFRESH,
)
from hybrid_jobs.schema.queries.webhook import (
    JOB_TYPE_WEBHOOK_RECORD_MANY,
    JOB_WEBHOOK_SET_MANY,
    WEBHOOK_DELIVERY_CLAIM,
    WEBHOOK_DELIVERY_COUNTS,
    WEBHOOK_DELIVERY_DELIVERED,
    WEBHOOK_DELIVERY_FAILED,
    WEBHOOK_DELIVERY_GIVE_UP_SPENT,
    WEBHOOK_DELIVERY_LIST,
    WEBHOOK_DELIVERY_OWED,
    WEBHOOK_DELIVERY_RETENTION_DELETE,
    WEBHOOK_DELIVERY_RETRY,
)
from hybrid_jobs.schema.queries.worker import (
    MAINTENANCE_TRY_LOCK,
    RELAY_EXPIRE,
    RELAY_FAILING_QUEUES,
    RELAY_GONE,
    RELAY_LIVE_LIST,
    RELAY_LIVE_SECONDS,
    RELAY_SEEN,
    WORKER_EXPIRE,
    WORKER_GONE,
    WORKER_PACK_LIMIT,
    WORKER_SEEN,
)

__all__ = [
    "CONCURRENCY_LIMIT_LIST",
    "CONCURRENCY_LIMIT_RECORD_MANY",
    "DASHBOARD_SESSION_CREATE",
    "DASHBOARD_SESSION_END",
    "DASHBOARD_SESSION_EXPIRE",
    "DASHBOARD_SESSION_VALID",
    "EFFECT_RETENTION_DELETE",
    "FENCE",
    "INPUT_GET",
    "INPUT_LOCK",
    "INPUT_OF_JOB",
    "INPUT_READ",
    "INPUT_REDACT",
    "INPUT_REDACTION",
    "INPUT_RETENTION_DELETE",
    "INPUT_STORE",
    "JOB_APPROVAL",
    "JOB_APPROVE",
    "JOB_ATTEMPT_RECORDED_MANY",
    "JOB_CLAIM_MANY",
    "JOB_CLAIM_PLAIN_MANY",
    "JOB_DEBOUNCE_MANY",
    "JOB_EDIT",
    "JOB_EDIT_HAND_ON",
    "JOB_EDIT_REFUSAL",
    "JOB_EFFECT_CLAIM",
    "JOB_EXPIRE_WAITING",
    "JOB_EXPLAIN",
    "JOB_EXPLAIN_BACKLOG",
    "JOB_FIND_BY_DEDUP_MANY",
    "JOB_FIND_BY_UNIQUE_MANY",
    "JOB_FINISH_MANY",
    "JOB_FINISH_MANY_IN_TX",
    "JOB_FINISH_PLAIN_MANY",
    "JOB_GIVE_BACK_MANY",
    "JOB_HEARTBEAT_MANY",
    "JOB_HELD_BY",
    "JOB_INSERT_MANY",
    "JOB_INSERT_PLAIN_MANY",
    "JOB_INSERT_REF_MANY",
    "JOB_INSERT_UNIQUE_MANY",
    "JOB_INSERT_UNIQUE_REF_MANY",
    "JOB_KEYS_LOCK",
    "JOB_OUTCOME",
    "JOB_PARENTS_LOCK",
    "JOB_PARENTS_PENDING",
    "JOB_PARENT_RESULTS",
    "JOB_PROGRESS",
    "JOB_REJECT",
    "JOB_REPLAY",
    "JOB_REPLAY_MATCHING",
    "JOB_REQUEST_BY_KEY",
    "JOB_REQUEST_CANCEL",
    "JOB_REQUEST_RECORD",
    "JOB_RETENTION_DELETE",
    "JOB_RETRIES_DUE_NOW",
    "JOB_SNOOZES",
    "JOB_STATE",
    "JOB_STEP_CLEAR",
    "JOB_STEP_LIST",
    "JOB_STEP_RECORD",
    "JOB_SWEEP_EXPIRED",
    "JOB_TAGS_PRUNE",
    "JOB_TRACE_CONTEXTS",
    "JOB_TYPE_POLICY",
    "JOB_TYPE_POLICY_RECORD_MANY",
    "JOB_TYPE_POLICY_REFUSAL",
    "JOB_TYPE_WEBHOOK_RECORD_MANY",
    "JOB_WAKE_HEAVY",
    "JOB_WAKE_ORPHANS",
    "JOB_WAKE_PARKED",
    "JOB_WEBHOOK_SET_MANY",
    "LEASE_LAPSED",
    "LIVE_WORKER",
    "MAINTENANCE_TRY_LOCK",
    "OUTBOX_BACKLOG",
    "OUTBOX_DUE_QUEUES",
    "OUTBOX_HAND_BACK",
    "OUTBOX_HELD_REFRESH",
    "OUTBOX_LOST_QUEUES",
    "OUTBOX_REWAKE_LOST",
    "OUTBOX_SETTLE",
    "OUTBOX_WAKE_QUEUE",
    "OUTBOX_WAKE_REFUSED",
    "QUEUE_IN_USE",
    "QUEUE_LIMIT_LIST",
    "QUEUE_LIMIT_RECORD_MANY",
    "QUEUE_LIMIT_REMOVE",
    "QUEUE_PAUSE",
    "QUEUE_PAUSED_LIST",
    "QUEUE_RESUME",
    "RATE_LIMITS",
    "RATE_LIMIT_REMOVE",
    "RATE_LIMIT_SET",
    "RELAY_EXPIRE",
    "RELAY_FAILING_QUEUES",
    "RELAY_GONE",
    "RELAY_LIVE_LIST",
    "RELAY_LIVE_SECONDS",
    "RELAY_SEEN",
    "RESOURCE_HOLD_LIST",
    "RESOURCE_RESOLVE",
    "RESOURCE_UNCERTAIN_FOR",
    "SCHEDULE_ADVANCE",
    "SCHEDULE_CLAIM_DUE",
    "SCHEDULE_CLOCK",
    "SCHEDULE_DELETE",
    "SCHEDULE_FAILED",
    "SCHEDULE_FIRE_PRUNE",
    "SCHEDULE_FIRE_RECORD_MANY",
    "SCHEDULE_FIRE_SET_JOB",
    "SCHEDULE_NEXT_DUE",
    "SCHEDULE_PAUSE",
    "SCHEDULE_RESUME",
    "SCHEDULE_RULE_FOR_UPDATE",
    "SCHEDULE_TEMPLATE",
    "SCHEDULE_UPSERT",
    "TENANT_BACKPRESSURE",
    "TENANT_ENQUEUE_TAKE",
    "TENANT_LIMIT_LIST",
    "TENANT_LIMIT_SET",
    "TENANT_USAGE_DRIFTED",
    "TENANT_USAGE_LOCK",
    "TENANT_USAGE_RECONCILE",
    "TENANT_USAGE_REFRESH",
    "UNTAKEN",
    "WEBHOOK_DELIVERY_CLAIM",
    "WEBHOOK_DELIVERY_COUNTS",
    "WEBHOOK_DELIVERY_DELIVERED",
    "WEBHOOK_DELIVERY_FAILED",
    "WEBHOOK_DELIVERY_GIVE_UP_SPENT",
    "WEBHOOK_DELIVERY_LIST",
    "WEBHOOK_DELIVERY_OWED",
    "WEBHOOK_DELIVERY_RETENTION_DELETE",
    "WEBHOOK_DELIVERY_RETRY",
    "WORKER_EXPIRE",
    "WORKER_GONE",
    "WORKER_PACK_LIMIT",
    "WORKER_SEEN",
    "WORKER_TTL_SECONDS",
    "job_claim_many",
    "job_finish_many",
]
