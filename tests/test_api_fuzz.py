"""A property-based run against the OpenAPI document that `jobctl serve` serves:
every operation, with generated input (valid and invalid), on a real server and
database. No answer may be a 5xx, and every answer must match the document
(status, content type, headers, body). Every run makes a few examples of each
operation and mode; the soak run (``-m soak``) makes more, to reach every field's
edges."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from hybrid_jobs.plumbing.config import DatabaseUrl
from tests.support.api import BEARER, served

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
POSITIVE, NEGATIVE = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE


# Examples per operation and mode: in every run, enough for every operation to be
# called with valid and invalid input and to answer each kind of status; in the soak
# run, enough to reach every field's edges.
@pytest.mark.parametrize(
    "examples",
    [
        pytest.param({POSITIVE: 10, NEGATIVE: 6}, id="quick"),
        pytest.param({POSITIVE: 25, NEGATIVE: 15}, id="full", marks=pytest.mark.soak),
    ],
)
def test_every_operation_answers_as_documented(
    db_url: DatabaseUrl, examples: dict[schemathesis.GenerationMode, int]
) -> None:
    # schemathesis's own pytest loader does not run under pytest 9; its
    # strategies do, one hypothesis run per operation and mode.
    with served(db_url) as (base, daemon):
        schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 14
        for operation in operations:
            for mode, count in examples.items():

                @given(case=operation.as_strategy(generation_mode=mode))
                @settings(
                    max_examples=count,
                    deadline=None,
                    derandomize=True,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )
                def answers(case: schemathesis.Case) -> None:
                    case.call_and_validate(base_url=base, headers=BEARER, checks=CHECKS, timeout=10)

                try:
                    answers()
                except Unsatisfiable:
                    # An operation without parameters or body has no invalid input.
                    assert mode is schemathesis.GenerationMode.NEGATIVE, operation.label
                except Exception as exc:
                    exc.add_note(f"operation: {operation.label} ({mode.value})")
                    raise
        answered = [e for e in daemon.events() if e.get("event") == "api.request"]
    # Every operation was called, and most calls reached a route's logic.
    assert {
        (e["method"], e["path"].split("/")[2] if e["path"].startswith("/v1/") else e["path"])
        for e in answered
    } >= {("GET", "jobs"), ("POST", "jobs"), ("GET", "/readyz")}
    statuses = {e["status"] for e in answered}
    assert {200, 202, 404, 422} <= statuses, statuses
    print(len(answered), "requests,", sorted(statuses))
