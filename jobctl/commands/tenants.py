"""``jobctl tenants``: tenants' limits, and set them."""

from __future__ import annotations

from typing import Any

import click

from hybrid_jobs.jobctl.commands.common import database_option, read, write
from hybrid_jobs.jobctl.output import emit, json_option, table, when
from hybrid_jobs.jobctl.service import KEEP, jsonable, list_tenants, set_tenant
from hybrid_jobs.jobctl.service.models import TenantView


@click.group()
def tenants() -> None:
    """Tenants: caps on running jobs, fair-share weights, backpressure limits."""


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


def _rows(found: list[TenantView]) -> str:
    rows = [
        [
            t.tenant,
            f"{t.running}/{_limit(t.max_running)}",
            f"{t.weight:g}",
            f"{t.queued}/{_limit(t.max_queued)}" if t.max_queued is not None else "-",
            t.runners,
            ", ".join(f"{h.queue}: {h.reason} since {when(h.since)}" for h in t.held) or "-",
        ]
        for t in found
    ]
    return table(["TENANT", "RUNNING/MAX", "WEIGHT", "QUEUED/MAX", "RUNNERS", "HELD BACK"], rows)


@tenants.command("list")
@database_option
@json_option
def list_(database_url: str | None) -> None:
    """Tenants with limits, and any the relay is holding back now."""
    found = read(database_url, list_tenants)
    emit({"tenants": jsonable(found)}, _rows(found) if found else "no tenants with limits")


def _limit_option(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> int | object | None:
    """A non-negative whole number, "none" for no limit, or KEEP when left out."""
    if value is None:
        return KEEP
    if value.lower() == "none":
        return None
    try:
        number = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a whole number or 'none'") from None
    if number < 0:
        raise click.BadParameter("must not be negative")
    return number


@tenants.command("set")
@click.argument("tenant")
@click.option(
    "--max-running", metavar="N|none", callback=_limit_option, help="Jobs at once; none: no cap."
)
@click.option("--weight", type=float, default=None, help="Share of a busy queue (default 1).")
@click.option(
    "--max-queued",
    metavar="N|none",
    callback=_limit_option,
    help="Waiting jobs past which enqueue refuses more; none: no limit.",
)
@click.option(
    "--runners",
    type=click.Choice(["shared", "dedicated"]),
    default=None,
    help="dedicated: only consumers started with --tenant TENANT take its jobs; "
    "shared (default): any.",
)
@database_option
@json_option
def set_(
    tenant: str,
    max_running: Any,
    weight: float | None,
    max_queued: Any,
    runners: str | None,
    database_url: str | None,
) -> None:
    """Set TENANT's limits; a limit not given stays as it was."""
    found = write(
        database_url,
        lambda session: set_tenant(
            session,
            tenant,
            max_running=max_running,
            weight=KEEP if weight is None else weight,
            max_queued=max_queued,
            runners=KEEP if runners is None else runners,
        ),
    )
    emit(jsonable(found), _rows([found]))
