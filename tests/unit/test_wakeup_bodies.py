"""A wake-up's body both ways: the relay packs job ids into as few, even messages
as a limit allows; the consumer reads a body back as job ids, one a line, and
refuses anything else. Delivering packed messages is tests/test_packing.py."""

from __future__ import annotations

import uuid

import pytest

from hybrid_jobs.consumers.inbox import MAX_BODY_BYTES, MAX_IDS_PER_MESSAGE, parse_job_ids
from hybrid_jobs.relay.broker import pack


def rows(n: int, priority: int = 0) -> list[tuple[int, uuid.UUID, int]]:
    return [(i + 1, uuid.uuid4(), priority) for i in range(n)]


@pytest.mark.parametrize(
    ("n", "most", "sizes"),
    [
        (0, 20, []),
        (1, 20, [1]),
        (20, 20, [20]),
        (21, 20, [11, 10]),
        (30, 20, [15, 15]),
        (7, 1, [1] * 7),
        (100, 30, [25, 25, 25, 25]),
    ],
)
def test_ids_are_packed_into_as_few_even_messages_as_the_limit_allows(
    n: int, most: int, sizes: list[int]
) -> None:
    given = rows(n)
    messages = pack("mail", given, most)
    assert [len(m.job_ids) for m in messages] == sizes
    assert [i for m in messages for i in m.job_ids] == [job_id for _, job_id, _ in given]
    assert all(m.queue == "mail" for m in messages)


def test_a_message_carries_its_first_rows_id_and_its_highest_priority() -> None:
    given = [(10, uuid.uuid4(), 0), (11, uuid.uuid4(), 7), (12, uuid.uuid4(), 3)]
    first, second = pack("mail", given, 2)
    assert (first.message_id, first.priority) == ("10", 7)
    assert (second.message_id, second.priority) == ("12", 3)


def test_what_the_relay_packs_the_consumer_reads_back() -> None:
    given = rows(MAX_IDS_PER_MESSAGE)
    (message,) = pack("mail", given, MAX_IDS_PER_MESSAGE)
    assert len(message.body) <= MAX_BODY_BYTES
    assert parse_job_ids(message.body) == [job_id for _, job_id, _ in given]


def test_message_bodies_are_job_ids_one_a_line() -> None:
    good, other = uuid.uuid4(), uuid.uuid4()
    assert parse_job_ids(str(good).encode()) == [good]
    assert parse_job_ids(f"urn:uuid:{good}".encode()) == [good]
    assert parse_job_ids(f"{good}\n{other}\n".encode()) == [good, other]
    too_many = "\n".join(str(good) for _ in range(MAX_IDS_PER_MESSAGE + 1))
    for bad in [b"", b"\xff", b"hello", b"123", f"{good}\nnope".encode(), too_many.encode()]:
        assert parse_job_ids(bad) is None
