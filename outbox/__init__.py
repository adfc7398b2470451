"""The producer's and the operator's API, inside your own SQLAlchemy transaction.

::

    with Session(engine) as session, session.begin():
        session.add(Order(...))
        job_id = outbox.enqueue(session, "send_receipt", {"order_id": 42})
    # committed together: the order, the job, and its wake-up

Nothing here commits; a rolled-back transaction leaves no job behind. The
operator's calls work the same way: ``retry_job``/``retry_jobs`` (replay failed and
cancelled jobs), ``pause_queue``/``resume_queue``, ``explain`` (why is my job
waiting?), alongside ``request_cancel``, tenant limits and schedules; and
``wait_for``/``wait_for_async`` (block until a job ends, woken at its commit);
``approve``/``reject`` for jobs enqueued with ``needs_approval``;
``update_job`` (change a job that has not started yet);
``resolve_resource``/``resource_holds`` for exclusive resources (``resource=``);
``concurrency_limits`` (each job type's ``global_limit``, its running and waiting jobs);
``queue_limits``, ``set_queue_limit``, ``remove_queue_limit`` (a queue's concurrency
limit across every consumer);
``job_type_policy`` (what a job type allows: replay, cancelling it running;
``NotAllowed`` when a call would do what it forbids).
``store_input`` (a large or sensitive input stored once, run on by the jobs
enqueued with ``payload_ref=``), ``stored_input``, ``redact_input`` (erase one).
``hooks.add`` runs a function of yours on every job enqueued (:mod:`outbox.hooks`).
``bind_instance(engine)`` points your engine at the instance's schema
(:mod:`outbox.instance`).
"""

# The modules here take the caller's SQLAlchemy sessions, and import SQLAlchemy for
# their types only (under TYPE_CHECKING): the relay, which fires schedules with
# outbox.schedules and outbox.recurrence, uses none of it, and importing it would
# take every relay a fifth of a second more to start.
from hybrid_jobs.outbox import hooks
from hybrid_jobs.outbox.approval import (
    NotAwaitingApproval,
    approve,
    approve_async,
    reject,
    reject_async,
)
from hybrid_jobs.outbox.backpressure import Backpressure
from hybrid_jobs.outbox.cancel import request_cancel, request_cancel_async
from hybrid_jobs.outbox.concurrency_limits import (
    ConcurrencyLimit,
    concurrency_limits,
    concurrency_limits_async,
)
from hybrid_jobs.outbox.edit import JobNotEditable, update_job, update_job_async
from hybrid_jobs.outbox.enqueue import enqueue, enqueue_async, enqueue_many, enqueue_many_async
from hybrid_jobs.outbox.explain import (
    Blocker,
    Explanation,
    JobNotFound,
    LastError,
    Why,
    explain,
    explain_async,
)
from hybrid_jobs.outbox.inputs import (
    InputNotFound,
    StoredInput,
    redact_input,
    redact_input_async,
    store_input,
    store_input_async,
    stored_input,
    stored_input_async,
)
from hybrid_jobs.outbox.instance import bind_instance
from hybrid_jobs.outbox.known_types import require_known_job_types
from hybrid_jobs.outbox.policies import (
    JobTypePolicy,
    NotAllowed,
    job_type_policy,
    job_type_policy_async,
)
from hybrid_jobs.outbox.queue_limits import (
    QueueLimit,
    queue_limits,
    queue_limits_async,
    remove_queue_limit,
    remove_queue_limit_async,
    set_queue_limit,
    set_queue_limit_async,
)
from hybrid_jobs.outbox.queues import (
    PausedQueue,
    pause_queue,
    pause_queue_async,
    paused_queues,
    paused_queues_async,
    queue_in_use,
    queue_in_use_async,
    resume_queue,
    resume_queue_async,
)
from hybrid_jobs.outbox.rate_limits import (
    RateLimit,
    rate_limits,
    rate_limits_async,
    remove_rate_limit,
    remove_rate_limit_async,
    set_rate_limit,
    set_rate_limit_async,
)
from hybrid_jobs.outbox.replay import (
    Replayed,
    retry_job,
    retry_job_async,
    retry_jobs,
    retry_jobs_async,
)
from hybrid_jobs.outbox.resources import (
    HeldByAnother,
    NotUncertain,
    Resolved,
    ResourceHold,
    resolve_resource,
    resolve_resource_async,
    resource_holds,
    resource_holds_async,
)
from hybrid_jobs.outbox.schedules import (
    pause_schedule,
    pause_schedule_async,
    resume_schedule,
    resume_schedule_async,
    schedule,
    schedule_async,
    trigger_schedule,
    trigger_schedule_async,
    unschedule,
    unschedule_async,
)
from hybrid_jobs.outbox.tenants import (
    TenantLimit,
    set_tenant_limit,
    set_tenant_limit_async,
    tenant_limits,
    tenant_limits_async,
)
from hybrid_jobs.outbox.validation import DEFAULT_MAX_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES_ENV, NewJob
from hybrid_jobs.outbox.waiting import Finished, wait_for, wait_for_async

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MAX_PAYLOAD_BYTES_ENV",
    "Backpressure",
    "Blocker",
    "ConcurrencyLimit",
    "Explanation",
    "Finished",
    "HeldByAnother",
    "InputNotFound",
    "JobNotEditable",
    "JobNotFound",
    "JobTypePolicy",
    "LastError",
    "NewJob",
    "NotAllowed",
    "NotAwaitingApproval",
    "NotUncertain",
    "PausedQueue",
    "QueueLimit",
    "RateLimit",
    "Replayed",
    "Resolved",
    "ResourceHold",
    "StoredInput",
    "TenantLimit",
    "Why",
    "approve",
    "approve_async",
    "bind_instance",
    "concurrency_limits",
    "concurrency_limits_async",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "explain",
    "explain_async",
    "hooks",
    "job_type_policy",
    "job_type_policy_async",
    "pause_queue",
    "pause_queue_async",
    "pause_schedule",
    "pause_schedule_async",
    "paused_queues",
    "paused_queues_async",
    "queue_in_use",
    "queue_in_use_async",
    "queue_limits",
    "queue_limits_async",
    "rate_limits",
    "rate_limits_async",
    "redact_input",
    "redact_input_async",
    "reject",
    "reject_async",
    "remove_queue_limit",
    "remove_queue_limit_async",
    "remove_rate_limit",
    "remove_rate_limit_async",
    "request_cancel",
    "request_cancel_async",
    "require_known_job_types",
    "resolve_resource",
    "resolve_resource_async",
    "resource_holds",
    "resource_holds_async",
    "resume_queue",
    "resume_queue_async",
    "resume_schedule",
    "resume_schedule_async",
    "retry_job",
    "retry_job_async",
    "retry_jobs",
    "retry_jobs_async",
    "schedule",
    "schedule_async",
    "set_queue_limit",
    "set_queue_limit_async",
    "set_rate_limit",
    "set_rate_limit_async",
    "set_tenant_limit",
    "set_tenant_limit_async",
    "store_input",
    "store_input_async",
    "stored_input",
    "stored_input_async",
    "tenant_limits",
    "tenant_limits_async",
    "trigger_schedule",
    "trigger_schedule_async",
    "unschedule",
    "unschedule_async",
    "update_job",
    "update_job_async",
    "wait_for",
    "wait_for_async",
]
