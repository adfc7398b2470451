"""What a handler hands back, made storable before the fenced finish statement sees
it: its return value as JSON text or a note saying why it was dropped, and error
texts without NUL, lone surrogates or unbounded length. Storing them in a real
database is tests/test_outcomes.py."""

from __future__ import annotations

import json
import math

import pytest

from hybrid_jobs.consumers.outcome import (
    MAX_ERROR_CODE,
    MAX_ERROR_MESSAGE,
    MAX_RESULT_BYTES,
    MAX_RESULT_DEPTH,
    MAX_RETRY_DELAY,
    MAX_TRACEBACK,
    Outcome,
    encode_result,
)


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth - 1):
        value = [value]
    return [value]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"sent": 3, "to": ["ann"]}, '{"sent":3,"to":["ann"]}'),
        ("é", '"é"'),
        ("[{", '"[{"'),
        (nested(MAX_RESULT_DEPTH), json.dumps(nested(MAX_RESULT_DEPTH), separators=(",", ":"))),
    ],
)
def test_a_result_that_fits_is_kept_as_compact_json(value: object, text: str) -> None:
    assert encode_result(value) == (text, None)


def test_no_result_is_none() -> None:
    assert encode_result(None) == (None, None)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({1, 2}, "not JSON-serialisable (TypeError"),
        (math.nan, "not JSON-serialisable (ValueError"),
        ("\ud800", "lone surrogate (U+D800)"),
        ("a\x00b", "NUL character"),
        ("x" * MAX_RESULT_BYTES, f"the limit is {MAX_RESULT_BYTES}"),
        (nested(MAX_RESULT_DEPTH + 1), f"nested {MAX_RESULT_DEPTH + 1} levels deep"),
        # Brackets inside strings are text, not nesting.
        (["[" * 100], None),
    ],
)
def test_a_result_that_cannot_be_kept_is_a_note_saying_why(
    value: object, reason: str | None
) -> None:
    encoded, why = encode_result(value)
    if reason is None:
        assert why is None and encoded is not None and json.loads(encoded) == value
        return
    assert why is not None and reason in why
    assert encoded is not None and json.loads(encoded) == {"result_dropped": why}


def test_error_texts_are_cleaned_and_bounded() -> None:
    failed = Outcome.failed("C" * 500, "bad\x00 \ud800 news" + "m" * MAX_ERROR_MESSAGE)
    assert failed.error_code is not None and len(failed.error_code) == MAX_ERROR_CODE
    assert failed.error_code.endswith("…")
    assert failed.error_message is not None and len(failed.error_message) == MAX_ERROR_MESSAGE
    assert failed.error_message.startswith("bad ? news")
    traceback = "Traceback\n" + "frame\n" * 5000 + "ValueError: here"
    tail = Outcome.failed("E", "m", traceback).traceback
    assert tail is not None and len(tail) == MAX_TRACEBACK and tail.endswith("ValueError: here")


@pytest.mark.parametrize(
    ("asked", "kept"), [(-5, 0.0), (30, 30.0), (math.inf, MAX_RETRY_DELAY), (1e12, MAX_RETRY_DELAY)]
)
def test_a_retry_delay_is_bounded(asked: float, kept: float) -> None:
    assert Outcome.retry("E", "m", asked).delay_seconds == kept


def test_a_refused_outcome_drops_the_handlers_data_then_its_texts() -> None:
    done = Outcome.succeeded('{"big": 1}')
    storable = done.storable("value too long")
    assert storable.kind == "succeeded" and storable.progress is None
    assert json.loads(storable.result or "") == {
        "result_dropped": "the database refused it: value too long"
    }
    bare = Outcome.retry("Ünïcode", "mëssage", 5, "tb").bare("again")
    assert bare.kind == "retry" and bare.delay_seconds == 5 and bare.traceback is None
    assert bare.error_code is not None and bare.error_code.isascii()
    assert bare.error_message is not None and "again" in bare.error_message
