"""Traces across the hops (the otel extra): enqueue stores the enqueuing code's W3C
trace context; the relay's publish and the claim are spans linked to it, the
handler's run a span in its trace. Recorded with the OpenTelemetry SDK's in-memory
span exporter, here and in real relay and consumer processes; and the same
processes run as before where opentelemetry cannot be imported."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util._once import Once
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.consumers.testing import run_jobs
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing import tracing
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.broker import queue_policy
from tests.support.jobs import enqueue, enqueue_many, job, wait_for_state
from tests.support.processes import ROOT, running, service_env
from tests.support.tracing import blocking_env, recorded_spans, recording_env

APP = ["--app", "tests.apps.basic"]


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer(spans: InMemorySpanExporter) -> Iterator[trace.Tracer]:
    """The SDK's provider, global in this process for the test. The API sets it once
    per process; the reset afterwards is what OpenTelemetry's own test utilities do
    (opentelemetry-test-utils' reset_trace_globals), so no later test records."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(provider)
    yield trace.get_tracer("tests")
    provider.shutdown()
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    assert not tracing.recording()


def test_a_handler_runs_in_no_span_where_nothing_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API's default provider records nothing: the run makes no span and builds
    none of its attributes (a cost every job paid for nothing), and says so by a
    Running that notes nothing."""
    assert not tracing.recording()

    def no_tracer(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a tracer was asked for with nothing recording")

    def no_attributes() -> dict[str, Any]:
        raise AssertionError("span attributes were built with nothing recording")

    monkeypatch.setattr(trace, "get_tracer", no_tracer)
    with tracing.running("process q", parent=None, attributes=no_attributes) as run:
        run.outcome("succeeded")
    assert run._span is None


def _traceparent(span: trace.Span) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def _stored(pg: psycopg.Connection, job_id: uuid.UUID) -> Any:
    return job(pg, job_id)["trace_context"]


# ------------------------------------------------------------------ enqueue


def test_an_enqueue_in_a_span_stores_its_trace_context(
    tracer: trace.Tracer, engine: Engine, pg: psycopg.Connection
) -> None:
    with tracer.start_as_current_span("POST /orders") as request:
        one = enqueue(engine, "noop")
        many = enqueue_many(engine, [NewJob("noop", {}), NewJob("noop", {}, tenant="acme")])
    outside = enqueue(engine, "noop")
    for job_id in [one, *many]:
        assert _stored(pg, job_id) == {"traceparent": _traceparent(request)}
    assert _stored(pg, outside) is None, "no trace, no context"


async def test_the_async_enqueue_stores_the_tracestate_too(
    tracer: trace.Tracer, async_engine: AsyncEngine, pg: psycopg.Connection
) -> None:
    # A request that came in with a vendor's tracestate: its spans carry it on.
    incoming = TraceContextTextMapPropagator().extract(
        {
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tracestate": "vendor=abc,other=1",
        }
    )
    with tracer.start_as_current_span("handle", context=incoming) as request:
        async with AsyncSession(async_engine) as session, session.begin():
            job_id = await outbox.enqueue_async(session, "noop", {})
            [batch_id] = await outbox.enqueue_many_async(session, [NewJob("noop", {})])
    expected = {"traceparent": _traceparent(request), "tracestate": "vendor=abc,other=1"}
    assert _traceparent(request).startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")
    assert _stored(pg, job_id) == expected
    assert _stored(pg, batch_id) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("not json", None),
        ({"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}, "ok"),
        ({"traceparent": "00-" + "A" * 32 + "-" + "b" * 16 + "-01"}, None),  # lower hex only
        ({"traceparent": "ff-" + "a" * 32 + "-" + "b" * 16 + "-01"}, None),  # version ff
        ({"traceparent": "00-" + "a" * 32 + "-" + "b" * 16}, None),
        ({"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01" + "x" * 5000}, None),
        ({"traceparent": 7}, None),
        (["00-" + "a" * 32 + "-" + "b" * 16 + "-01"], None),
    ],
)
def test_a_stored_trace_context_is_checked_before_use(value: Any, expected: str | None) -> None:
    result = tracing.valid(value)
    assert (result is not None) == (expected == "ok")


def test_a_tracestate_past_its_bound_is_dropped_not_stored() -> None:
    parent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    assert tracing.valid({"traceparent": parent, "tracestate": "k=" + "v" * 600}) == {
        "traceparent": parent
    }
    assert tracing.valid(json.dumps({"traceparent": parent, "tracestate": "k=v"})) == {
        "traceparent": parent,
        "tracestate": "k=v",
    }


# ------------------------------------------------------------------ run, in process


def _by_name(finished: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name == name]


def test_the_handler_runs_in_the_enqueuing_trace(
    spans: InMemorySpanExporter,
    tracer: trace.Tracer,
    engine: Engine,
    db_url: DatabaseUrl,
) -> None:
    registry = Registry()

    @registry.handler("traced_async")
    async def traced_async(job: consumers.Job) -> None:
        with trace.get_tracer("app").start_as_current_span("send email"):
            pass

    @registry.handler("traced_plain")
    def traced_plain(job: consumers.Job) -> None:  # in a thread of the consumer's
        with trace.get_tracer("app").start_as_current_span("render pdf"):
            pass

    @registry.handler("traced_fails", max_attempts=1)
    async def traced_fails(job: consumers.Job) -> None:
        raise consumers.Permanent("card declined", code="DECLINED")

    with tracer.start_as_current_span("POST /orders") as request:
        ok = enqueue(engine, "traced_async", tenant="acme", queue="mail")
        plain = enqueue(engine, "traced_plain")
        bad = enqueue(engine, "traced_fails")
    untraced = enqueue(engine, "traced_async")
    ran = run_jobs(db_url, registry)
    assert sorted(r.state for r in ran) == ["FAILED", "SUCCEEDED", "SUCCEEDED", "SUCCEEDED"]

    finished = spans.get_finished_spans()
    req = request.get_span_context()
    runs = {s.attributes[tracing.JOB_ID]: s for s in finished if s.name.startswith("process ")}
    assert set(runs) == {str(ok), str(plain), str(bad), str(untraced)}
    for job_id in (ok, plain, bad):
        run = runs[str(job_id)]
        assert run.kind == trace.SpanKind.CONSUMER
        assert run.context.trace_id == req.trace_id, "the run is in the request's trace"
        assert run.parent is not None and run.parent.span_id == req.span_id
        assert run.attributes[tracing.MESSAGING_SYSTEM] == "rabbitmq"
        assert run.attributes[tracing.MESSAGING_OPERATION_TYPE] == "process"
        assert run.attributes[tracing.JOB_ATTEMPT] == 1
    assert runs[str(untraced)].parent is None, "no stored context: a root span"
    assert runs[str(untraced)].context.trace_id != req.trace_id

    mail = runs[str(ok)]
    assert mail.name == "process mail"
    assert mail.attributes[tracing.MESSAGING_DESTINATION_NAME] == "mail"
    assert mail.attributes[tracing.JOB_QUEUE] == "mail"
    assert mail.attributes[tracing.JOB_TENANT] == "acme"
    assert mail.attributes[tracing.JOB_OUTCOME] == "succeeded"
    assert mail.status.is_ok or mail.status.status_code == trace.StatusCode.UNSET
    failed = runs[str(bad)]
    assert failed.attributes[tracing.JOB_OUTCOME] == "failed"
    assert failed.attributes[tracing.ERROR_TYPE] == "DECLINED"
    assert failed.status.status_code == trace.StatusCode.ERROR

    # the handlers' own spans nest under their run, async and in a thread alike
    [email] = [s for s in _by_name(finished, "send email") if s.context.trace_id == req.trace_id]
    assert email.parent is not None and email.parent.span_id == mail.context.span_id
    [pdf] = _by_name(finished, "render pdf")
    assert pdf.parent is not None and pdf.parent.span_id == runs[str(plain)].context.span_id


# ------------------------------------------------------------------ real processes


def _spans_named(spans: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"].startswith(prefix)]


def _hex(value: str) -> int:
    return int(value, 16)


@pytest.fixture
def recording(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The environment of a relay or consumer whose spans are recorded in tmp_path."""
    return {**env, **recording_env(tmp_path)}


def test_publish_claim_and_run_in_real_processes_join_the_enqueuing_trace(
    tracer: trace.Tracer,
    engine: Engine,
    pg: psycopg.Connection,
    recording: dict[str, str],
    tmp_path: Path,
) -> None:
    with tracer.start_as_current_span("POST /orders") as request:
        ids = enqueue_many(
            engine,
            [NewJob("noop", {}), NewJob("noop", {}, tenant="acme"), NewJob("always_fails", {})],
        )
    untraced = enqueue(engine, "noop")
    req = request.get_span_context()
    with (
        running("relay", [], recording, "relay.started") as relay,
        running("consumer", APP, recording, "consumer.started") as consumer,
    ):
        for job_id in [*ids[:2], untraced]:
            asyncio.run(wait_for_state(pg, job_id, "SUCCEEDED"))
        asyncio.run(wait_for_state(pg, ids[2], "FAILED", timeout=30))
        # a job alone: its message and its claim are in its trace too
        with tracer.start_as_current_span("POST /single") as alone_request:
            single = enqueue(engine, "noop")
        asyncio.run(wait_for_state(pg, single, "SUCCEEDED"))
        assert consumer.stop() == 0
        assert relay.stop() == 0
    spans = recorded_spans(tmp_path)
    traced = {str(i) for i in ids}
    one = alone_request.get_span_context()
    for span in spans:
        links = span["links"]
        if (
            span["name"].startswith(("publish ", "claim"))
            and len(links) == 1
            and span["attributes"][tracing.MESSAGING_BATCH_MESSAGE_COUNT] == 1
        ):
            # one job: a child of its enqueuing span, as well as linked to it
            assert span["parent_id"] == links[0]["context"]["span_id"]
            assert span["context"]["trace_id"] == links[0]["context"]["trace_id"]
    alone = [
        s
        for s in spans
        if any(link["attributes"][tracing.JOB_ID] == str(single) for link in s["links"])
    ]
    assert sorted(s["name"] for s in alone) == ["claim default", "publish default"]
    for span in alone:
        assert _hex(span["context"]["trace_id"]) == one.trace_id
        assert _hex(span["parent_id"]) == one.span_id
    spans = [s for s in spans if s not in alone]

    # the relay: a PRODUCER span per message, linked to each traced job it wakes
    publishes = _spans_named(spans, "publish ")
    assert publishes, spans
    linked: dict[str, int] = {}
    for span in publishes:
        assert span["kind"] == "SpanKind.PRODUCER"
        attributes = span["attributes"]
        assert attributes[tracing.MESSAGING_SYSTEM] == "rabbitmq"
        assert attributes[tracing.MESSAGING_OPERATION_TYPE] == "send"
        assert attributes[tracing.MESSAGING_DESTINATION_NAME] == "default"
        assert attributes[tracing.MESSAGING_BATCH_MESSAGE_COUNT] >= 1
        for link in span["links"]:
            assert _hex(link["context"]["trace_id"]) == req.trace_id
            assert _hex(link["context"]["span_id"]) == req.span_id
            job_id = link["attributes"][tracing.JOB_ID]
            linked[job_id] = linked.get(job_id, 0) + 1
    assert set(linked) == traced, "every traced job's publish links to its trace, no other"

    # the consumer: claims linked to the jobs they took, with their attempt
    claimed: dict[str, set[int]] = {}
    for span in _spans_named(spans, "claim"):
        assert span["kind"] == "SpanKind.CLIENT"
        assert span["attributes"][tracing.MESSAGING_OPERATION_TYPE] == "receive"
        for link in span["links"]:
            assert _hex(link["context"]["trace_id"]) == req.trace_id
            claimed.setdefault(link["attributes"][tracing.JOB_ID], set()).add(
                link["attributes"][tracing.JOB_ATTEMPT]
            )
    assert claimed == {str(ids[0]): {1}, str(ids[1]): {1}, str(ids[2]): {1, 2, 3}}

    # and every run of a traced job is a child of the enqueuing span
    runs = [s for s in _spans_named(spans, "process ") if s["attributes"][tracing.JOB_ID] in traced]
    assert len(runs) == 5, "two successes, three attempts of the failing job"
    for span in runs:
        assert span["kind"] == "SpanKind.CONSUMER"
        assert _hex(span["context"]["trace_id"]) == req.trace_id
        assert _hex(span["parent_id"]) == req.span_id
    outcomes = sorted(
        (
            s["attributes"][tracing.JOB_ID],
            s["attributes"][tracing.JOB_ATTEMPT],
            s["attributes"][tracing.JOB_OUTCOME],
        )
        for s in runs
    )
    assert outcomes == sorted(
        [
            (str(ids[0]), 1, "succeeded"),
            (str(ids[1]), 1, "succeeded"),
            (str(ids[2]), 1, "retry"),
            (str(ids[2]), 2, "retry"),
            (str(ids[2]), 3, "failed"),
        ]
    )
    [acme] = [s for s in runs if s["attributes"][tracing.JOB_ID] == str(ids[1])]
    assert acme["attributes"][tracing.JOB_TENANT] == "acme"
    [last] = [s for s in runs if s["attributes"][tracing.JOB_OUTCOME] == "failed"]
    assert last["status"]["status_code"] == "ERROR"
    assert last["attributes"][tracing.ERROR_TYPE] == "RuntimeError"
    [root] = [
        s
        for s in _spans_named(spans, "process ")
        if s["attributes"][tracing.JOB_ID] == str(untraced)
    ]
    assert root["parent_id"] is None


def test_a_publish_rabbitmq_refuses_is_an_error_span_linked_to_the_job(
    tracer: trace.Tracer,
    engine: Engine,
    pg: psycopg.Connection,
    topology: Topology,
    recording: dict[str, str],
    tmp_path: Path,
) -> None:
    relay_args = ["--poll-interval", "0.5", "--queue-backoff-cap", "1"]
    with (
        queue_policy(topology, "refused", {"max-length": 0, "overflow": "reject-publish"}) as lift,
        running("relay", relay_args, recording, "relay.started") as relay,
        running("consumer", ["--app", "tests.apps.queues"], recording, "consumer.started"),
    ):
        with tracer.start_as_current_span("POST /refunds") as request:
            job_id = enqueue(engine, "refused_noop", queue="refused")
        relay.wait_for_event("relay.queue_publish_failing")
        lift()
        asyncio.run(wait_for_state(pg, job_id, "SUCCEEDED"))
    req = request.get_span_context()
    publishes = [
        s
        for s in _spans_named(recorded_spans(tmp_path), "publish refused")
        if s["links"] and s["links"][0]["attributes"][tracing.JOB_ID] == str(job_id)
    ]
    failed = [s for s in publishes if s["status"]["status_code"] == "ERROR"]
    assert failed, publishes
    for span in failed:
        assert span["attributes"][tracing.ERROR_TYPE] == "refused"
        assert "nacked" in span["status"]["description"]
    assert publishes[-1]["status"]["status_code"] == "UNSET", "then it went out"
    for span in publishes:
        assert _hex(span["context"]["trace_id"]) == req.trace_id
        assert _hex(span["parent_id"]) == req.span_id


def test_without_opentelemetry_the_processes_run_as_before(
    tracer: trace.Tracer,
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
    tmp_path: Path,
) -> None:
    # A producer with the extra, consumers and relay without: the stored context is
    # carried, never read.
    with tracer.start_as_current_span("POST /orders"):
        traced = enqueue(engine, "noop")
    assert _stored(pg, traced) is not None
    blocked = blocking_env(tmp_path)
    env = service_env(db_url, amqp_url, topology, **blocked)
    # and a producer without it writes no context, in a traced request or not
    script = (
        "import sys\n"
        "from sqlalchemy import create_engine\n"
        "from sqlalchemy.orm import Session\n"
        "import outbox\n"
        "engine = create_engine(sys.argv[1])\n"
        "with Session(engine) as s, s.begin():\n"
        "    print(outbox.enqueue(s, 'noop', {}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, db_url.sqlalchemy],
        env={**os.environ, **blocked},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    plain = uuid.UUID(out.stdout.strip())
    assert _stored(pg, plain) is None
    with (
        running("relay", [], env, "relay.started") as relay,
        running("consumer", APP, env, "consumer.started") as consumer,
    ):
        for job_id in (traced, plain):
            asyncio.run(wait_for_state(pg, job_id, "SUCCEEDED"))
        assert consumer.stop() == 0
        assert relay.stop() == 0
    attempted = (tmp_path / "blocked.log").read_text().split()
    assert "opentelemetry" in attempted, "the block was in the way of an import"
