"""A handler's declared payload and its object as a producer: the fields checked
against its keyword-only parameters, the options kept apart from them, the function
still the function, and strict job types' refusal. No services."""

from __future__ import annotations

import asyncio
import inspect
import types
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Optional

import pytest

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import BAD_PAYLOAD, Permanent, Registry
from hybrid_jobs.consumers.payload import PayloadSpec
from hybrid_jobs.outbox import known_types

if TYPE_CHECKING:
    from decimal import Decimal  # resolvable only by a type checker: left unchecked


class Point:
    """An annotation no JSON value is."""


def declared(
    job: consumers.Job,
    *,
    order_id: int,
    note: str = "",
    total: float = 0.0,
    urgent: bool = False,
    lines: list[int] | None = None,
    totals: dict[str, int] | None = None,
    size: Literal["s", "m"] = "s",
    parent: Optional[int] = None,  # noqa: UP045 - the typing spelling is checked too
    anything: Any = None,
    point: Point | None = None,
    amount: Decimal | None = None,
) -> None: ...


SPEC = PayloadSpec.of("send_receipt", declared)


def test_a_payload_that_fits_is_the_handlers_keyword_arguments() -> None:
    assert SPEC is not None
    payload = {"order_id": 1, "total": 2, "lines": [1, 2], "parent": None, "size": "m"}
    assert SPEC.check(payload) == payload
    # Unchecked: Any, a class no JSON value is, a name only a type checker resolves.
    assert SPEC.check({"order_id": 1, "anything": [{}], "point": "p", "amount": "1.5"})


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ({}, "send_receipt: missing field 'order_id'"),
        ({"order_id": 1, "ordr": 2}, "unexpected field 'ordr' \\(did you mean 'order_id'\\?\\)"),
        ({"order_id": "1"}, "field 'order_id' must be int, not str"),
        ({"order_id": True}, "field 'order_id' must be int, not bool"),
        ({"order_id": 1.0}, "field 'order_id' must be int, not float"),
        ({"order_id": None}, "field 'order_id' must be int, not null"),
        ({"order_id": 1, "total": "2"}, "field 'total' must be float, not str"),
        ({"order_id": 1, "urgent": 1}, "field 'urgent' must be bool, not int"),
        ({"order_id": 1, "note": 5}, "field 'note' must be str, not int"),
        ({"order_id": 1, "lines": [1, "2"]}, r"field 'lines'\[1\] must be int, not str"),
        ({"order_id": 1, "lines": {"a": 1}}, "field 'lines' must be list\\[int\\], not dict"),
        ({"order_id": 1, "totals": {"a": "x"}}, r"field 'totals'\['a'\] must be int, not str"),
        ({"order_id": 1, "size": "xl"}, "field 'size' must be Literal"),
        ({"order_id": 1, "parent": "p"}, "field 'parent' must be int, not str"),
        ([1], "the payload must be an object of the handler's fields \\(order_id, note"),
        (None, "the payload must be an object .* not null"),
    ],
)
def test_a_payload_that_does_not_fit_is_refused_naming_the_field(payload: Any, error: str) -> None:
    assert SPEC is not None
    with pytest.raises(TypeError, match=error):
        SPEC.check(payload)


def test_other_fields_are_taken_by_a_var_keyword_parameter_and_checked_against_it() -> None:
    def tally(job: consumers.Job, *, region: str, **counts: int) -> None: ...

    spec = PayloadSpec.of("tally", tally)
    assert spec is not None
    assert spec.check({"region": "eu", "apples": 3}) == {"region": "eu", "apples": 3}
    with pytest.raises(TypeError, match="field 'pears' must be int, not str"):
        spec.check({"region": "eu", "pears": "3"})
    with pytest.raises(TypeError, match="multiple values for argument 'job'"):
        spec.check({"region": "eu", "job": 3})


def test_a_handler_taking_only_the_job_declares_no_payload() -> None:
    def plain(job: consumers.Job) -> None: ...

    assert PayloadSpec.of("plain", plain) is None


def test_the_registered_object_is_still_the_function() -> None:
    registry = Registry()

    @registry.handler("sync_one")
    def sync_one(job: Any, *, n: int = 1) -> tuple[Any, int]:
        """Doubles."""
        return job, n * 2

    @registry.handler("async_one")
    async def async_one(job: Any) -> Any:
        return job

    assert sync_one("j", n=4) == ("j", 8)
    assert asyncio.run(async_one("j")) == "j"
    assert (sync_one.__name__, sync_one.__doc__) == ("sync_one", "Doubles.")
    assert inspect.signature(sync_one) == inspect.signature(sync_one.__wrapped__)
    assert inspect.iscoroutinefunction(async_one)
    assert not inspect.iscoroutinefunction(sync_one)
    handler = registry.get("sync_one")
    assert handler is not None
    assert handler.fn is sync_one.__wrapped__
    assert not handler.is_async
    assert registry.get("async_one").is_async  # type: ignore[union-attr]
    # Registered again, elsewhere: the function it wraps is what runs.
    again = Registry().handler("sync_two")(sync_one)
    assert again.__wrapped__ is sync_one.__wrapped__


def test_payload_parameters_must_be_keyword_only() -> None:
    def positional(job: Any, order_id: int) -> None: ...

    with pytest.raises(TypeError, match=r"exactly one argument, the job .*keyword-only"):
        Registry().handler("t")(positional)


def test_the_handler_calls_the_function_with_the_fields_and_fails_a_bad_payload() -> None:
    registry = Registry()

    @registry.handler("t")
    def handle(job: Any, *, order_id: int) -> int:
        return order_id

    handler = registry.get("t")
    assert handler is not None
    assert handler.call(types.SimpleNamespace(payload={"order_id": 7})) == 7
    with pytest.raises(Permanent, match=r"t: unexpected field 'id' \(it takes order_id") as refused:
        handler.call(types.SimpleNamespace(payload={"id": 7}))
    assert refused.value.code == BAD_PAYLOAD


def test_options_are_enqueues_keywords_and_never_taken_from_the_fields() -> None:
    registry = Registry()

    @registry.handler("ranked", queue="mail")
    def ranked(job: Any, *, priority: int, queue: str) -> None: ...

    job = ranked.new_job(priority=9, queue="fields")
    assert (job.job_type, job.queue, job.priority) == ("ranked", "mail", 0)
    assert job.payload == {"priority": 9, "queue": "fields"}
    tuned = ranked.with_options(priority=5, dedup_key="d").with_options(queue="other")
    job = tuned.new_job({"priority": 1, "queue": "q"})
    assert (job.queue, job.priority, job.dedup_key) == ("other", 5, "d")
    with pytest.raises(TypeError, match=r"enqueue has no option 'priorty' .*'priority'"):
        ranked.with_options(priorty=1)
    with pytest.raises(TypeError, match="as keywords or as one dict, not both"):
        ranked.new_job({"priority": 1}, queue="q")
    with pytest.raises(TypeError, match="ranked: missing field 'queue'"):
        ranked.new_job(priority=1)
    # Every keyword of enqueue is an option, so one it gains needs no change here.
    keywords = [
        p.name
        for p in inspect.signature(outbox.enqueue).parameters.values()
        if p.kind is p.KEYWORD_ONLY
    ]
    assert ranked.with_options(**dict.fromkeys(keywords)).options.keys() == set(keywords)


def test_a_handler_taking_only_the_job_is_enqueued_with_one_positional_payload() -> None:
    registry = Registry()

    @registry.handler("raw", queue="q")
    def raw(job: Any) -> None: ...

    assert raw.new_job([1, "two"]).payload == [1, "two"]
    assert raw.new_job(None).payload is None
    with pytest.raises(TypeError, match="one positional value, not fields \\(priority\\)"):
        raw.new_job(priority=1)
    with pytest.raises(TypeError, match="needs the payload"):
        raw.new_job()


def test_with_a_json_default_the_fields_are_checked_as_the_handler_will_read_them() -> None:
    registry = Registry()

    @registry.handler("remind")
    def remind(job: Any, *, at: str) -> None: ...

    when = datetime(2030, 1, 2, tzinfo=UTC)
    with pytest.raises(TypeError, match="field 'at' must be str, not datetime"):
        remind.new_job(at=when)
    job = remind.with_options(json_default=datetime.isoformat).new_job(at=when)
    assert job.payload == {"at": when}, "stored as given: enqueue applies json_default"


@pytest.fixture
def strict_off() -> Any:
    yield
    outbox.require_known_job_types(None)


def test_strict_job_types_name_the_nearest_known_ones(strict_off: None) -> None:
    registry = Registry()
    for job_type in ("send_receipt", "send_invoice", "resize"):
        registry.handler(job_type)(lambda job: None)
    known_types.refuse_unknown(["send_reciept"])  # off by default
    outbox.require_known_job_types(registry)
    known_types.refuse_unknown(["send_receipt", "resize"])
    with pytest.raises(ValueError, match=r"'send_reciept' has no handler.*mean 'send_receipt'"):
        known_types.refuse_unknown(["resize", "send_reciept"])
    with pytest.raises(ValueError, match=r"'zzz' has no handler.*known: resize, send_invoice"):
        known_types.refuse_unknown(["zzz"])
    registry.handler("later")(lambda job: None)
    known_types.refuse_unknown(["later"])  # asked at each enqueue
    with pytest.raises(ValueError, match="registers none"):
        outbox.require_known_job_types(Registry())
        known_types.refuse_unknown(["t"])
    with pytest.raises(TypeError, match="takes a registry"):
        outbox.require_known_job_types(["send_receipt"])  # type: ignore[arg-type]


def test_strict_job_types_from_the_environment_check_the_default_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(known_types.STRICT_JOB_TYPES_ENV, "1")
    assert "hybrid_jobs_no_such_type" not in consumers.default_registry.job_types()
    with pytest.raises(ValueError, match="'hybrid_jobs_no_such_type' has no handler"):
        known_types.refuse_unknown(["hybrid_jobs_no_such_type"])
    monkeypatch.setenv(known_types.STRICT_JOB_TYPES_ENV, "off")
    known_types.refuse_unknown(["hybrid_jobs_no_such_type"])
    monkeypatch.setenv(known_types.STRICT_JOB_TYPES_ENV, "maybe")
    with pytest.raises(ValueError, match="STRICT_JOB_TYPES must be 1 or 0"):
        known_types.refuse_unknown(["t"])
