"""Run hooks for tests that run a real `consumer --app tests.apps.hooks` process.

Each hook logs what it sees (``hooks.seen``: the hook, in or out, the job, the
value or the error), so a test reads their order and the outcomes they saw from the
consumer's log. The job's meta steers them: ``request_id`` is carried into a
context variable the handlers read, ``swallow`` makes the outer hook swallow the
handler's error, ``break`` ("before" or "after") makes a hook raise.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

from hybrid_jobs import consumers
from hybrid_jobs.consumers.hooks import CallNext

log = logging.getLogger("tests.apps.hooks")

REQUEST_ID: ContextVar[str | None] = ContextVar("REQUEST_ID", default=None)


def _seen(job: consumers.Job, hook: str, way: str, **what: Any) -> None:
    log.info("hooks.seen", extra={"hook": hook, "way": way, "job_id": str(job.id), **what})


@consumers.hooks.add
async def outer(job: consumers.Job, call_next: CallNext) -> Any:
    _seen(job, "outer", "in")
    try:
        value = await call_next()
    except Exception as exc:
        _seen(job, "outer", "out", error=type(exc).__name__)
        if job.meta.get("swallow"):
            return "swallowed"
        raise
    _seen(job, "outer", "out", value=value)
    return value


@consumers.hooks.add
async def request_id(job: consumers.Job, call_next: CallNext) -> Any:
    _seen(job, "request_id", "in")
    token = REQUEST_ID.set(job.meta.get("request_id"))
    try:
        return await call_next()
    finally:
        REQUEST_ID.reset(token)
        _seen(job, "request_id", "out")


@consumers.hooks.add
async def breaks(job: consumers.Job, call_next: CallNext) -> Any:
    if job.meta.get("break") == "before":
        raise RuntimeError("the hook broke before the handler")
    try:
        await call_next()
    finally:
        if job.meta.get("break") == "after":
            raise RuntimeError("the hook broke after the handler")
    return "not the handler's value"


def _work(job: consumers.Job, kind: str) -> dict[str, Any]:
    if job.payload.get("fail"):
        raise consumers.Permanent(f"the {kind} handler failed", code="HANDLER_FAILED")
    return {"kind": kind, "request_id": REQUEST_ID.get(), "meta": dict(job.meta)}


@consumers.handler("hooked_plain")
def hooked_plain(job: consumers.Job) -> dict[str, Any]:
    return _work(job, "plain")


@consumers.handler("hooked_async")
async def hooked_async(job: consumers.Job) -> dict[str, Any]:
    return _work(job, "async")
