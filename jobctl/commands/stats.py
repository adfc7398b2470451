"""``jobctl stats``: per queue, what waits, what runs, outbox lag, throughput."""

from __future__ import annotations

import click

from hybrid_jobs.jobctl.commands.common import database_option, read
from hybrid_jobs.jobctl.output import duration, emit, json_option, table, when
from hybrid_jobs.jobctl.service import jsonable
from hybrid_jobs.jobctl.service import stats as read_stats


@click.command()
@database_option
@json_option
def stats(database_url: str | None) -> None:
    """Per queue: jobs by state (of those waiting, how many wait for their key
    and how many for a rate limit's token), the age of the oldest runnable job, the relay's
    lag (due wake-ups not sent yet, and the oldest one's age), wake-ups in flight,
    jobs finished in the last minute (of the cancelled ones, how many expired
    before they started) and per second, live consumers; then how
    many relays are live and connected to RabbitMQ, and any queue a relay cannot
    publish to (RabbitMQ refuses it, say) with why.

    Counts what is waiting and running, never the history: finished jobs are
    counted only for the last minute.
    """
    found = read(database_url, read_stats)
    rows = [
        [
            q.queue + (" (paused)" if q.paused else ""),
            q.queued,
            q.retry_wait,
            q.waiting_for_key,
            q.rate_limited,
            q.running,
            q.cancel_requested,
            # 0 means none (nothing runnable, nothing unsent), as on the dashboard
            duration(q.oldest_runnable_age_seconds or None),
            q.outbox_pending,
            duration(q.outbox_lag_seconds or None),
            q.outbox_in_flight,
            f"{q.succeeded}/{q.failed}/{q.cancelled}",
            q.expired,
            f"{q.finished_per_second:g}",
            f"{q.workers} ({q.concurrency})",
        ]
        for q in found.queues
    ]
    headers = [
        "QUEUE",
        "QUEUED",
        "RETRY",
        "KEY WAIT",
        "RATE LTD",
        "RUNNING",
        "CANCELLING",
        "OLDEST",
        "UNSENT",
        "LAG",
        "IN FLIGHT",
        "OK/FAIL/CANC",
        "EXPIRED",
        "DONE/S",
        "WORKERS",
    ]
    text = table(headers, rows) if found.queues else "no queues with jobs, wake-ups or consumers"
    relays = f"relays: {found.relays_live} live, {found.relays_publishing} connected to RabbitMQ"
    if not found.relays_publishing:
        relays += " (no wake-up goes out: start a relay, or see its log)"
    for f in found.publish_failing:
        relays += (
            f"\npublish failing: {f.queue} ({f.reason}, {f.relays} relay(s), since"
            f" {when(f.since)}): {f.detail}"
        )
    note = f"as of {when(found.checked_at)}; finished: last {duration(found.window_seconds)}"
    emit(jsonable(found), f"{text}\n{relays}\n{note}")
