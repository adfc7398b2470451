"""Every statement that changes a job, the outbox or the control tables, named, in
one package, a module per noun (fragments, job, lease, outbox, tenant, worker,
schedule, control). Import them from here: ``from schema.queries import JOB_CLAIM_MANY``.

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
name and never write SQL of their own.
"""

from __future__ import annotations

from schema.queries.control import (
    EFFECT_RETENTION_DELETE,
    JOB_EXPLAIN,
    JOB_EXPLAIN_BACKLOG,
    JOB_REPLAY,
    JOB_REPLAY_MATCHING,
    JOB_RETENTION_DELETE,
    QUEUE_IN_USE,
    QUEUE_PAUSE,
    QUEUE_RESUME,
    QUEUES_PAUSED,
)
from schema.queries.dashboard import (
    DASHBOARD_SESSION_CREATE,
    DASHBOARD_SESSION_END,
    DASHBOARD_SESSION_VALID,
    DASHBOARD_SESSIONS_EXPIRE,
)
from schema.queries.fragments import (
    FENCE,
    UNTAKEN,
)
from schema.queries.job import (
    JOB_DEBOUNCE_MANY,
    JOB_EFFECT_CLAIM,
    JOB_EXPIRE_WAITING,
    JOB_FIND_BY_DEDUP_MANY,
    JOB_INSERT_MANY,
    JOB_PROGRESS,
    JOB_REQUEST_BY_KEY,
    JOB_REQUEST_CANCEL,
    JOB_REQUEST_RECORD,
    JOB_RETRIES_DUE_NOW,
    JOB_STATE,
)
from schema.queries.lease import (
    JOB_ATTEMPTS_RECORDED,
    JOB_CLAIM_MANY,
    JOB_FINISH_IN_TX,
    JOB_FINISH_MANY,
    JOB_GIVE_BACK_MANY,
    JOB_HEARTBEAT_MANY,
    JOB_HELD_BY,
    JOB_SWEEP_EXPIRED,
)
from schema.queries.outbox import (
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
from schema.queries.schedule import (
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
from schema.queries.tenant import (
    TENANT_BACKPRESSURE,
    TENANT_LIMIT_SET,
    TENANT_LIMITS,
    TENANT_USAGE_DRIFTED,
    TENANT_USAGE_LOCK,
    TENANT_USAGE_RECONCILE,
    TENANT_USAGE_REFRESH,
)
from schema.queries.worker import (
    MAINTENANCE_TRY_LOCK,
    RELAY_GONE,
    RELAY_LIVE_SECONDS,
    RELAY_SEEN,
    RELAYS_EXPIRE,
    RELAYS_FAILING_QUEUES,
    RELAYS_LIVE,
    WORKER_GONE,
    WORKER_SEEN,
    WORKERS_EXPIRE,
    WORKERS_PACK_LIMIT,
)

__all__ = [
    "DASHBOARD_SESSIONS_EXPIRE",
    "DASHBOARD_SESSION_CREATE",
    "DASHBOARD_SESSION_END",
    "DASHBOARD_SESSION_VALID",
    "EFFECT_RETENTION_DELETE",
    "FENCE",
    "JOB_ATTEMPTS_RECORDED",
    "JOB_CLAIM_MANY",
    "JOB_DEBOUNCE_MANY",
    "JOB_EFFECT_CLAIM",
    "JOB_EXPIRE_WAITING",
    "JOB_EXPLAIN",
    "JOB_EXPLAIN_BACKLOG",
    "JOB_FIND_BY_DEDUP_MANY",
    "JOB_FINISH_IN_TX",
    "JOB_FINISH_MANY",
    "JOB_GIVE_BACK_MANY",
    "JOB_HEARTBEAT_MANY",
    "JOB_HELD_BY",
    "JOB_INSERT_MANY",
    "JOB_PROGRESS",
    "JOB_REPLAY",
    "JOB_REPLAY_MATCHING",
    "JOB_REQUEST_BY_KEY",
    "JOB_REQUEST_CANCEL",
    "JOB_REQUEST_RECORD",
    "JOB_RETENTION_DELETE",
    "JOB_RETRIES_DUE_NOW",
    "JOB_STATE",
    "JOB_SWEEP_EXPIRED",
    "JOB_WAKE_ORPHANS",
    "JOB_WAKE_PARKED",
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
    "QUEUES_PAUSED",
    "QUEUE_IN_USE",
    "QUEUE_PAUSE",
    "QUEUE_RESUME",
    "RELAYS_EXPIRE",
    "RELAYS_FAILING_QUEUES",
    "RELAYS_LIVE",
    "RELAY_GONE",
    "RELAY_LIVE_SECONDS",
    "RELAY_SEEN",
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
    "TENANT_LIMITS",
    "TENANT_LIMIT_SET",
    "TENANT_USAGE_DRIFTED",
    "TENANT_USAGE_LOCK",
    "TENANT_USAGE_RECONCILE",
    "TENANT_USAGE_REFRESH",
    "UNTAKEN",
    "WORKERS_EXPIRE",
    "WORKERS_PACK_LIMIT",
    "WORKER_GONE",
    "WORKER_SEEN",
]
