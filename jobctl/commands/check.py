"""``jobctl check``: did the promises hold on this database?"""

from __future__ import annotations

import click
import psycopg

from hybrid_jobs.jobctl.check import check as run_check
from hybrid_jobs.jobctl.check import violations
from hybrid_jobs.jobctl.commands.common import database, database_failure, database_option
from hybrid_jobs.jobctl.output import Failure, emit, json_option


@click.command()
@database_option
@click.option("--expected", type=int, help="How many jobs were enqueued (a missing row is lost).")
@click.option("--require-success", is_flag=True, help="Every job must have SUCCEEDED.")
@json_option
def check(database_url: str | None, expected: int | None, require_success: bool) -> None:
    """Check the promises on a database whose work has settled (after a test run,
    a drill, a chaos soak): no job lost or completed twice, no write after a final
    state, history matching the rows, tenants' slots neither leaked nor released
    twice. Exits 1 on a violation. On a live system, `lost` counts jobs in flight."""
    url = database(database_url, click.get_current_context().command_path)
    try:
        report = run_check(url.conninfo, expected, require_success=require_success)
    except psycopg.Error as exc:
        raise database_failure(exc, url) from None
    width = max(len(k) for k in report)
    emit(report, "\n".join(f"{k:<{width}}  {v}" for k, v in report.items()))
    bad = violations(report)
    if bad:
        raise Failure(f"{len(bad)} promise(s) broken: {', '.join(sorted(bad))}")
