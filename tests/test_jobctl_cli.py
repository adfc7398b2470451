"""`jobctl` as a user runs it: a subprocess against a real database, text for
people, one JSON object with --json, errors in one line with a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.plumbing.config import DatabaseUrl
from tests.support import processes
from tests.support.jobs import enqueue
from tests.support.processes import jobctl


@pytest.fixture
def cli(db_url: DatabaseUrl, tmp_path: Path) -> Any:
    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = jobctl(*args, url=db_url, cwd=tmp_path)
        if ok:
            assert done.returncode == 0, done.stderr
        return done

    def as_json(*args: str) -> Any:
        done = run(*args, "--json")
        return json.loads(done.stdout)  # the whole of stdout: one object

    run.json = as_json  # type: ignore[attr-defined]
    return run


def fail(pg: psycopg.Connection, job_id: uuid.UUID, state: str = "FAILED") -> None:
    pg.execute(
        "UPDATE jobs SET state = %s, attempt_count = 1, max_attempts = 1, started_at = now(),"
        " finished_at = clock_timestamp(), last_error_code = 'Boom', last_error_message = 'no'"
        " WHERE job_id = %s",
        (state, job_id),
    )


def test_jobs_list_pages_through_every_job(cli, engine: Engine) -> None:
    ids = [str(enqueue(engine, "greet", {"n": i}, queue="mail")) for i in range(7)]
    seen: list[str] = []
    after: list[str] = []
    for _ in range(5):
        page = cli.json("jobs", "list", "--limit", "3", *after)
        seen += [j["id"] for j in page["jobs"]]
        if page["next"] is None:
            break
        after = ["--after", page["next"]]
    assert seen == list(reversed(ids))
    text = cli("jobs", "list", "--limit", "3").stdout.splitlines()
    assert text[0].split()[:4] == ["ID", "STATE", "QUEUE", "TYPE"]
    assert text[1].split()[:4] == [ids[-1], "QUEUED", "mail", "greet"]
    assert text[-1].startswith("next page: --after ")


def test_jobs_list_filters(cli, engine: Engine, pg) -> None:
    failed = enqueue(engine, "greet", {}, queue="mail", tenant="acme")
    enqueue(engine, "greet", {}, queue="mail")
    enqueue(engine, "other", {}, queue="web")
    fail(pg, failed)
    assert [j["id"] for j in cli.json("jobs", "list", "--state", "FAILED")["jobs"]] == [str(failed)]
    assert len(cli.json("jobs", "list", "--queue", "mail")["jobs"]) == 2
    assert len(cli.json("jobs", "list", "--type", "other")["jobs"]) == 1
    assert len(cli.json("jobs", "list", "--tenant", "acme")["jobs"]) == 1
    assert cli("jobs", "list", "--queue", "nowhere").stdout.strip() == "no jobs"


def test_jobs_show_the_row_and_attempts(cli, engine: Engine, pg) -> None:
    job_id = enqueue(engine, "greet", {"to": "ada"}, max_attempts=1)
    pg.execute(
        "INSERT INTO job_attempts (job_id, attempt, lease_generation, worker, ready_at,"
        " started_at, finished_at, outcome, error_code, error_message)"
        " VALUES (%s, 1, 1, 'w1', now(), now(), now(), 'FAILED', 'Boom', 'no')",
        (job_id,),
    )
    fail(pg, job_id)
    shown = cli.json("jobs", "show", str(job_id))
    assert (shown["state"], shown["payload"], shown["done"]) == ("FAILED", {"to": "ada"}, True)
    assert shown["last_error"] == {"code": "Boom", "message": "no"}
    assert [(a["attempt"], a["worker"], a["outcome"]) for a in shown["attempts"]] == [
        (1, "w1", "FAILED")
    ]
    text = cli("jobs", "show", str(job_id)).stdout
    assert f"job         {job_id}  greet on default" in text
    assert "last error  Boom: no" in text
    assert "attempts:" in text and "w1" in text


def columns(text: str) -> list[dict[str, str]]:
    """A table the CLI printed, as one dict per row, cut where each header starts."""
    head, *rows = text.splitlines()
    names = head.split("  ")
    names = [n.strip() for n in names if n.strip()]
    starts = [head.index(n) for n in names]
    ends = [*starts[1:], None]
    return [
        {n: row[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)}
        for row in rows
        if row and not row.startswith(("next page", "relays", "as of"))
    ]


def test_jobs_say_what_is_true_of_held_new_and_replayed_jobs(cli, engine: Engine, pg) -> None:
    """A job held for approval says so, not "run after 9999-12-31 (in 2912103d03h)";
    one never claimed has made 0 attempts of no budget yet, not "0/?"; one that
    succeeded after a replay shows its old error as an earlier attempt's, not as its
    last error; a queue with nothing runnable has no oldest runnable job, not 0.0s."""
    held = enqueue(engine, "deploy", {}, queue="ops", needs_approval=True)
    fresh = enqueue(engine, "greet", {}, queue="mail")
    replayed = enqueue(engine, "resize", {}, queue="images", max_attempts=1)
    pg.execute(
        "UPDATE jobs SET state = 'FAILED', attempt_count = 1, started_at = now(),"
        " finished_at = clock_timestamp(), last_error_code = 'ValueError',"
        " last_error_message = 'image too large' WHERE job_id = %s",
        (replayed,),
    )
    cli("jobs", "retry", str(replayed))
    # As a consumer's finish leaves it: the old error stays on the row.
    pg.execute(
        "UPDATE jobs SET state = 'SUCCEEDED', attempt_count = 2, started_at = now(),"
        " finished_at = clock_timestamp() WHERE job_id = %s",
        (replayed,),
    )

    shown = cli("jobs", "show", str(held)).stdout.splitlines()
    (run_after,) = [line for line in shown if line.startswith("run after")]
    assert run_after.split(None, 2)[2] == "held: waits for approval"
    assert "of the handler's budget" in next(ln for ln in shown if ln.startswith("state"))

    rows = {r["ID"]: r for r in columns(cli("jobs", "list").stdout)}
    assert rows[str(held)]["ATTEMPT"] == "0"
    assert rows[str(fresh)]["ATTEMPT"] == "0"
    assert (rows[str(replayed)]["ATTEMPT"], rows[str(replayed)]["ERROR"]) == (
        "2/2",
        "earlier: ValueError",
    )
    text = cli("jobs", "show", str(replayed)).stdout
    assert "earlier error  ValueError: image too large" in text
    assert "last error" not in text
    # The JSON document is the API's, unchanged: the row's last error, as stored.
    document = cli.json("jobs", "show", str(replayed))
    assert document["last_error"] == {"code": "ValueError", "message": "image too large"}

    queues = {r["QUEUE"]: r for r in columns(cli("stats").stdout)}
    assert (queues["ops"]["OLDEST"], queues["ops"]["LAG"]) == ("-", "-")
    assert queues["mail"]["OLDEST"].endswith("s")  # due now: it has waited


def test_jobs_cancel(cli, engine: Engine, pg) -> None:
    waiting = enqueue(engine, "greet", {})
    finished = enqueue(engine, "greet", {})
    fail(pg, finished, "SUCCEEDED")
    done = cli("jobs", "cancel", str(waiting))
    assert done.stdout.strip() == f"{waiting}: CANCELLED"
    mixed = cli(
        "jobs", "cancel", str(waiting), str(finished), str(uuid.uuid4()), "--json", ok=False
    )
    assert mixed.returncode == 1, "not every job was cancelled"
    results = json.loads(mixed.stdout)["jobs"]
    assert [(r["state"], r["applied"]) for r in results] == [
        ("CANCELLED", True),
        ("SUCCEEDED", False),
        (None, False),
    ]


def test_jobs_retry_by_id_and_by_filter(cli, engine: Engine, pg) -> None:
    ids = [enqueue(engine, "greet", {}, queue="mail") for _ in range(4)]
    for job_id in ids[:3]:
        fail(pg, job_id)
    one = cli("jobs", "retry", str(ids[0]), "--by", "ada")
    assert one.stdout.strip() == f"{ids[0]}: is QUEUED again"
    assert pg.execute("SELECT replayed_by FROM job_replays").fetchall() == [("ada",)]
    mixed = cli("jobs", "retry", str(ids[3]), str(uuid.uuid4()), ok=False)
    assert mixed.returncode == 1
    assert "QUEUED, not retried (only FAILED or CANCELLED jobs are)" in mixed.stdout
    dry = cli.json(
        "jobs", "retry", "--filter", "queue=mail", "--filter", "finished_after=1h", "--dry-run"
    )
    assert (dry["matched"], dry["dry_run"]) == (2, True)
    assert pg.execute("SELECT count(*) FROM jobs WHERE state = 'FAILED'").fetchone() == (2,)
    done = cli("jobs", "retry", "--filter", "type=greet", "--filter", "error_code=Boom")
    assert done.stdout.startswith("retried 2 failed job(s) matching job_type=greet")
    assert pg.execute("SELECT count(*) FROM jobs WHERE state = 'FAILED'").fetchone() == (0,)
    neither = cli("jobs", "retry", ok=False)
    assert neither.returncode == 2
    assert neither.stderr.splitlines() == [
        "jobctl jobs retry: give job IDs, --filter KEY=VALUE, or --all (one of them)"
    ]
    bad = cli("jobs", "retry", "--filter", "colour=red", ok=False)
    assert bad.returncode == 2 and "colour: unknown" in bad.stderr


def test_queues_pause_and_resume(cli, engine: Engine) -> None:
    job_id = enqueue(engine, "greet", {}, queue="mail")
    paused = cli.json("queues", "pause", "mail", "--by", "ada")
    assert (paused["queue"], paused["paused"], paused["paused_by"]) == ("mail", True, "ada")
    assert "mail: already paused since" in cli("queues", "pause", "mail").stdout
    assert cli.json("stats")["queues"][0]["paused"] is True
    why = cli.json("jobs", "show", str(job_id))["why"]
    assert "QUEUE_PAUSED" in [b["code"] for b in why["blockers"]]
    assert "QUEUE_PAUSED" in cli("jobs", "show", str(job_id)).stdout
    assert cli("queues", "resume", "mail", "--by", "bob").stdout.strip() == "mail: resumed by bob"
    assert cli("queues", "resume", "mail").stdout.strip() == "mail: not paused"
    bad = cli("queues", "pause", "no way", ok=False)
    assert bad.returncode == 2 and bad.stderr.startswith("jobctl queues pause: queue must be")


def test_stats_per_queue(cli, engine: Engine, pg) -> None:
    enqueue(engine, "greet", {}, queue="mail")
    fail(pg, enqueue(engine, "greet", {}, queue="mail"))
    found = cli.json("stats")
    (mail,) = found["queues"]
    assert (mail["queue"], mail["queued"], mail["failed"], mail["outbox_pending"]) == (
        "mail",
        1,
        1,
        2,
    )
    assert (found["relays_live"], found["relays_publishing"]) == (0, 0)
    text = cli("stats").stdout.splitlines()
    assert text[0].split()[:3] == ["QUEUE", "QUEUED", "RETRY"]
    assert text[1].split()[:2] == ["mail", "1"]
    assert text[2].startswith("relays: 0 live, 0 connected to RabbitMQ (no wake-up goes out")

    pg.execute(
        "INSERT INTO relays (relay_id, host, pid, broker_connected) VALUES ('r:1:a', 'r', 1, true)"
    )
    assert "relays: 1 live, 1 connected to RabbitMQ" in cli("stats").stdout.splitlines()


def test_schedules(cli, engine: Engine, pg) -> None:
    with Session(engine) as session, session.begin():
        outbox.schedule(
            session,
            "nightly",
            "report",
            {"kind": "daily"},
            every=timedelta(hours=1),
        )
    (listed,) = cli.json("schedules", "list")["schedules"]
    assert (listed["name"], listed["every_seconds"], listed["paused"]) == ("nightly", 3600, False)
    assert cli("schedules", "pause", "nightly").stdout.strip() == "nightly: paused"
    assert cli.json("schedules", "list")["schedules"][0]["paused"] is True
    assert cli("schedules", "resume", "nightly").stdout.startswith("nightly: resumed, next fire ")
    job = cli.json("schedules", "trigger", "nightly")
    assert (job["job_type"], job["payload"], job["state"]) == (
        "report",
        {"kind": "daily"},
        "QUEUED",
    )
    missing = cli("schedules", "trigger", "nope", ok=False)
    assert missing.returncode == 1
    assert missing.stderr.splitlines() == ["jobctl schedules trigger: no schedule named 'nope'"]


def test_tenants_set_keeps_what_is_not_given(cli) -> None:
    cli("tenants", "set", "acme", "--max-running", "3", "--weight", "2")
    # No max_queued: its waiting jobs are not counted, and it says so.
    (acme,) = cli.json("tenants", "list")["tenants"]
    assert (acme["queued"], acme["queued_at"]) == (None, None)
    cli("tenants", "set", "acme", "--max-queued", "100")
    (acme,) = cli.json("tenants", "list")["tenants"]
    assert (acme["max_running"], acme["weight"], acme["max_queued"]) == (3, 2.0, 100)
    cleared = cli.json("tenants", "set", "acme", "--max-running", "none")
    assert (cleared["max_running"], cleared["weight"], cleared["max_queued"]) == (None, 2.0, 100)
    bad = cli("tenants", "set", "acme", "--weight", "0", ok=False)
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [
        "jobctl tenants set: weight must be more than 0 and at most 1000"
    ]
    assert "acme" in cli("tenants", "list").stdout


def test_workers(cli, pg) -> None:
    assert cli("workers").stdout.strip() == "no consumers"
    pg.execute(
        "INSERT INTO workers (worker_id, host, pid, queues, job_types, concurrency, prefetch)"
        " VALUES ('w1', 'box', 42, '{mail}', '{greet}', 4, 8)"
    )
    (worker,) = cli.json("workers")["workers"]
    assert (worker["worker_id"], worker["queues"], worker["live"]) == ("w1", ["mail"], True)
    assert worker["lapsed"] is False
    assert "box:42" in cli("workers").stdout
    assert " live " in cli("workers").stdout
    # The sweeper took a lease of it back since it was last heard from: it is not
    # live, and says why, until it is heard from again.
    pg.execute("UPDATE workers SET lease_lapsed_at = now() WHERE worker_id = 'w1'")
    (worker,) = cli.json("workers")["workers"]
    assert (worker["live"], worker["lapsed"]) == (False, True)
    assert " lapsed " in cli("workers").stdout
    pg.execute("UPDATE workers SET last_seen_at = now() + interval '1 second'")
    (worker,) = cli.json("workers")["workers"]
    assert (worker["live"], worker["lapsed"]) == (True, False)
    # Silent past the TTL, no lease of it lapsed: silent.
    pg.execute(
        "UPDATE workers SET last_seen_at = now() - interval '1 hour', lease_lapsed_at = NULL"
    )
    (worker,) = cli.json("workers")["workers"]
    assert (worker["live"], worker["lapsed"]) == (False, False)
    assert " silent " in cli("workers").stdout


@pytest.mark.parametrize("as_json", [False, True])
def test_errors_are_one_line_and_exit_non_zero(
    as_json: bool, db_url: DatabaseUrl, empty_db_url: DatabaseUrl, tmp_path: Path
) -> None:
    flags = ["--json"] if as_json else []
    # Processes of their own: how the real entry point reports an error and exits.
    jobctl = processes.jobctl_process

    def one_line(done: subprocess.CompletedProcess[str], code: int, command: str) -> str:
        assert done.returncode == code, (done.stdout, done.stderr)
        if as_json:
            found = json.loads(done.stdout)
            assert found["command"] == command
            return str(found["error"])
        (line,) = done.stderr.splitlines()
        assert line.startswith(f"{command}: ")
        return line

    unknown = jobctl("jobs", "show", str(uuid.uuid4()), *flags, url=db_url, cwd=tmp_path)
    assert "no job" in one_line(unknown, 1, "jobctl jobs show")
    malformed = jobctl("jobs", "show", "nope", *flags, url=db_url, cwd=tmp_path)
    assert "not a job id" in one_line(malformed, 2, "jobctl jobs show")
    usage = jobctl("jobs", "list", *flags, "--limit", "0", url=db_url, cwd=tmp_path)
    assert "--limit" in one_line(usage, 2, "jobctl jobs list")
    token = jobctl("jobs", "list", *flags, "--after", "garbage", url=db_url, cwd=tmp_path)
    assert "after" in one_line(token, 2, "jobctl jobs list")
    down = jobctl("stats", *flags, url="postgresql://127.0.0.1:1/jobs", cwd=tmp_path)
    assert "cannot reach PostgreSQL at 127.0.0.1:1" in one_line(down, 1, "jobctl stats")
    bare = jobctl("workers", *flags, url=empty_db_url, cwd=tmp_path)
    assert "run `jobctl migrate`" in one_line(bare, 2, "jobctl workers")


def test_limits(cli, pg, engine) -> None:
    assert cli("limits").stdout.strip() == "no rate limits"
    pg.execute(
        "INSERT INTO rate_limits (name, rate, per_seconds, burst) VALUES ('api', 2, 3600, 4)"
    )
    pg.execute(
        "INSERT INTO rate_limits (name, rate, per_seconds, burst) VALUES ('sms:*', 1, 60, 1)"
    )
    pg.execute("INSERT INTO rate_buckets (name, tokens, refilled_at) VALUES ('api', 0, now())")
    pg.execute("INSERT INTO rate_buckets (name, tokens, refilled_at) VALUES ('sms:a', 1, now())")
    job_id = enqueue(engine, "greet", {})
    pg.execute(
        "UPDATE jobs SET state = 'CANCELLED', last_error_code = 'EXPIRED', finished_at = now()"
        " WHERE job_id = %s",
        [job_id],
    )
    shown = cli.json("limits")
    api, sms = shown["rate_limits"]
    assert (api["name"], api["burst"], api["buckets"]) == ("api", 4.0, 1)
    assert 0 <= api["tokens"] < 1 and 1700 < api["next_token_in_seconds"] <= 1800
    assert (sms["name"], sms["buckets"]) == ("sms:*", 1)
    assert shown["expired"] == {"default": 1}
    text = cli("limits").stdout
    assert "api" in text and "2/3600s" in text and "EXPIRED" in text
