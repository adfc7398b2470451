"""``jobctl``: the operator's command line.

Each subcommand lives in its own module under ``jobctl/commands/`` and is imported
only when it runs (so ``jobctl migrate`` never loads the web server, the API and
the dashboard that ``jobctl serve`` needs). To add one: write the module with a
click command that takes ``@json_option``, and list it in ``COMMANDS`` with the first
sentence of its help.
"""

from __future__ import annotations

import importlib
import sys
from gettext import gettext
from typing import Any

import click

from hybrid_jobs.jobctl.output import Failure, command_path, report_error
from hybrid_jobs.plumbing.config import ConfigError

# name -> ("module:attribute" of the click command, its summary). The summary is the
# first sentence of the command's help, which `jobctl --help` lists: kept here, the
# listing imports no command's module (``serve``'s would import the web server).
# tests/unit/test_lazy_imports.py checks each against its command.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": (
        "hybrid_jobs.jobctl.commands.check:check",
        "Check the promises on a database whose work has settled (after a test run, a drill, a "
        "chaos soak): no job lost or completed twice, no write after a final state, history "
        "matching the rows, tenants' slots neither leaked nor released twice.",
    ),
    "doctor": (
        "hybrid_jobs.jobctl.commands.doctor:doctor",
        "Check this installation and say what is wrong with it, and what to do about each "
        "thing: the schema against this release, PostgreSQL's settings, connections and clock,"
        " the relays and consumers, the jobs nobody can run, RabbitMQ's exchanges and queues.",
    ),
    "inputs": (
        "hybrid_jobs.jobctl.commands.inputs:inputs",
        "Stored inputs (enqueue(..., payload_ref=)): look at one, redact one.",
    ),
    "jobs": (
        "hybrid_jobs.jobctl.commands.jobs:jobs",
        "List, show, edit, cancel, retry, approve and reject jobs.",
    ),
    "keys": (
        "hybrid_jobs.jobctl.commands.keys:keys",
        "Keys (enqueue's key=): each busy one with its leases against its key_limit, how many "
        "jobs wait for it, and the jobs holding it (job, type, queue, the consumer whose lease "
        'it is, since when); then the keys held behind a job of ordered="strict" that FAILED, '
        "until it is replayed or cancelled.",
    ),
    "limits": (
        "hybrid_jobs.jobctl.commands.limits:limits",
        "Rate limits: each one's rate, burst, the tokens its bucket holds now and when the next"
        " is due (a 'prefix:*' limit: how many names have a bucket); the concurrency limits of"
        " job types (a handler's global_limit) and of queues (consumer --queue-limit, or"
        " --set-queue here), with the jobs of each running and waiting for it; and, per queue,"
        " the jobs that expired (code EXPIRED) before they started, as long as retention keeps"
        " them.",
    ),
    "migrate": (
        "hybrid_jobs.jobctl.commands.migrate:migrate",
        "Create or upgrade the database's tables to this release's schema.",
    ),
    "queues": (
        "hybrid_jobs.jobctl.commands.queues:queues",
        "Pause and resume queues (`jobctl stats` shows them).",
    ),
    "resources": (
        "hybrid_jobs.jobctl.commands.resources:resources",
        "Exclusive resources (enqueue(..., resource=)): list the held ones, resolve an "
        "uncertain one.",
    ),
    "schedules": (
        "hybrid_jobs.jobctl.commands.schedules:schedules",
        "Recurring schedules (outbox.schedule makes them; the relay fires them).",
    ),
    "serve": (
        "hybrid_jobs.jobctl.commands.serve:serve",
        "Serve the HTTP API (/v1, its OpenAPI document at /openapi.json), the dashboard (/), "
        "Prometheus metrics (/metrics), /healthz and /readyz, until SIGTERM or SIGINT.",
    ),
    "stats": (
        "hybrid_jobs.jobctl.commands.stats:stats",
        "Per queue: jobs by state (of those waiting, how many wait for their key and how many "
        "for a rate limit's token), the age of the oldest runnable job, the relay's lag (due "
        "wake-ups not sent yet, and the oldest one's age), wake-ups in flight, jobs finished in"
        " the last minute (of the cancelled ones, how many expired before they started) and per"
        " second, live consumers; then how many relays are live and connected to RabbitMQ, and "
        "any queue a relay cannot publish to (RabbitMQ refuses it, say) with why.",
    ),
    "tenants": (
        "hybrid_jobs.jobctl.commands.tenants:tenants",
        "Tenants: caps on running jobs, fair-share weights, backpressure limits.",
    ),
    "webhooks": (
        "hybrid_jobs.jobctl.commands.webhooks:webhooks",
        "Completion webhooks: the calls owed when jobs end, delivered, pending or given up, "
        "and a second chance for one given up.",
    ),
    "workers": (
        "hybrid_jobs.jobctl.commands.workers:workers",
        "Consumers: where they run, what they serve, how busy they are, when they were last "
        "heard from (a consumer silent past the relay's --worker-ttl is forgotten).",
    ),
}


class JobctlGroup(click.Group):
    """Loads subcommands on demand, and reports their expected failures in one line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        target = entry[0]
        module, _, attribute = target.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command), target
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their summaries, as click lists them, without loading them."""
        names = self.list_commands(ctx)
        if not names:
            return
        # click's own layout and shortening (click.Group.format_commands), on the summary.
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [
            (name, click.Command(name, help=COMMANDS[name][1]).get_short_help_str(limit))
            for name in names
        ]
        with formatter.section(gettext("Commands")):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            self._fail(ctx, str(exc), 2)
        except Failure as exc:
            self._fail(ctx, str(exc), exc.exit_code)
        except click.UsageError as exc:
            # A subcommand's bad option or argument: one line too (`--help` shows
            # the usage), naming the command it was given to.
            if exc.ctx is not None and exc.ctx is not ctx:
                ctx.meta.setdefault("jobctl.command", exc.ctx.command_path)
            self._fail(ctx, exc.format_message(), 2)

    @staticmethod
    def _fail(ctx: click.Context, message: str, exit_code: int) -> None:
        command = command_path(ctx, " ".join(filter(None, ["jobctl", ctx.invoked_subcommand])))
        report_error(ctx, command, message)
        sys.exit(exit_code)


@click.group(cls=JobctlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hybrid-jobs", message="%(prog)s %(version)s")
def main() -> None:
    """Operate hybrid-jobs: jobs, queues, schedules, tenants, keys, limits, workers; the HTTP
    API and metrics (`jobctl serve`); migrations.

    Every command takes --json, prints one JSON object with it, and reports an error
    as one line with a non-zero exit status (2: a setting or argument to fix).
    Connection settings come from DATABASE_URL (or the file named by
    DATABASE_URL_FILE), as for `relay` and `consumer`.
    """
