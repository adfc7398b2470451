"""The relay's per-queue backoff on its own, no services: doubling to the cap,
logged once a minute, forgotten when nothing is due, published as the relay's row
carries it."""

from __future__ import annotations

import logging
import time

import pytest

from hybrid_jobs.relay.backoff import LOG_EVERY, QueueBackoff
from hybrid_jobs.relay.broker import QueueFailure

REFUSED = QueueFailure("mail", "refused", "RabbitMQ refused 1 of 1 messages")


def test_a_failing_queue_waits_longer_each_time_up_to_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backoff = QueueBackoff(base=0.5, cap=4.0)
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    waits = []
    for _ in range(6):
        backoff.failed(REFUSED)
        assert not backoff.ready("mail")
        assert backoff.ready("other"), "the other queues are not held back"
        wait = backoff.next_retry()
        assert wait is not None
        waits.append(wait)
        now[0] += wait
        assert backoff.ready("mail")
    for got, nominal in zip(waits, [0.5, 1, 2, 4, 4, 4], strict=True):
        assert 0.8 * nominal <= got <= 1.2 * nominal
    backoff.succeeded("mail")
    assert backoff.failing == {} and backoff.next_retry() is None


def test_a_failing_queue_is_logged_when_it_starts_then_once_a_minute(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="relay")
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    backoff = QueueBackoff(base=0.5, cap=1.0)
    for _ in range(100):
        backoff.failed(REFUSED)
        now[0] += 1.0
    logged = [r for r in caplog.records if r.msg == "relay.queue_publish_failing"]
    assert len(logged) == 1 + int(100 // LOG_EVERY)
    assert [r.failures for r in logged] == [1, 60]  # type: ignore[attr-defined]
    assert logged[0].queue == "mail" and logged[0].reason == "refused"  # type: ignore[attr-defined]
    backoff.succeeded("mail")
    (recovered,) = [r for r in caplog.records if r.msg == "relay.queue_publish_recovered"]
    assert recovered.failures == 100  # type: ignore[attr-defined]


def test_what_the_relays_row_carries_and_forgetting_queues_with_nothing_due() -> None:
    backoff = QueueBackoff(base=0.5, cap=5.0)
    backoff.failed(REFUSED)
    backoff.failed(QueueFailure("billing", "declare_refused", "PRECONDITION_FAILED ..."))
    shown = backoff.snapshot()
    assert sorted(shown) == ["billing", "mail"]
    assert shown["mail"]["reason"] == "refused" and shown["mail"]["failures"] == 1
    assert shown["mail"]["since"].endswith("+00:00")
    backoff.keep_only({"billing", "default"})
    assert sorted(backoff.snapshot()) == ["billing"]
