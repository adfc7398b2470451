"""The one service layer under every operator surface: the CLI, the HTTP API and
the dashboard call the same functions, so a rule lives once.

``jobctl``'s commands, the HTTP API of ``jobctl serve`` and the dashboard read and
steer the system through these functions only. Reads are named
statements of :mod:`jobctl.service.queries`, each bounded by an index; every
change goes through the producer API (``outbox.enqueue_async``,
``outbox.request_cancel_async``, ``outbox.retry_job_async``,
``outbox.pause_queue_async``, ``outbox.set_tenant_limit_async``, the schedule
functions, ...), and "why does it wait" is ``outbox.explain_async``: a rule lives
once and the surfaces cannot disagree.

Each function takes an SQLAlchemy ``AsyncSession`` (the producer API's own kind,
so an action and the reads around it share one transaction) and never commits;
:class:`Database` opens the two kinds of transaction the surfaces use. They return
frozen dataclasses (:mod:`jobctl.service.models`), which the API serves as they
are and ``jsonable`` turns into the same JSON. Refusals are exceptions
(:mod:`jobctl.service.errors`), plus ``outbox.Backpressure`` from an enqueue.

What a dashboard needs, and where it is:

- per-queue overview: :func:`stats`; :func:`pause_queue`, :func:`resume_queue`;
- job lists with filters and keyset paging: :func:`list_jobs` (``JobPage.next``);
- a job page: :func:`get_job` (row, attempts, progress, result, why it waits);
- failed jobs: ``list_jobs(JobFilter(state=JobState.FAILED))``, and bulk retry:
  :func:`retry_matching` (``dry_run`` counts first), :func:`retry_jobs` by id;
- cancel: :func:`cancel_jobs`; edit a waiting job: :func:`edit_job`; approvals:
  :func:`approve_job`, :func:`reject_job`;
- schedules: :func:`list_schedules`, :func:`pause_schedule`,
  :func:`resume_schedule`, :func:`trigger_schedule`;
- tenants: :func:`list_tenants`, :func:`set_tenant`;
- limits: :func:`list_limits` (rate limits, the concurrency limits of job types
  and of queues), :func:`set_queue_limit`, :func:`remove_queue_limit`;
- keys: :func:`list_keys` (busy keys and their holders, keys a failed strict head
  holds);
- workers: :func:`list_workers`; health: :func:`readiness`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybrid_jobs.jobctl.lazy import lazy_exports

if TYPE_CHECKING:
    from hybrid_jobs.jobctl.service.database import Database
    from hybrid_jobs.jobctl.service.errors import (
        IdempotencyMismatch,
        Invalid,
        NotAllowed,
        NotFound,
        ServiceError,
        WrongState,
    )
    from hybrid_jobs.jobctl.service.health import readiness
    from hybrid_jobs.jobctl.service.inputs import (
        get_input,
        job_input,
        parse_input_id,
        redact_input,
    )
    from hybrid_jobs.jobctl.service.jobs import (
        DEFAULT_LIMIT,
        MAX_LIMIT,
        JobFilter,
        NewJobRequest,
        approve_job,
        cancel_jobs,
        edit_job,
        enqueue_job,
        get_job,
        list_jobs,
        parse_job_id,
        refusal,
        reject_job,
        retry_jobs,
        retry_matching,
    )
    from hybrid_jobs.jobctl.service.keys import list_keys
    from hybrid_jobs.jobctl.service.limits import (
        list_limits,
        remove_queue_limit,
        set_queue_limit,
    )
    from hybrid_jobs.jobctl.service.models import jsonable
    from hybrid_jobs.jobctl.service.queues import pause_queue, resume_queue, stats
    from hybrid_jobs.jobctl.service.schedules import (
        get_schedule,
        list_schedules,
        pause_schedule,
        resume_schedule,
        trigger_schedule,
    )
    from hybrid_jobs.jobctl.service.tenants import (
        KEEP,
        get_tenant,
        has_limits,
        list_tenants,
        set_tenant,
    )
    from hybrid_jobs.jobctl.service.webhooks import list_webhook_calls, retry_webhook_call
    from hybrid_jobs.jobctl.service.workers import list_workers

# The module of each name below. Each is imported on first use (PEP 562): a caller
# that needs one part of the layer (``jobctl.output`` the models, ``jobctl workers``
# its one read) does not import all of it (the jobs' and schedules' actions, the
# readiness check's RabbitMQ client, the metrics' statements).
_MODULES: dict[str, str] = {
    "Database": "database",
    "IdempotencyMismatch": "errors",
    "Invalid": "errors",
    "NotAllowed": "errors",
    "NotFound": "errors",
    "ServiceError": "errors",
    "WrongState": "errors",
    "readiness": "health",
    "get_input": "inputs",
    "job_input": "inputs",
    "parse_input_id": "inputs",
    "redact_input": "inputs",
    "DEFAULT_LIMIT": "jobs",
    "MAX_LIMIT": "jobs",
    "JobFilter": "jobs",
    "NewJobRequest": "jobs",
    "approve_job": "jobs",
    "cancel_jobs": "jobs",
    "edit_job": "jobs",
    "enqueue_job": "jobs",
    "get_job": "jobs",
    "list_jobs": "jobs",
    "parse_job_id": "jobs",
    "refusal": "jobs",
    "reject_job": "jobs",
    "retry_jobs": "jobs",
    "retry_matching": "jobs",
    "list_keys": "keys",
    "list_limits": "limits",
    "remove_queue_limit": "limits",
    "set_queue_limit": "limits",
    "jsonable": "models",
    "pause_queue": "queues",
    "resume_queue": "queues",
    "stats": "queues",
    "get_schedule": "schedules",
    "list_schedules": "schedules",
    "pause_schedule": "schedules",
    "resume_schedule": "schedules",
    "trigger_schedule": "schedules",
    "KEEP": "tenants",
    "get_tenant": "tenants",
    "has_limits": "tenants",
    "list_tenants": "tenants",
    "set_tenant": "tenants",
    "list_workers": "workers",
    "list_webhook_calls": "webhooks",
    "retry_webhook_call": "webhooks",
}

__all__ = [
    "DEFAULT_LIMIT",
    "KEEP",
    "MAX_LIMIT",
    "Database",
    "IdempotencyMismatch",
    "Invalid",
    "JobFilter",
    "NewJobRequest",
    "NotAllowed",
    "NotFound",
    "ServiceError",
    "WrongState",
    "approve_job",
    "cancel_jobs",
    "edit_job",
    "enqueue_job",
    "get_input",
    "get_job",
    "get_schedule",
    "get_tenant",
    "has_limits",
    "job_input",
    "jsonable",
    "list_jobs",
    "list_keys",
    "list_limits",
    "list_schedules",
    "list_tenants",
    "list_webhook_calls",
    "list_workers",
    "parse_input_id",
    "parse_job_id",
    "pause_queue",
    "pause_schedule",
    "readiness",
    "redact_input",
    "refusal",
    "reject_job",
    "remove_queue_limit",
    "resume_queue",
    "resume_schedule",
    "retry_jobs",
    "retry_matching",
    "retry_webhook_call",
    "set_queue_limit",
    "set_tenant",
    "stats",
    "trigger_schedule",
]


__getattr__, __dir__ = lazy_exports(__name__, _MODULES, __all__)
