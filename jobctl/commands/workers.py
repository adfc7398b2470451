"""``jobctl workers``: the consumers, as they announce themselves."""

from __future__ import annotations

import click

from hybrid_jobs.jobctl.commands.common import database_option, read
from hybrid_jobs.jobctl.output import emit, json_option, table, when
from hybrid_jobs.jobctl.service import jsonable, list_workers


@click.command()
@database_option
@json_option
def workers(database_url: str | None) -> None:
    """Consumers: where they run, what they serve, how busy they are, when they
    were last heard from (a consumer silent past the relay's --worker-ttl is
    forgotten)."""
    found = read(database_url, list_workers)
    rows = [
        [
            w.worker_id,
            f"{w.host}:{w.pid}",
            ",".join(w.queues),
            f"{w.running}/{w.concurrency}",
            w.status,
            when(w.last_seen_at),
            ",".join(w.job_types),
            ",".join(w.tenants) or "-",
        ]
        for w in found
    ]
    headers = [
        "WORKER",
        "HOST:PID",
        "QUEUES",
        "RUNNING",
        "STATUS",
        "LAST SEEN",
        "JOB TYPES",
        "TENANTS",
    ]
    emit({"workers": jsonable(found)}, table(headers, rows) if found else "no consumers")
