"""The producer's API: enqueue jobs inside your own SQLAlchemy transaction.

::

    with Session(engine) as session, session.begin():
        session.add(Order(...))
        job_id = outbox.enqueue(session, "send_receipt", {"order_id": 42})
    # committed together: the order, the job, and its wake-up

Nothing here commits; a rolled-back transaction leaves no job behind.
"""

from outbox.backpressure import Backpressure
from outbox.cancel import request_cancel, request_cancel_async
from outbox.enqueue import enqueue, enqueue_async, enqueue_many, enqueue_many_async
from outbox.schedules import (
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
from outbox.tenants import (
    TenantLimit,
    set_tenant_limit,
    set_tenant_limit_async,
    tenant_limits,
    tenant_limits_async,
)
from outbox.validation import DEFAULT_MAX_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES_ENV, NewJob

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MAX_PAYLOAD_BYTES_ENV",
    "Backpressure",
    "NewJob",
    "TenantLimit",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "pause_schedule",
    "pause_schedule_async",
    "request_cancel",
    "request_cancel_async",
    "resume_schedule",
    "resume_schedule_async",
    "schedule",
    "schedule_async",
    "set_tenant_limit",
    "set_tenant_limit_async",
    "tenant_limits",
    "tenant_limits_async",
    "trigger_schedule",
    "trigger_schedule_async",
    "unschedule",
    "unschedule_async",
]
