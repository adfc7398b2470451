"""``jobctl``: the operator's command line.

Each subcommand lives in its own module under ``jobctl/commands/`` and is imported
only when it runs (so ``jobctl migrate`` never loads the web server, the API and
the dashboard that ``jobctl serve`` needs). To add one: write the module with a
click command that takes ``@json_option``, and list it in ``COMMANDS``.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from hybrid_jobs.jobctl.output import Failure, command_path, report_error
from hybrid_jobs.plumbing.config import ConfigError

# name -> "module:attribute" of the click command.
COMMANDS: dict[str, str] = {
    "check": "hybrid_jobs.jobctl.commands.check:check",
    "jobs": "hybrid_jobs.jobctl.commands.jobs:jobs",
    "keys": "hybrid_jobs.jobctl.commands.keys:keys",
    "limits": "hybrid_jobs.jobctl.commands.limits:limits",
    "migrate": "hybrid_jobs.jobctl.commands.migrate:migrate",
    "queues": "hybrid_jobs.jobctl.commands.queues:queues",
    "resources": "hybrid_jobs.jobctl.commands.resources:resources",
    "schedules": "hybrid_jobs.jobctl.commands.schedules:schedules",
    "serve": "hybrid_jobs.jobctl.commands.serve:serve",
    "stats": "hybrid_jobs.jobctl.commands.stats:stats",
    "tenants": "hybrid_jobs.jobctl.commands.tenants:tenants",
    "workers": "hybrid_jobs.jobctl.commands.workers:workers",
}


class JobctlGroup(click.Group):
    """Loads subcommands on demand, and reports their expected failures in one line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attribute = target.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command), target
        return command

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
