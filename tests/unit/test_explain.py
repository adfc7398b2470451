"""`explain`'s decision on the rows its two statements return, made up here: which
blockers hold for a job, with which facts, in which order, and how the summary
reads them. Reading those rows from real tables is tests/test_control.py."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from hybrid_jobs.outbox.explain import AHEAD_CAP, DRAIN_WINDOW, Why, _explanation, error_line

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def row(**changes: Any) -> dict[str, Any]:
    """A JOB_EXPLAIN row for a due QUEUED job whose wake-up went out, in a running
    queue served by a consumer with its handler, a relay connected: nothing blocks."""
    base: dict[str, Any] = {
        "job_id": uuid.UUID(int=1),
        "job_type": "mail",
        "queue": "default",
        "tenant": None,
        "priority": 0,
        "state": "QUEUED",
        "attempt_count": 0,
        "max_attempts": 5,
        "run_after": NOW - timedelta(seconds=5),
        "db_now": NOW,
        "finished_at": None,
        "started_at": None,
        "last_error_code": None,
        "last_error_message": None,
        "cancel_requested_at": None,
        "delay_reason": None,
        "approval": None,
        "approval_by": None,
        "approval_at": None,
        "expires_at": None,
        "rate_limit": None,
        "rate_tokens": None,
        "rate_refilled_at": None,
        "lease_owner": None,
        "lease_generation": 0,
        "lease_expires_at": None,
        "owner_seen_at": None,
        "progress": None,
        "progress_at": None,
        "paused_at": None,
        "paused_by": None,
        "max_running": None,
        "running": 0,
        "wakeup_id": 7,
        "wakeup_due": NOW - timedelta(seconds=5),
        "wakeup_sent_at": NOW - timedelta(seconds=4),
        "held_reason": None,
        "held_since": None,
        "relays_live": 1,
        "relays_publishing": 1,
        "relay_seen_at": NOW,
        "workers_on_queue": 1,
        "handlers_on_queue": 1,
    }
    unknown = set(changes) - set(base)
    assert not unknown, unknown
    return base | changes


def backlog(**changes: Any) -> dict[str, Any]:
    """A JOB_EXPLAIN_BACKLOG row: nothing ahead, nothing drained."""
    return {
        "oldest_due": None,
        "in_flight": 0,
        "pending_ahead": 0,
        "drained": 0,
        "first_start": None,
        "sampled": 0,
        "since": None,
    } | changes


def test_a_due_job_with_its_wake_up_out_is_next_in_line() -> None:
    why = _explanation(row(), backlog())
    assert why.blockers == []
    assert why.summary == "QUEUED: due and next in line"
    assert why.lease is None and why.outcome is None and why.last_error is None


def test_every_blocker_that_holds_is_listed_in_order() -> None:
    # Not due, paused, at its tenant's cap, no relay, no consumer: all at once.
    job = row(
        run_after=NOW + timedelta(seconds=30),
        paused_at=NOW - timedelta(minutes=1),
        paused_by="alice",
        tenant="acme",
        max_running=2,
        running=2,
        wakeup_sent_at=None,
        relays_live=0,
        relays_publishing=0,
        relay_seen_at=None,
        workers_on_queue=0,
        handlers_on_queue=0,
    )
    why = _explanation(job, None)
    assert why.codes == [
        Why.NOT_DUE,
        Why.QUEUE_PAUSED,
        Why.TENANT_CAP,
        Why.NO_RELAY,
        Why.NO_CONSUMER,
    ]
    assert why.blocker(Why.NOT_DUE).facts["in_seconds"] == 30  # type: ignore[union-attr]
    assert why.blocker(Why.TENANT_CAP).facts == {  # type: ignore[union-attr]
        "tenant": "acme",
        "running": 2,
        "max_running": 2,
    }
    assert why.summary == (
        "QUEUED: not due for 30 s; its queue is paused (by alice);"
        " tenant 'acme' is at its cap (2/2 running);"
        " no relay is running to send its wake-up;"
        " no live consumer serves queue 'default'"
    )


def test_a_retry_waits_out_its_backoff_with_the_error_that_caused_it() -> None:
    job = row(
        state="RETRY_WAIT",
        attempt_count=2,
        run_after=NOW + timedelta(seconds=40),
        last_error_code="Timeout",
        last_error_message="Timeout: slow",
    )
    why = _explanation(job, None)
    assert why.codes == [Why.RETRY_BACKOFF]
    assert why.blocker(Why.RETRY_BACKOFF).facts["attempt"] == 2  # type: ignore[union-attr]
    assert why.summary == "RETRY_WAIT: retrying in 40 s after attempt 2 failed (Timeout)"
    assert why.last_error is not None and why.last_error.code == "Timeout"


def test_a_due_job_without_a_wake_up_waits_for_the_re_waker_unless_parked() -> None:
    missing = _explanation(row(wakeup_id=None, wakeup_due=None, wakeup_sent_at=None), None)
    assert missing.codes == [Why.WAKEUP_PENDING]
    assert missing.blocker(Why.WAKEUP_PENDING).facts["missing"] is True  # type: ignore[union-attr]
    # Parked for a handler nobody runs: NO_HANDLER says it, not a missing wake-up.
    parked = row(
        wakeup_id=None, wakeup_due=None, wakeup_sent_at=None, delay_reason="NO_HANDLER",
        handlers_on_queue=0,
    )  # fmt: skip
    why = _explanation(parked, None)
    assert why.codes == [Why.NO_HANDLER]
    assert why.blocker(Why.NO_HANDLER).facts == {  # type: ignore[union-attr]
        "job_type": "mail",
        "workers_on_queue": 1,
        "parked": True,
    }


def test_a_pending_wake_up_reports_its_queues_lag_and_whats_ahead() -> None:
    job = row(wakeup_sent_at=None, held_reason="FAIR_SHARE", held_since=NOW)
    ahead = backlog(
        oldest_due=NOW - timedelta(seconds=12),
        in_flight=3,
        pending_ahead=7,
        drained=120,
        first_start=NOW - timedelta(minutes=10),
    )
    why = _explanation(job, ahead)
    assert why.codes == [Why.WAKEUP_PENDING, Why.BACKLOG]
    assert why.blocker(Why.WAKEUP_PENDING).facts["outbox_lag_seconds"] == 12  # type: ignore[union-attr]
    facts = why.blocker(Why.BACKLOG).facts  # type: ignore[union-attr]
    # 120 attempts ended over the whole window: 2 a second, 10 ahead, 5 s to wait.
    assert facts["drain_per_s"] == 120 / DRAIN_WINDOW
    assert facts["estimated_start_in_seconds"] == 5.0
    assert (facts["ahead"], facts["in_flight"], facts["pending_ahead"]) == (10, 3, 7)
    assert facts["held_reason"] == "FAIR_SHARE" and facts["held_since"] == NOW
    assert why.summary.endswith("10 ahead, start in about 5 s (held back: FAIR_SHARE)")


def test_a_young_queues_drain_rate_counts_only_the_time_it_drained() -> None:
    # Draining for 10 s only: 20 ended is 2 a second, not 20 over a minute.
    ahead = backlog(pending_ahead=4, drained=20, first_start=NOW - timedelta(seconds=10))
    facts = _explanation(row(), ahead).blocker(Why.BACKLOG).facts  # type: ignore[union-attr]
    assert facts["drain_per_s"] == 2.0 and facts["estimated_start_in_seconds"] == 2.0


def test_ahead_is_counted_up_to_the_cap_and_nothing_drained_has_no_estimate() -> None:
    facts = _explanation(row(), backlog(in_flight=AHEAD_CAP + 5)).blocker(Why.BACKLOG).facts  # type: ignore[union-attr]
    assert facts["ahead"] == AHEAD_CAP and facts["ahead_at_least"] is True
    assert facts["drain_per_s"] == 0 and facts["estimated_start_in_seconds"] is None
    summary = _explanation(row(), backlog(in_flight=AHEAD_CAP + 5)).summary
    assert summary == f"QUEUED: at least {AHEAD_CAP} ahead, nothing drained in the last minute"


def test_relays_that_run_but_cannot_publish() -> None:
    why = _explanation(row(wakeup_sent_at=None, relays_publishing=0), backlog())
    assert Why.RELAY_DISCONNECTED in why.codes and Why.NO_RELAY not in why.codes


@pytest.mark.parametrize(
    ("state", "attempts", "moves_to"),
    [("RUNNING", 1, "RETRY_WAIT"), ("RUNNING", 5, "FAILED"), ("CANCEL_REQUESTED", 1, "CANCELLED")],
)
def test_a_lapsed_lease_says_where_the_sweeper_moves_the_job(
    state: str, attempts: int, moves_to: str
) -> None:
    job = row(
        state=state,
        attempt_count=attempts,
        lease_owner="w1",
        lease_generation=3,
        started_at=NOW - timedelta(minutes=2),
        lease_expires_at=NOW - timedelta(seconds=90),
        owner_seen_at=NOW - timedelta(minutes=2),
        cancel_requested_at=NOW - timedelta(seconds=100) if state == "CANCEL_REQUESTED" else None,
        progress='{"done": 3}',
    )
    why = _explanation(job, None)
    lapsed = why.blocker(Why.LEASE_EXPIRED)
    assert lapsed is not None
    assert lapsed.facts["sweeper_moves_to"] == moves_to
    assert lapsed.facts["expired_seconds_ago"] == 90
    assert why.codes[-1] == Why.LEASE_EXPIRED
    assert (Why.CANCEL_REQUESTED in why.codes) == (state == "CANCEL_REQUESTED")
    assert why.lease is not None and why.lease["progress"] == {"done": 3}
    assert why.lease["lease_expires_in_seconds"] == -90
    assert why.summary.startswith(f"{state} on w1 (attempt {attempts}): ")


def test_a_running_job_on_a_live_lease_has_no_blockers() -> None:
    job = row(
        state="RUNNING",
        attempt_count=1,
        lease_owner="w1",
        lease_expires_at=NOW + timedelta(seconds=30),
        started_at=NOW,
    )
    why = _explanation(job, None)
    assert why.blockers == [] and why.summary == "RUNNING on w1 (attempt 1)"


def test_a_finished_job_has_its_outcome_and_last_error() -> None:
    job = row(
        state="FAILED",
        attempt_count=3,
        finished_at=datetime(2026, 5, 1, 11, 59, 30, tzinfo=UTC),
        last_error_code="OSError",
        last_error_message="OSError: disk full",
    )
    why = _explanation(job, None)
    assert why.blockers == [] and why.outcome == "FAILED"
    assert (
        why.summary
        == "FAILED at 2026-05-01 11:59:30 after 3 attempts; last error OSError: disk full"
    )
    assert why.as_dict()["job_id"] == str(uuid.UUID(int=1))


def test_an_error_line_names_its_code_once() -> None:
    # An exception's message already starts with its class: "OSError: OSError: ..."
    # in a failed job's summary read as two errors.
    assert error_line("OSError", "OSError: no decoder") == "OSError: no decoder"
    assert error_line("CARD_DECLINED", "insufficient funds") == "CARD_DECLINED: insufficient funds"
    assert error_line("Boom", None) == "Boom"
    assert error_line(None, "no") == "no"


def test_a_job_its_handler_snoozed_says_so_until_it_is_due_and_how_often() -> None:
    snoozed_at = NOW - timedelta(seconds=10)
    job = row(delay_reason="SNOOZED", run_after=NOW + timedelta(seconds=20), wakeup_sent_at=None)
    why = _explanation(job | {"delay_since": snoozed_at, "snoozes": 3}, None)
    assert why.codes == [Why.SNOOZED], "not NOT_DUE: it says why it is not due"
    assert why.blocker(Why.SNOOZED).facts == {  # type: ignore[union-attr]
        "until": NOW + timedelta(seconds=20),
        "in_seconds": 20,
        "snoozed_at": snoozed_at,
        "snoozes": 3,
    }
    assert why.summary == (
        "QUEUED: snoozed by its handler until 2026-05-01 12:00:20 (in 20 s);"
        " snoozed 3 time(s) so far"
    )
    # Due, it waits for nothing its handler said: the mark stays until a claim.
    due = job | {"run_after": NOW - timedelta(seconds=1), "delay_since": snoozed_at}
    assert _explanation(due | {"wakeup_sent_at": NOW}, backlog()).codes == []
