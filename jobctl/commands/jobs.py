"""``jobctl jobs``: list, show, edit, cancel, retry, approve and reject jobs."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import click

from hybrid_jobs.jobctl.commands.common import (
    by_option,
    database_option,
    limit_option,
    parse_ids,
    read,
    write,
)
from hybrid_jobs.jobctl.output import (
    Failure,
    attempts,
    budget,
    duration,
    emit,
    error_is_current,
    held_for,
    json_option,
    printable,
    table,
    when,
)
from hybrid_jobs.jobctl.service import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    JobFilter,
    approve_job,
    cancel_jobs,
    edit_job,
    get_job,
    jsonable,
    list_jobs,
    refusal,
    reject_job,
    retry_jobs,
    retry_matching,
)
from hybrid_jobs.jobctl.service.jobs import RETRYABLE
from hybrid_jobs.jobctl.service.models import (
    JobPage,
    JobStateChange,
    JobSummary,
    JobView,
    TypePolicy,
)
from hybrid_jobs.outbox.explain import error_line
from hybrid_jobs.schema.states import JobState

# The traceback `jobs show` prints: the newest attempt's that has one, its last lines.
TRACEBACK_LINES: Final = 40


@click.group()
def jobs() -> None:
    """List, show, edit, cancel, retry, approve and reject jobs."""


@jobs.command("list")
@click.option("--state", type=click.Choice([s.value for s in JobState]), help="Only this state.")
@click.option("--queue", metavar="NAME", help="Only this queue.")
@click.option("--type", "job_type", metavar="TYPE", help="Only this job type.")
@click.option("--tenant", metavar="NAME", help="Only this tenant's jobs.")
@click.option(
    "--tag",
    "tags",
    metavar="TAG",
    multiple=True,
    help="Only jobs with this tag (repeat: all of them).",
)
@click.option(
    "--meta",
    metavar="KEY=VALUE",
    multiple=True,
    help="Only jobs whose meta has KEY with this VALUE, compared as text (repeatable).",
)
@limit_option(DEFAULT_LIMIT, MAX_LIMIT, "Jobs per page.")
@click.option("--after", metavar="TOKEN", help="Start after the page that printed this token.")
@database_option
@json_option
def list_(
    state: str | None,
    queue: str | None,
    job_type: str | None,
    tenant: str | None,
    tags: tuple[str, ...],
    meta: tuple[str, ...],
    limit: int,
    after: str | None,
    database_url: str | None,
) -> None:
    """Jobs, newest first: waiting and running ones by when they were created,
    finished ones (--state SUCCEEDED, FAILED, CANCELLED) by when they finished.

    A page ends with the token for the next one. Filtered lists over finished
    jobs read a bounded number of them per page, so a page may come back short
    (even empty) with a token to read further back. A list by tag is in creation
    order whatever the state, and reads a bounded number of the tag's jobs per page.
    """
    pairs = [pair.partition("=") for pair in meta]
    if any(not sep or not key for key, sep, _ in pairs):
        raise click.BadParameter("give KEY=VALUE", param_hint="--meta")
    where = JobFilter(
        None if state is None else JobState(state),
        queue,
        job_type,
        tenant,
        tags,
        {key: value for key, _, value in pairs} or None,
    )

    page = read(database_url, lambda session: list_jobs(session, where, limit=limit, after=after))
    emit(jsonable(page), _page_text(page))


def _page_text(page: JobPage) -> str:
    rows = [_row(job) for job in page.jobs]
    lines = [
        table(
            [
                "ID",
                "STATE",
                "QUEUE",
                "TYPE",
                "TENANT",
                "ATTEMPT",
                "CREATED",
                "FINISHED",
                "ERROR",
                "TAGS",
            ],
            rows,
        )
    ]
    if not page.jobs:
        lines = ["no jobs" + (" in this stretch" if page.scan_limited else "")]
    if page.next:
        reason = " (searched as far as one page may read)" if page.scan_limited else ""
        lines.append(f"next page{reason}: --after {page.next}")
    return "\n".join(lines)


def _row(job: JobSummary) -> list[object]:
    error = job.last_error_code or ""
    if error and not error_is_current(job):
        error = f"earlier: {error}"  # an earlier attempt's, not what the job is about now
    return [
        job.id,
        job.state,
        job.queue,
        job.job_type,
        job.tenant or "-",
        attempts(job),
        when(job.created_at),
        when(job.finished_at),
        error,
        ",".join(job.tags) or "-",
    ]


@jobs.command()
@click.argument("job_id", metavar="ID")
@database_option
@json_option
def show(job_id: str, database_url: str | None) -> None:
    """One job: its row, every attempt, and why it waits."""
    (ident,) = parse_ids((job_id,))

    job = read(database_url, lambda session: get_job(session, ident))
    if job is None:
        raise Failure(f"no job {ident} (it never existed, or it finished and was deleted)")
    emit(jsonable(job), _job_text(job))


def _compact(value: Any, limit: int = 400, *, raw: bool = False) -> str:
    """A JSON value on one line, cut at ``limit``; ``raw``: a value served as its
    JSON text already (stored nested past MAX_PAYLOAD_DEPTH)."""
    if raw and isinstance(value, str):
        text = value
    else:
        text = json.dumps(jsonable(value), ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _allows(policy: TypePolicy) -> str:
    """What a job type allows, in a line: "no retry, no cancel while running; on
    cancel: compensate"."""
    said = [
        "retry" if policy.replay else "no retry",
        "cancel while running" if policy.cancel_running else "no cancel while running",
    ]
    promise = "" if policy.on_cancel is None else f"; on cancel: {policy.on_cancel}"
    return ", ".join(said) + promise


def _job_text(job: JobView) -> str:
    due = (job.run_after - job.checked_at).total_seconds()
    held = held_for(job)
    run_after = when(job.run_after) + (f" (in {duration(due)})" if due > 0 else "")
    fields: list[tuple[str, object]] = [
        ("job", f"{job.id}  {job.job_type} on {job.queue}"),
        ("tenant", job.tenant or "-"),
        (
            "state",
            f"{job.state} (attempt {job.attempt} of {budget(job)}, priority {job.priority})",
        ),
        ("run after", run_after if held is None else f"held: waits for {held}"),
        ("created", when(job.created_at)),
        ("started", when(job.started_at)),
        ("finished", when(job.finished_at)),
    ]
    if job.lease is not None:
        lease = job.lease
        fields.append(
            (
                "lease",
                f"{lease.worker}, generation {lease.generation}, until {when(lease.expires_at)}",
            )
        )
    if job.cancel_requested_at is not None:
        forced = job.cancel_forced_at
        asked = when(job.cancel_requested_at)
        if forced is not None and job.state == JobState.CANCEL_REQUESTED:
            asked += f"; cancel requested (forced) at {when(forced)}"
        fields.append(("cancel asked", asked))
    if job.policy is not None:
        fields.append(("type allows", _allows(job.policy)))
    if job.last_error is not None:
        error = job.last_error
        # Kept on the row after a success or a replay: then an earlier attempt's.
        name = "last error" if error_is_current(job) else "earlier error"
        fields.append((name, error_line(error.code, error.message)))
    if job.delay_reason is not None:
        fields.append(("turned down", f"{job.delay_reason} since {when(job.delay_since)}"))
    if job.approval is not None:
        a = job.approval
        decided = "" if a.at is None else f" by {a.by} at {when(a.at)}"
        fields.append(("approval", f"{a.status}{decided}"))
    if job.why is not None:
        fields.append(("why", job.why.summary))
        fields.extend(("", f"{b.code}: {_compact(b.facts, 200)}") for b in job.why.blockers)
    deep = set(job.as_text)
    progress = _compact(job.progress, raw="progress" in deep)
    fields += [
        ("progress", "-" if job.progress is None else f"{progress} at {when(job.progress_at)}"),
        ("result", "-" if job.result is None else _compact(job.result, raw="result" in deep)),
        ("dedup key", job.dedup_key or "-"),
        (
            "key",
            "-"
            if job.key is None
            else f"{job.key} (limit {job.key_limit}"
            + (f", {job.key_order})" if job.key_order else ")"),
        ),
        ("resource", job.resource or "-"),
        ("tags", ", ".join(job.tags) or "-"),
        ("meta", "-" if job.meta is None else _compact(job.meta)),
        ("payload", _payload_line(job, "payload" in deep)),
    ]
    if deep:
        fields.append(("note", f"{', '.join(job.as_text)} nest deeper than 100 levels: JSON text"))
    width = max(len(name) for name, _ in fields)
    # Every value escaped: job data must not act on the terminal, nor add a line.
    lines = [f"{name.ljust(width)}  {printable(value)}" for name, value in fields]
    if job.attempts:
        lines += ["", "attempts:"]
        rows = [
            [
                a.attempt,
                a.worker,
                when(a.started_at),
                duration((a.finished_at - a.started_at).total_seconds()),
                a.outcome,
                error_line(a.error_code, a.error_message),
            ]
            for a in job.attempts
        ]
        lines.append(table(["#", "WORKER", "STARTED", "TOOK", "OUTCOME", "ERROR"], rows))
    if job.steps:
        lines += ["", "steps (finished; a later attempt skips them):"]
        rows = [[s.name, when(s.finished_at), s.attempt] for s in job.steps]
        lines.append(table(["NAME", "FINISHED", "ATTEMPT"], rows))
    failed = [a for a in job.attempts if a.traceback]
    if failed:
        last = failed[-1]
        tail = last.traceback.rstrip("\n").splitlines() if last.traceback else []
        cut = len(tail) > TRACEBACK_LINES
        lines += ["", f"traceback of attempt {last.attempt}:"]
        if cut:
            lines.append(f"  ... ({len(tail) - TRACEBACK_LINES} lines before; --json has it all)")
        lines += [f"  {printable(line)}" for line in tail[-TRACEBACK_LINES:]]
    return "\n".join(lines)


@jobs.command()
@click.argument("job_ids", metavar="ID...", nargs=-1, required=True)
@click.option(
    "--force",
    is_flag=True,
    help="Do not leave a running job to its handler: at its worker's next heartbeat an "
    "async handler is interrupted (CancelledError), and the job ends CANCELLED whatever "
    "the handler does next. Also makes an earlier cancel request forced.",
)
@click.option(
    "--override-policy",
    is_flag=True,
    help="Ask running jobs to stop even when their type does not allow it "
    "(cancel_running=False); recorded with --by.",
)
@by_option("Who is asking, as a cancel that overrides a type's policy records it.")
@database_option
@json_option
def cancel(
    job_ids: tuple[str, ...],
    force: bool,
    override_policy: bool,
    by: str,
    database_url: str | None,
) -> None:
    """Cancel jobs that wait; ask running ones to stop (their handler sees it at its
    next heartbeat). Exits 1 if any job was unknown, had already finished
    otherwise, or runs and its type does not allow cancelling it."""
    ids = parse_ids(job_ids)

    results = write(
        database_url,
        lambda session: cancel_jobs(
            session, ids, force=force, override_policy=override_policy, by=by
        ),
    )
    _say_changes(
        results,
        lambda r: (
            f"{r.state}" + (" (forced)" if force and r.state == JobState.CANCEL_REQUESTED else "")
        ),
        lambda r: (
            f"not cancelled: {refusal(r, 'cancelling it while it runs')}"
            if r.not_allowed is not None
            else f"{r.state} already, not cancelled"
        ),
        forced=force,
    )


def _say_changes(
    results: list[JobStateChange],
    applied: Callable[[JobStateChange], str],
    refused: Callable[[JobStateChange], str],
    **document: Any,
) -> None:
    """A line a job (unknown, changed or refused) and the document of them all;
    exits 1 if any was unknown or refused."""
    lines = []
    for r in results:
        if r.state is None:
            lines.append(f"{r.id}: no such job")
        elif r.applied:
            lines.append(f"{r.id}: {applied(r)}")
        else:
            lines.append(f"{r.id}: {refused(r)}")
    emit({"jobs": jsonable(results), **document}, "\n".join(lines))
    if not all(r.applied for r in results):
        raise SystemExit(1)


_BY = by_option("Who decides, as the job records it.")


@jobs.command()
@click.argument("job_id", metavar="ID")
@_BY
@database_option
@json_option
def approve(job_id: str, by: str, database_url: str | None) -> None:
    """Let a job enqueued with needs_approval run: it is due now and woken. Exits 1,
    changing nothing, if it does not wait for approval (approved or rejected
    already, or never needed it)."""
    (ident,) = parse_ids((job_id,))

    result = write(database_url, lambda session: approve_job(session, ident, by=by))
    emit({"job": jsonable(result)}, f"{result.id}: approved, {result.state}")


@jobs.command()
@click.argument("job_id", metavar="ID")
@click.option("--reason", metavar="TEXT", help="Why: kept as the job's last error message.")
@_BY
@database_option
@json_option
def reject(job_id: str, reason: str | None, by: str, database_url: str | None) -> None:
    """Reject a job that waits for approval: CANCELLED, last error REJECTED. Exits 1,
    changing nothing, if it does not wait for approval."""
    (ident,) = parse_ids((job_id,))

    result = write(database_url, lambda session: reject_job(session, ident, by=by, reason=reason))
    emit({"job": jsonable(result)}, f"{result.id}: rejected, {result.state}")


@jobs.command()
@click.argument("job_id", metavar="ID")
@click.option("--priority", type=int, metavar="N", help="Its priority: higher runs first.")
@click.option(
    "--run-after",
    metavar="WHEN",
    help="Not before then: an ISO 8601 time with its offset (2026-01-31T12:00:00Z), a"
    " span from now (30s, 10m, 2h, 1d), or now.",
)
@click.option(
    "--max-attempts",
    type=int,
    metavar="N",
    help="Its whole attempt budget, counting the attempts made (it must leave one).",
)
@click.option(
    "--payload",
    metavar="JSON|@FILE",
    help="Its new payload: JSON text, or @ and a file that holds it.",
)
@database_option
@json_option
def edit(
    job_id: str,
    priority: int | None,
    run_after: str | None,
    max_attempts: int | None,
    payload: str | None,
    database_url: str | None,
) -> None:
    """Change a job that has not started yet (QUEUED, held for approval or for its
    parents, or RETRY_WAIT): only the options given. A new --run-after or
    --priority moves its wake-up with it. Exits 1, changing nothing, once the job
    has started or ended."""
    (ident,) = parse_ids((job_id,))
    given: dict[str, Any] = {}
    if payload is not None:
        given["payload"] = _payload(payload)
    if priority is not None:
        given["priority"] = priority
    if run_after is not None:
        given["run_after"] = _start(run_after)
    if max_attempts is not None:
        given["max_attempts"] = max_attempts
    if not given:
        raise Failure("say what to change: --priority, --run-after, --max-attempts or --payload", 2)

    job = write(database_url, lambda session: edit_job(session, ident, **given))
    due = "held" if held_for(job) is not None else when(job.run_after)
    text = f"{job.id}: edited, {job.state}, priority {job.priority}, run after {due}"
    emit({"job": jsonable(job)}, text)


def _payload_line(job: JobView, raw: bool) -> str:
    """The payload, or for a job on a stored input what may be shown of that input
    (never its content)."""
    stored = job.input
    if stored is None:
        return _compact(job.payload, raw=raw)
    line = f"stored input {stored.input_id}, {stored.size_bytes} bytes"
    if stored.sensitive:
        line += ", sensitive"
    if stored.redacted_at is not None:
        line += f", REDACTED at {when(stored.redacted_at)}: {stored.redaction_reason}"
    return line + " (content not shown)"


def _payload(value: str) -> Any:
    """--payload: JSON text, or @FILE for a file holding it."""
    where = "--payload"
    if value.startswith("@"):
        where = f"--payload {value}"
        try:
            with open(value[1:], encoding="utf-8") as file:
                value = file.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise Failure(f"{where}: cannot read it ({exc})", 2) from None
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise Failure(f"{where}: not JSON ({exc})", 2) from None
    except RecursionError:
        raise Failure(f"{where}: nested too deep", 2) from None


def _start(value: str) -> datetime | timedelta:
    """--run-after: now, a span from now (to the database's clock), or an instant."""
    if value == "now":
        return timedelta(0)
    span = _SPAN.fullmatch(value)
    if span is not None:
        return timedelta(seconds=float(span[1]) * _UNITS[span[2]])
    try:
        found = datetime.fromisoformat(value)
    except ValueError:
        raise Failure(
            f"--run-after {value}: not an ISO 8601 time (2026-01-31T12:00:00Z), a span"
            " (30s, 10m, 2h, 1d) nor now",
            2,
        ) from None
    if found.tzinfo is None:
        raise Failure(f"--run-after {value}: give the time's offset (Z, +02:00)", 2)
    return found


def _filters(pairs: tuple[str, ...]) -> dict[str, Any]:
    """--filter key=value pairs, as retry_matching's keywords."""
    keys = {
        "queue": "queue",
        "type": "job_type",
        "job_type": "job_type",
        "error_code": "error_code",
    }
    found: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not value:
            raise Failure(f"--filter {pair!r}: write it as key=value", 2)
        if key == "finished_after":
            found[key] = _instant(value)
        elif key in keys:
            found[keys[key]] = value
        else:
            raise Failure(
                f"--filter {key}: unknown (use queue, type, error_code or finished_after)", 2
            )
    return found


# A span back from now: digits (ASCII only: "²".isdigit() is True), an optional
# fraction, a unit.
_SPAN: Final = re.compile(r"(\d{1,9}(?:\.\d{1,6})?)([smhd])", re.ASCII)
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _instant(value: str) -> datetime:
    """An ISO 8601 instant with its offset, or a span back from now: 30m, 2h, 1d."""
    flag = f"--filter finished_after={value}"
    span = _SPAN.fullmatch(value)
    if span is not None:
        try:
            return datetime.now(UTC) - timedelta(seconds=float(span[1]) * _UNITS[span[2]])
        except OverflowError:
            raise Failure(f"{flag}: that is before the year 1; give a shorter span", 2) from None
    try:
        found = datetime.fromisoformat(value)
    except ValueError:
        raise Failure(
            f"{flag}: not an ISO 8601 time (2026-01-31T12:00:00Z) nor a span (30m, 2h, 1d)", 2
        ) from None
    if found.tzinfo is None:
        raise Failure(f"{flag}: give the time's offset (Z, +02:00)", 2)
    return found


@jobs.command()
@click.argument("job_ids", metavar="[ID...]", nargs=-1)
@click.option(
    "--filter",
    "pairs",
    metavar="KEY=VALUE",
    multiple=True,
    help="Retry the failed jobs that match (and the cancelled ones, with "
    "--include-cancelled), instead of IDs: queue=, type=, "
    "error_code=, finished_after= (ISO 8601, or 30m, 2h, 1d ago). Repeat to narrow.",
)
@limit_option(1000, 100_000, "With --filter: at most this many, oldest finished first.")
@click.option(
    "--all",
    "every",
    is_flag=True,
    help="Retry every failed job, in every queue (up to --limit): a bulk retry with no "
    "filter must say so.",
)
@click.option(
    "--include-cancelled",
    is_flag=True,
    help="With --filter or --all: retry CANCELLED jobs too (left alone otherwise: "
    "someone cancelled them on purpose).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be retried; change nothing.")
@click.option(
    "--override-policy",
    is_flag=True,
    help="Retry jobs whose type does not allow replay (replay=False) too; each replay "
    "is recorded as forced. Without it they are refused (by ID) or passed over and "
    "counted (--filter, --all).",
)
@by_option("Who is asking, as the jobs' replay records say.")
@database_option
@json_option
def retry(
    job_ids: tuple[str, ...],
    pairs: tuple[str, ...],
    limit: int,
    every: bool,
    include_cancelled: bool,
    dry_run: bool,
    override_policy: bool,
    by: str,
    database_url: str | None,
) -> None:
    """Put failed jobs back in the queue: by ID (FAILED or CANCELLED), every FAILED
    one that matches --filter, or with --all every FAILED one; --include-cancelled
    adds the CANCELLED ones to a filter or --all. Their history stays, and each gets
    a fresh attempt budget. With IDs, exits 1 if any was unknown or not failed or
    cancelled."""
    if sum(map(bool, (job_ids, pairs, every))) != 1:
        raise Failure("give job IDs, --filter KEY=VALUE, or --all (one of them)", 2)
    if job_ids:
        _retry_ids(parse_ids(job_ids), dry_run, by, database_url, override_policy)
    else:
        states = RETRYABLE if include_cancelled else frozenset({JobState.FAILED})
        filters = _filters(pairs) | {
            "every": every,
            "states": states,
            "override_policy": override_policy,
        }
        _retry_matching(filters, limit, dry_run, by, database_url)


def _retry_ids(
    ids: list[Any], dry_run: bool, by: str, database_url: str | None, override_policy: bool
) -> None:
    # A dry run is the real thing in a savepoint rolled back: what it says is what
    # the rule would do.
    results = write(
        database_url,
        lambda session: retry_jobs(
            session, ids, by=by, dry_run=dry_run, override_policy=override_policy
        ),
    )
    verb = "would be" if dry_run else "is"
    _say_changes(
        results,
        lambda r: f"{verb} QUEUED again",
        lambda r: (
            f"not retried: {refusal(r, 'replay')}"
            if r.not_allowed is not None
            else f"{r.state}, not retried (only FAILED or CANCELLED jobs are)"
        ),
        dry_run=dry_run,
    )


def _retry_matching(
    filters: dict[str, Any], limit: int, dry_run: bool, by: str, database_url: str | None
) -> None:
    found = write(
        database_url,
        lambda session: retry_matching(session, limit=limit, by=by, dry_run=dry_run, **filters),
    )
    shown = {k: v for k, v in filters.items() if k not in ("every", "states", "override_policy")}
    what = " ".join(
        f"{k}={v.isoformat() if isinstance(v, datetime) else v}" for k, v in shown.items()
    )
    kinds = " or ".join(sorted(s.lower() for s in filters["states"]))
    where = f"matching {what}" if what else "in every queue"
    verb = "would retry" if dry_run else "retried"
    text = f"{verb} {found.matched} {kinds} job(s) {where}"
    if found.matched == limit:
        text += " (the --limit; run again for more)"
    if found.not_allowed:
        text += (
            f"; passed over {found.not_allowed} whose type does not allow replay"
            " (--override-policy retries them)"
        )
    document = {k: str(v) for k, v in shown.items()}
    emit(
        jsonable(found) | {"filter": document, "states": sorted(filters["states"])},
        text,
    )
