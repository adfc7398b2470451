"""OpenTelemetry traces across the hops, when the ``otel`` extra is installed.

The only module that imports ``opentelemetry``, and only on first use: without the
extra every function here is a no-op that returns None or a span that does nothing,
so enqueue writes no trace context and the daemons start no spans.

What is traced: enqueue stores the W3C trace context (``traceparent``,
``tracestate``) of the span current in the enqueuing code with each job; the relay's
publish of a wake-up message (possibly several jobs), and the consumer's claim (a
batch of jobs), are spans *linked* to each job's context; the handler's run is a
span *child* of it, so it shows in the enqueuing request's trace, and is current
while the handler runs (a handler's own spans nest under it).

The spans follow OpenTelemetry's semantic conventions for messaging (v1.27 and
later: ``messaging.operation.type`` send / receive / process, span kinds PRODUCER /
CLIENT / CONSUMER, names "{operation} {destination}"). The conventions' constants
live in opentelemetry-semantic-conventions' private ``_incubating`` package, so the
names are written out here.

The spans go to the global tracer provider: configure one in the consumer's app
module, or run the daemons under ``opentelemetry-instrument`` (opentelemetry-distro),
which builds it from the standard ``OTEL_*`` variables. With none configured (the
API's default) nothing is recorded, and the relay reads no trace contexts.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any, Final

TRACER_NAME = "hybrid_jobs"

# Semantic conventions for messaging (and the general error.type).
MESSAGING_SYSTEM = "messaging.system"
MESSAGING_DESTINATION_NAME = "messaging.destination.name"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"
MESSAGING_OPERATION_NAME = "messaging.operation.name"
MESSAGING_MESSAGE_ID = "messaging.message.id"
MESSAGING_BATCH_MESSAGE_COUNT = "messaging.batch.message_count"
MESSAGING_ROUTING_KEY = "messaging.rabbitmq.destination.routing_key"
ERROR_TYPE = "error.type"
SYSTEM = "rabbitmq"
# This project's own attributes, where the conventions have none.
JOB_ID = "hybrid_jobs.job.id"
JOB_TYPE = "hybrid_jobs.job.type"
JOB_ATTEMPT = "hybrid_jobs.job.attempt"
JOB_QUEUE = "hybrid_jobs.job.queue"
JOB_TENANT = "hybrid_jobs.job.tenant"
JOB_OUTCOME = "hybrid_jobs.job.outcome"
CLAIMED = "hybrid_jobs.claim.claimed"

# W3C Trace Context: version 00's traceparent, and tracestate's own bound (at most
# 32 list members, 512 characters is what a vendor may count on being propagated).
_TRACEPARENT = re.compile(r"\A[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}\Z")
_TRACESTATE = re.compile(r"\A[\x20-\x7e]{0,512}\Z")
MAX_TRACESTATE = 512


@functools.cache
def _otel() -> ModuleType | None:
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace


@functools.cache
def _propagator() -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def available() -> bool:
    """The opentelemetry API is importable."""
    return _otel() is not None


def recording() -> bool:
    """A tracer provider that records is configured (not the API's default, which
    drops every span): only then is it worth reading the jobs' trace contexts."""
    trace = _otel()
    if trace is None:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def capture() -> dict[str, str] | None:
    """The W3C trace context of the span current here, to store with a job; None
    outside any trace (or without the extra)."""
    trace = _otel()
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _propagator().inject(carrier)
    return valid(carrier)


def valid(value: Any) -> dict[str, str] | None:
    """``value`` as a trace context (traceparent, and tracestate if any), or None if
    it is not one: what is read back from a row is checked before it is used, and
    what is written is checked before it is stored."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, Mapping):
        return None
    parent, state = value.get("traceparent"), value.get("tracestate")
    if not isinstance(parent, str) or not _TRACEPARENT.match(parent) or parent.startswith("ff"):
        return None
    if state is None or state == "":
        return {"traceparent": parent}
    if not isinstance(state, str) or not _TRACESTATE.match(state):
        return {"traceparent": parent}  # a bad tracestate is dropped, as the spec says
    return {"traceparent": parent, "tracestate": state}


def _span_context(stored: Any) -> Any:
    """The SpanContext a stored trace context names, or None."""
    carrier = valid(stored)
    trace = _otel()
    if carrier is None or trace is None:
        return None
    ctx = _propagator().extract(carrier)
    span_context = trace.get_current_span(ctx).get_span_context()
    return span_context if span_context.is_valid else None


def _parent_context(stored: Any) -> Any:
    """A context whose current span is the one ``stored`` names; without one, an
    invalid span, so the new span is a root whatever this process has current."""
    trace = _otel()
    assert trace is not None
    span_context = _span_context(stored)
    if span_context is None:
        return trace.set_span_in_context(trace.INVALID_SPAN)
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context))


def _kind(name: str) -> Any:
    trace = _otel()
    assert trace is not None
    return {
        "producer": trace.SpanKind.PRODUCER,
        "client": trace.SpanKind.CLIENT,
        "consumer": trace.SpanKind.CONSUMER,
    }[name]


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if v is not None}


def now_ns() -> int:
    return time.time_ns()


def record(
    name: str,
    kind: str,
    *,
    start_ns: int,
    end_ns: int | None = None,
    attributes: Mapping[str, Any],
    links: Iterable[tuple[Any, Mapping[str, Any]]] = (),
    parent: Any = None,
    error: tuple[str, str] | None = None,
) -> None:
    """A span from ``start_ns`` to ``end_ns`` (else now), linked to each (stored
    trace context, link attributes) pair that names a valid context, and a child of
    the stored context ``parent`` if one is given (else a root). ``error``:
    (error.type, description) of a failure. Made after the fact, so a process that
    records nothing pays nothing but this call."""
    trace = _otel()
    if trace is None or not recording():
        return
    span_links = []
    for stored, link_attributes in links:
        span_context = _span_context(stored)
        if span_context is not None:
            span_links.append(trace.Link(span_context, _clean(link_attributes)))
    tracer = trace.get_tracer(TRACER_NAME)
    span = tracer.start_span(
        name,
        context=_parent_context(parent),
        kind=_kind(kind),
        attributes=_clean(attributes),
        links=span_links,
        start_time=start_ns,
    )
    if error is not None:
        span.set_attribute(ERROR_TYPE, error[0])
        span.set_status(trace.Status(trace.StatusCode.ERROR, error[1]))
    span.end(end_time=end_ns)


class Running:
    """The span of a handler's run, as the handler runs."""

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def outcome(self, outcome: str, error: tuple[str, str] | None = None) -> None:
        """How the run ended: succeeded, retry, snoozed, failed, cancelled, lease_lost,
        abandoned; ``error`` (error.type, description) when it did not succeed."""
        trace = _otel()
        if self._span is None or trace is None:
            return
        self._span.set_attribute(JOB_OUTCOME, outcome)
        if error is not None:
            self._span.set_attribute(ERROR_TYPE, error[0])
            self._span.set_status(trace.Status(trace.StatusCode.ERROR, error[1]))


# What ``running`` gives while no tracer provider records: one context manager for
# every job, which builds nothing (a consumer runs thousands of jobs a second).
_NOT_RECORDED: Final = contextlib.nullcontext(Running())


def running(
    name: str, *, parent: Any, attributes: Callable[[], Mapping[str, Any]]
) -> contextlib.AbstractContextManager[Running]:
    """A CONSUMER span, child of the stored trace context ``parent`` (a root span
    without one), current while the block runs; ``attributes`` are asked for only
    when a span is made."""
    if not recording():
        # With the API's default provider a span records nothing and carries no
        # context on (the no-op tracer's span is invalid): none is made, every job.
        return _NOT_RECORDED
    return _span_running(name, parent, attributes())


@contextlib.contextmanager
def _span_running(name: str, parent: Any, attributes: Mapping[str, Any]) -> Iterator[Running]:
    trace = _otel()
    assert trace is not None  # recording() said so
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(
        name,
        context=_parent_context(parent),
        kind=_kind("consumer"),
        attributes=_clean(attributes),
        # the handler's own exceptions are the job's outcome, said by outcome()
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield Running(span)


def job_links(jobs: Sequence[tuple[Any, str, int | None]]) -> list[tuple[Any, dict[str, Any]]]:
    """(stored context, job id, attempt) triples as links with their attributes."""
    return [(stored, {JOB_ID: job_id, JOB_ATTEMPT: attempt}) for stored, job_id, attempt in jobs]
