"""``jobctl limits``: the rate limits with their buckets, the concurrency limits of
job types with their running and waiting jobs, and the jobs that expired before
they started."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.commands.common import database_option, run
from hybrid_jobs.jobctl.metrics.queries import METRICS_JOBS_EXPIRED
from hybrid_jobs.jobctl.output import emit, json_option, table, when
from hybrid_jobs.jobctl.service import Database
from hybrid_jobs.jobctl.service.sql import fetch_all


def _limits_table(found: list[outbox.RateLimit]) -> str:
    rows = [
        [
            r.name,
            f"{r.rate:g}/{r.per_seconds:g}s",
            f"{r.burst:g}",
            f"{r.tokens:.2f}" if not r.name.endswith(":*") else "-",
            f"{r.next_token_in_seconds:.2f}s" if not r.name.endswith(":*") else "-",
            when(r.refilled_at) if r.refilled_at is not None else "-",
            str(r.buckets),
        ]
        for r in found
    ]
    headers = ["RATE LIMIT", "RATE", "BURST", "TOKENS", "NEXT TOKEN", "LAST TAKEN", "BUCKETS"]
    return table(headers, rows)


def _concurrency_table(found: list[outbox.ConcurrencyLimit]) -> str:
    rows = [
        [c.job_type, str(c.global_limit), str(c.running), str(c.waiting), c.updated_by]
        for c in found
    ]
    headers = ["JOB TYPE", "GLOBAL LIMIT", "RUNNING", "WAITING", "RECORDED BY"]
    return table(headers, rows)


@click.command()
@database_option
@json_option
def limits(database_url: str | None) -> None:
    """Rate limits: each one's rate, burst, the tokens its bucket holds now and
    when the next is due (a 'prefix:*' limit: how many names have a bucket); the
    concurrency limits of job types (a handler's global_limit), with the jobs of each
    running and waiting for it; and, per queue, the jobs that expired (code EXPIRED)
    before they started, as long as retention keeps them."""

    async def action(
        db: Database,
    ) -> tuple[list[outbox.RateLimit], list[outbox.ConcurrencyLimit], list[tuple[Any, ...]]]:
        async with db.reading() as session:
            found = await outbox.rate_limits_async(session)
            concurrency = await outbox.concurrency_limits_async(session)
            expired = await fetch_all(session, METRICS_JOBS_EXPIRED)
            return found, concurrency, expired

    found, concurrency, expired = run(database_url, action)
    text = _limits_table(found) if found else "no rate limits"
    if concurrency:
        text += "\n\n" + _concurrency_table(concurrency)
    if expired:
        text += "\n\n" + table(["QUEUE", "EXPIRED"], [[q, str(n)] for q, n in sorted(expired)])
    document = {
        "rate_limits": [
            {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in d.items()}
            | {"next_token_in_seconds": r.next_token_in_seconds}
            for r in found
            for d in [dataclasses.asdict(r)]
        ],
        "concurrency_limits": [
            {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in d.items()}
            for c in concurrency
            for d in [dataclasses.asdict(c)]
        ],
        "expired": {q: int(n) for q, n in expired},
    }
    emit(document, text)
