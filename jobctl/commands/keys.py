"""``jobctl keys``: the busy keys and the jobs holding them, and the keys a failed
strict head holds."""

from __future__ import annotations

import click

from hybrid_jobs.jobctl.commands.common import database_option, limit_option, read
from hybrid_jobs.jobctl.output import emit, json_option, table, when
from hybrid_jobs.jobctl.service import jsonable, list_keys


@click.command()
@database_option
@json_option
@limit_option(100, 10_000, "Busy keys to show, in key order.")
def keys(database_url: str | None, limit: int) -> None:
    """Keys (enqueue's key=): each busy one with its leases against its key_limit,
    how many jobs wait for it, and the jobs holding it (job, type, queue, the
    consumer whose lease it is, since when); then the keys held behind a job of
    ordered="strict" that FAILED, until it is replayed or cancelled."""
    found = read(database_url, lambda session: list_keys(session, limit=limit))
    rows: list[list[str]] = []
    for k in found.busy:
        first = [k.key, f"{k.running}/{k.key_limit}", str(k.waiting)]
        # A key whose lease ended between the two reads has no holder to show.
        for h in k.holders or ():
            since = when(h.started_at) if h.started_at is not None else "-"
            rows.append([*first, str(h.job_id), h.job_type, h.queue, h.worker, since])
            first = ["", "", ""]
        if not k.holders:
            rows.append([*first, "-", "-", "-", "-", "-"])
    headers = ["KEY", "RUNNING", "WAITING", "HELD BY", "JOB TYPE", "QUEUE", "WORKER", "SINCE"]
    text = table(headers, rows) if rows else "no busy keys"
    if found.busy_total > len(found.busy):
        text += f"\n{len(found.busy)} of {found.busy_total} busy keys shown (--limit)"
    if found.held:
        held = [
            [
                h.key,
                str(h.job_id),
                h.job_type,
                h.queue,
                h.error_code or "-",
                when(h.failed_at) if h.failed_at is not None else "-",
                str(h.waiting),
            ]
            for h in found.held
        ]
        heads = ["HELD KEY", "FAILED JOB", "JOB TYPE", "QUEUE", "ERROR", "FAILED", "WAITING"]
        text += "\n\nheld behind a failed strict job (replay or cancel it to go on):\n"
        text += table(heads, held)
    emit(jsonable(found), text)
