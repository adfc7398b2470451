"""The `after` page token of job lists: it round-trips, it is opaque text a URL
carries as is, and anything else (another order's token, a doctored one) is refused
naming `after`."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime

import pytest

from hybrid_jobs.jobctl.service.cursor import Cursor, Order
from hybrid_jobs.jobctl.service.errors import Invalid

ID = uuid.UUID("0190a5a0-0000-7000-8000-000000000001")
FINISHED = datetime(2026, 5, 1, 12, 30, 15, 123456, tzinfo=UTC)


def doctored(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor", [Cursor(Order.CREATED, ID), Cursor(Order.FINISHED, ID, FINISHED)]
)
def test_a_token_round_trips_and_is_url_safe(cursor: Cursor) -> None:
    token = cursor.encode()
    assert Cursor.decode(token, cursor.order) == cursor
    assert token.replace("-", "").replace("_", "").isalnum(), "no padding, no + or /"


def test_a_token_is_bound_to_its_order() -> None:
    created = Cursor(Order.CREATED, uuid.uuid4()).encode()
    with pytest.raises(Exception, match="another order"):
        Cursor.decode(created, Order.FINISHED)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "not base64 at all!",
        doctored("c:not-a-uuid"),
        doctored("x:" + str(ID)),
        doctored("f:" + str(ID)),  # a finished-order token without its finished_at
        doctored(f"c:{ID}@{FINISHED.isoformat()}"),  # a created-order one with it
        doctored(f"f:{ID}@2026-05-01T12:30:15"),  # a naive time
        doctored(f"f:{ID}@yesterday"),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    ],
)
def test_anything_else_is_refused_naming_after(token: str) -> None:
    for order in Order:
        with pytest.raises(Invalid) as refused:
            Cursor.decode(token, order)
        assert refused.value.field == "after"
