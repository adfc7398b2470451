"""Issue 17, the operator surface safe by default and honest in every answer: each
point through a real `jobctl serve` process (httpx over real HTTP, as a client, a
proxy or a rebinding page would reach it) or the real `jobctl` command line."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.api import BEARER, TOKEN, free_port, served
from tests.support.jobs import enqueue, job
from tests.support.processes import BIN, Daemon, jobctl, jobctl_env, service_env
from tests.support.proxy import TcpProxy
from tests.support.reverse_proxy import reverse_proxy
from tests.support.services import AMQP_URL

PROBLEM = "application/problem+json"


def count_jobs(pg: psycopg.Connection) -> int:
    row = pg.execute("SELECT count(*) FROM jobs").fetchone()
    assert row is not None
    return int(row[0])


def nested(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def serve_once(
    db: DatabaseUrl, args: list[str], env: dict[str, str], timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """`jobctl serve` expected to refuse to start: its exit and its output."""
    environment = service_env(db, AMQP_URL, Topology(prefix="unused"), **env)
    if "JOBCTL_API_TOKEN" not in env:
        environment.pop("JOBCTL_API_TOKEN", None)
    return subprocess.run(
        [str(BIN / "jobctl"), "serve", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ------------------------------------------------------------- 1. who may read


def test_a_request_naming_a_host_the_server_does_not_serve_is_refused(
    db_url: DatabaseUrl, engine: Engine
) -> None:
    """DNS rebinding: a page at evil.example whose name resolves to 127.0.0.1 reads
    /v1/jobs from the operator's own browser, whose requests name evil.example."""
    enqueue(engine, "greet", {"secret": "s3cr3t"})
    with served(db_url, token=None, args=("--allowed-host", "jobs.internal")) as (base, _):
        port = base.rsplit(":", 1)[1]
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
            refused = httpx.get(f"{base}/v1/jobs", headers={"Host": host}, timeout=10)
            assert refused.status_code == 400, host
            assert refused.headers["content-type"] == PROBLEM
            assert "s3cr3t" not in refused.text and "--allowed-host" in refused.json()["detail"]
            dashboard = httpx.get(f"{base}/", headers={"Host": host}, timeout=10)
            assert dashboard.status_code == 400, "the dashboard's pages as well"
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "jobs.internal"):
            answer = httpx.get(f"{base}/v1/jobs", headers={"Host": host}, timeout=10)
            assert answer.status_code == 200, host
        # Probes are asked by address, with whatever Host, and reveal nothing.
        probe = httpx.get(f"{base}/healthz", headers={"Host": "10.1.2.3:8080"}, timeout=10)
        assert probe.status_code == 200


def test_reads_without_a_token_stay_on_this_machine_unless_said_so(
    db_url: DatabaseUrl,
) -> None:
    port = free_port()
    refused = serve_once(db_url, ["--host", "0.0.0.0", "--port", str(port)], {})
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("jobctl serve: --host 0.0.0.0 is reachable from other machines")
    assert "JOBCTL_API_TOKEN" in line and "--allow-open-reads" in line
    with served(db_url, token=None, args=("--allow-open-reads",)) as (_, daemon):
        serving = daemon.wait_for_event("api.serving")
    assert serving["reads"].startswith("open: anyone who reaches the port")
    assert serving["token"] == "none (read-only)"
    with served(db_url) as (_, daemon):
        assert daemon.wait_for_event("api.serving")["reads"] == "need the token"


# ------------------------------------------------------------- 2. nesting


def test_a_deeply_nested_payload_is_refused_before_anything_is_written(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection
) -> None:
    with served(db_url) as (base, _):
        for depth in (101, 400, 5000):  # 5000: past what Python's json can even read
            body = '{"job_type":"greet","payload":' + "[" * depth + "]" * depth + "}"
            sent = httpx.post(
                f"{base}/v1/jobs",
                content=body,
                headers=BEARER | {"content-type": "application/json"},
                timeout=10,
            )
            assert sent.status_code == 422, (depth, sent.text[:300])
            assert sent.headers["content-type"] == PROBLEM
            assert sent.json()["detail"].startswith("payload"), sent.json()
        assert count_jobs(pg) == 0
        fits = httpx.post(
            f"{base}/v1/jobs",
            json={"job_type": "greet", "payload": nested(100)},
            headers=BEARER,
            timeout=10,
        )
        assert fits.status_code == 202, fits.text[:300]
    assert count_jobs(pg) == 1
    # Every producer: enqueue, enqueue_many (NewJob), schedules.
    with Session(engine) as session, session.begin():
        with pytest.raises(ValueError, match=r"payload nests .* 100 levels"):
            outbox.enqueue(session, "greet", nested(101))
        with pytest.raises(ValueError, match="payload nests"):
            outbox.enqueue_many(session, [NewJob("greet", {}), NewJob("greet", nested(300))])
        with pytest.raises(ValueError, match="payload nests"):
            outbox.schedule(session, "deep", "greet", nested(200), every=timedelta(hours=1))
    assert count_jobs(pg) == 1


def test_a_job_stored_deeply_nested_is_readable_everywhere(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection, tmp_path: Path
) -> None:
    """Written before enqueue bounded nesting (or by hand): 400 levels (past the
    API's serialiser) and 3000 (past Python's json)."""
    ids = {}
    for depth in (400, 3000):
        job_id = enqueue(engine, "greet", {})
        deep = "[" * depth + "]" * depth
        pg.execute(
            "UPDATE jobs SET payload = %s::jsonb, state = 'SUCCEEDED', attempt_count = 1,"
            " started_at = now(), finished_at = now(), result = %s::jsonb WHERE job_id = %s",
            (deep, deep, job_id),
        )
        ids[depth] = job_id
    with served(db_url) as (base, _):
        for depth, job_id in ids.items():
            got = httpx.get(f"{base}/v1/jobs/{job_id}", headers=BEARER, timeout=10)
            assert got.status_code == 200, (depth, got.text[:300])
            shown = got.json()
            assert shown["as_text"] == ["payload", "result"]
            assert shown["payload"] == "[" * depth + "]" * depth
            listed = httpx.get(f"{base}/v1/jobs", headers=BEARER, timeout=10)
            assert listed.status_code == 200
    for job_id in ids.values():
        done = jobctl("jobs", "show", str(job_id), url=db_url, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr and "JSON text" in done.stdout
        as_json = jobctl("jobs", "show", str(job_id), "--json", url=db_url, cwd=tmp_path)
        assert json.loads(as_json.stdout)["as_text"] == ["payload", "result"]


def test_an_unexpected_error_is_a_problem_document_not_text(db_url: DatabaseUrl, pg) -> None:
    # A consumer's counters written by hand 300 levels deep: the answer cannot be
    # serialised (a bug to fix, but the client must get a problem document).
    pg.execute(
        "INSERT INTO workers (worker_id, host, pid, queues, job_types, concurrency, prefetch,"
        " counts) VALUES ('w1', 'box', 1, '{mail}', '{greet}', 1, 1, %s::jsonb)",
        [json.dumps({"deep": nested(300)})],
    )
    with served(db_url) as (base, daemon):
        broken = httpx.get(f"{base}/v1/workers", headers=BEARER, timeout=10)
        assert broken.status_code == 500
        assert broken.headers["content-type"] == PROBLEM
        assert broken.json()["status"] == 500 and "api.unexpected_error" in broken.json()["detail"]
        assert broken.headers["x-content-type-options"] == "nosniff"
        logged = daemon.wait_for_event("api.unexpected_error")
    assert logged["path"] == "/v1/workers"


# ------------------------------------------------------------- 3. /readyz


def test_readiness_is_cached_and_says_where_and_why_only_with_the_token(
    db_url: DatabaseUrl,
) -> None:
    proxy = TcpProxy("127.0.0.1", 5672)
    try:
        amqp = f"amqp://guest:guest@127.0.0.1:{proxy.port}/"
        with served(db_url, amqp=amqp) as (base, daemon):
            started = time.monotonic()
            with httpx.Client(base_url=base, timeout=10) as client:
                answers = [client.get("/readyz") for _ in range(30)]
            elapsed = time.monotonic() - started
            assert {a.status_code for a in answers} == {200}
            # One check per 2 s window the probes span (on a loaded machine 30 of them
            # may take longer than one window), never one per probe.
            allowed = min(1 + math.ceil(elapsed / 2.0), 5)
            assert proxy.connections <= allowed, (
                f"{proxy.connections} connections for 30 probes in {elapsed:.1f} s"
            )
            public = answers[0].json()
            assert public == {
                "ready": True,
                "checks": [
                    {"service": "postgresql", "ok": True},
                    {"service": "rabbitmq", "ok": True},
                ],
            }
            proxy.down()
            deadline = time.monotonic() + 20
            while (down := httpx.get(f"{base}/readyz", timeout=10)).status_code != 503:
                assert time.monotonic() < deadline, "still ready"
                time.sleep(0.2)
            # No host, port, user or vhost for a caller without the token...
            assert str(proxy.port) not in down.text and "guest" not in down.text
            assert {c["service"]: c["ok"] for c in down.json()["checks"]} == {
                "postgresql": True,
                "rabbitmq": False,
            }
            # ...all of it with the token, and in the log.
            told = httpx.get(f"{base}/readyz", headers=BEARER, timeout=10).json()
            (rabbit,) = [c for c in told["checks"] if c["service"] == "rabbitmq"]
            assert rabbit["address"] == f"127.0.0.1:{proxy.port}" and rabbit["detail"]
            logged = daemon.wait_for_event("api.not_ready")
            assert logged["checks"][0]["address"] == f"127.0.0.1:{proxy.port}"
            wrong = httpx.get(
                f"{base}/readyz", headers={"Authorization": "Bearer nope"}, timeout=10
            )
            assert wrong.status_code == 401
    finally:
        proxy.close()


# ------------------------------------------------------------- 4. tokens


def test_a_weak_token_is_refused_at_start_with_how_to_make_one(db_url: DatabaseUrl) -> None:
    for weak in ("jobs-demo-token", "hunter2", "a" * 60, "abcabcabcabcabcabcabcabcabcabcabc"):
        refused = serve_once(db_url, ["--port", str(free_port())], {"JOBCTL_API_TOKEN": weak})
        assert refused.returncode == 2, (weak, refused.stderr)
        (line,) = refused.stderr.strip().splitlines()
        assert "JOBCTL_API_TOKEN is too weak" in line and "128" in line
        assert "secrets.token_urlsafe(32)" in line
        assert weak not in line


def test_a_long_but_repetitive_token_is_refused_at_start(db_url: DatabaseUrl) -> None:
    # Long enough for the per-character estimate alone, but a repeat or a sequence.
    for weak in ("0123456789" * 4, "abcdefghij" * 3):
        refused = serve_once(db_url, ["--port", str(free_port())], {"JOBCTL_API_TOKEN": weak})
        assert refused.returncode == 2, (weak, refused.stderr)
        (line,) = refused.stderr.strip().splitlines()
        assert "JOBCTL_API_TOKEN is too weak" in line and "128" in line
        assert "secrets.token_urlsafe(32)" in line
        assert weak not in line


def test_a_token_file_is_read_again_when_it_changes(db_url: DatabaseUrl, tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    new = "n3w-" + TOKEN[4:]
    with served(db_url, token=None, JOBCTL_API_TOKEN_FILE=str(path)) as (base, daemon):
        old = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(f"{base}/v1/jobs", headers=old, timeout=10).status_code == 200
        path.write_text(new)
        assert httpx.get(f"{base}/v1/jobs", headers=old, timeout=10).status_code == 401
        fresh = {"Authorization": f"Bearer {new}"}
        assert httpx.get(f"{base}/v1/jobs", headers=fresh, timeout=10).status_code == 200
        daemon.wait_for_event("api.token_changed")
        # A file rewritten with a weak token fails closed: no token works, none is
        # needed less, until it is fixed.
        path.write_text("weak")
        assert httpx.get(f"{base}/v1/jobs", headers=fresh, timeout=10).status_code == 401
        nothing = httpx.get(f"{base}/v1/jobs", timeout=10)
        assert nothing.status_code == 401
        assert "too weak" in daemon.wait_for_event("api.token_unusable")["detail"]
        path.write_text(new)
        assert httpx.get(f"{base}/v1/jobs", headers=fresh, timeout=10).status_code == 200
    assert TOKEN not in daemon.text() and new not in daemon.text()


@contextmanager
def signed_in(base: str, token: str = TOKEN) -> Iterator[httpx.Client]:
    """A client holding a dashboard session opened with ``token``."""
    with httpx.Client(base_url=base, timeout=10) as client:
        answer = client.post("/login", data={"token": token}, headers={"Origin": base})
        assert answer.status_code == 303, answer.text[:500]
        assert client.get("/jobs").status_code == 200
        yield client


def sent_to_sign_in(client: httpx.Client) -> bool:
    answer = client.get("/jobs")
    return answer.status_code == 303 and "/login" in answer.headers["location"]


def events(daemon: Daemon, name: str) -> list[dict[str, Any]]:
    return [e for e in daemon.events() if e.get("event") == name]


def session_count(pg: psycopg.Connection) -> int:
    row = pg.execute("SELECT count(*) FROM dashboard_sessions").fetchone()
    assert row is not None
    return int(row[0])


def test_a_changed_token_ends_the_old_ones_sessions_for_good(
    db_url: DatabaseUrl, tmp_path: Path, pg: psycopg.Connection
) -> None:
    """A -> B -> A: the sessions opened while A was the token stay ended, whether a
    request came while B was the token or not."""
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    # A is written with a newline, B without: each rewrite changes the file's size,
    # so the server sees it even within one tick of the file system's clock.
    other = "n3w-" + TOKEN[4:]
    with served(db_url, token=None, JOBCTL_API_TOKEN_FILE=str(path)) as (base, daemon):
        # A request while B is the token.
        with signed_in(base) as client:
            path.write_text(other)
            assert sent_to_sign_in(client)
            path.write_text(TOKEN + "\n")
            assert sent_to_sign_in(client), "the old token's session came back"
        # No request while B is the token: the server notices the change by itself.
        with signed_in(base) as client, signed_in(base) as twin:
            path.write_text(other)
            deadline = time.monotonic() + 20
            while len(ended := events(daemon, "dashboard.sessions_ended")) < 2:
                assert time.monotonic() < deadline, daemon.text()[-4000:]
                time.sleep(0.05)
            assert [e["sessions"] for e in ended] == [1, 2]
            path.write_text(TOKEN + "\n")
            assert sent_to_sign_in(client) and sent_to_sign_in(twin)
        # Sessions of the current token are left alone.
        with signed_in(base) as client:
            assert not sent_to_sign_in(client)
            digests = [r[0] for r in pg.execute("SELECT token_digest FROM dashboard_sessions")]
            assert len(digests) == 1 and TOKEN not in digests[0]
    assert TOKEN not in daemon.text() and other not in daemon.text()


def test_a_restart_with_another_token_ends_the_sessions_of_the_old_one(
    db_url: DatabaseUrl, pg: psycopg.Connection
) -> None:
    other = "n3w-" + TOKEN[4:]
    with served(db_url) as (base, _), signed_in(base) as client:
        cookies = httpx.Cookies(client.cookies)
    assert session_count(pg) == 1
    # Nobody signs in nor looks while the other token is the server's.
    with served(db_url, token=other):
        deadline = time.monotonic() + 20
        while session_count(pg):
            assert time.monotonic() < deadline, "the old token's session is still there"
            time.sleep(0.05)
    with served(db_url) as (base, _), httpx.Client(base_url=base, cookies=cookies) as client:
        assert sent_to_sign_in(client)


def test_wrong_tokens_are_limited_per_client(db_url: DatabaseUrl) -> None:
    with served(db_url) as (base, daemon):
        wrong = {"Authorization": "Bearer " + "x" * 43}
        answers = [httpx.get(f"{base}/v1/jobs", headers=wrong, timeout=10) for _ in range(10)]
        assert {a.status_code for a in answers} == {401}
        limited = httpx.get(f"{base}/v1/jobs", headers=wrong, timeout=10)
        assert limited.status_code == 429
        assert 1 <= int(limited.headers["Retry-After"]) <= 60
        # The right token is refused too while the client is over its limit: a
        # guess that happened to be right must not get in.
        right = httpx.get(f"{base}/v1/jobs", headers=BEARER, timeout=10)
        assert right.status_code == 429
        # The sign-in form counts the same way.
        form = httpx.post(
            f"{base}/login", data={"token": TOKEN}, headers={"Origin": base}, timeout=10
        )
        assert form.status_code == 429 and "too many wrong tokens" in form.text
        # Probes and the openly readable document are not counted.
        assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
    assert len([e for e in daemon.events() if e.get("event") == "api.wrong_token"]) == 10


# ------------------------------------------------------------- 5. behind a proxy


async def test_behind_a_tls_proxy_on_a_path_cookies_are_secure_and_urls_mounted(
    db_url: DatabaseUrl,
) -> None:
    public = "https://jobs.example.com/ops"
    with served(db_url, args=("--public-url", public)) as (base, _):
        async with (
            reverse_proxy(base, prefix="/ops", proto="https") as proxy,
            httpx.AsyncClient(base_url=proxy + "/ops", timeout=10) as client,
        ):
            sent = await client.post("/v1/jobs", json={"job_type": "greet"}, headers=BEARER)
            assert sent.status_code == 202, sent.text
            assert sent.headers["Location"] == f"/ops/v1/jobs/{sent.json()['id']}"
            assert sent.headers["Strict-Transport-Security"].startswith("max-age=")
            # The browser says the page's origin: the public one.
            signed = await client.post(
                "/login",
                data={"token": TOKEN, "next": "/ops/jobs"},
                headers={"Origin": "https://jobs.example.com"},
            )
            assert signed.status_code == 303, signed.text[:500]
            assert signed.headers["location"] == "/ops/jobs"
            cookie = signed.headers["set-cookie"]
            assert "Secure" in cookie and "Path=/ops" in cookie and "HttpOnly" in cookie
            # Redirects to sign in stay under the mount point.
            async with httpx.AsyncClient(base_url=proxy + "/ops") as stranger:
                anonymous = await stranger.get("/failed")
            assert anonymous.status_code == 303
            assert anonymous.headers["location"].startswith("/ops/login?next=%2Fops%2Ffailed")
        # Another site is still another site.
        forged = httpx.post(
            f"{base}/login",
            data={"token": TOKEN},
            headers={"Origin": "https://evil.example"},
            timeout=10,
        )
        assert forged.status_code == 403


# ------------------------------------------------------------- 6. terminal escapes


def test_job_data_cannot_rewrite_the_terminal(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection, tmp_path: Path
) -> None:
    job_id = enqueue(engine, "greet", {"to": "\x1b]0;owned\x07"})
    evil = "boom\x1b[2J\x1b[1;1H\rSUCCEEDED\u202e"
    pg.execute(
        "UPDATE jobs SET job_type = %s, state = 'FAILED', attempt_count = 1, max_attempts = 1,"
        " started_at = now(), finished_at = now(), last_error_code = %s,"
        " last_error_message = %s WHERE job_id = %s",
        ("evil\x1b[31m", "E\x9b1m", evil, job_id),
    )
    pg.execute(
        "INSERT INTO job_attempts (job_id, attempt, lease_generation, worker, ready_at,"
        " started_at, finished_at, outcome, error_code, error_message, traceback)"
        " VALUES (%s, 1, 1, 'w\x1b[8m', now(), now(), now(), 'FAILED', 'E', %s, %s)",
        (job_id, evil, "Traceback (most recent call last):\n  \x1b[2Jboom\nE: x"),
    )
    for args in (
        ("jobs", "show", str(job_id)),
        ("jobs", "list"),
        ("jobs", "list", "--state", "FAILED"),
    ):
        done = jobctl(*args, url=db_url, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        for raw in ("\x1b", "\x07", "\x9b", "\u202e", "\r"):
            assert raw not in done.stdout, (args, raw)
        assert "\\x1b" in done.stdout
    shown = jobctl("jobs", "show", str(job_id), url=db_url, cwd=tmp_path).stdout
    assert "boom\\x1b[2J\\x1b[1;1H\\x0dSUCCEEDED\\u202e" in shown
    assert "traceback of attempt 1:" in shown
    # With --json, JSON's own escapes; the value is intact.
    data = json.loads(
        jobctl("jobs", "show", str(job_id), "--json", url=db_url, cwd=tmp_path).stdout
    )
    assert data["last_error"]["message"] == evil


# ------------------------------------------------------------- 7. names


def test_names_are_matched_whole_everywhere(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection, tmp_path: Path
) -> None:
    with Session(engine) as session, session.begin():
        for bad in ("mail\n", "mail\r", "ma\til"):
            with pytest.raises(ValueError, match="queue"):
                outbox.enqueue(session, "greet", {}, queue=bad)
        with pytest.raises(ValueError, match="job_type must not contain control"):
            outbox.enqueue(session, "greet\n", {})
        with pytest.raises(ValueError, match="tenant"):
            outbox.enqueue(session, "greet", {}, tenant="acme\n")
    assert count_jobs(pg) == 0
    paused = jobctl("queues", "pause", "mail\n", "--create", url=db_url, cwd=tmp_path)
    assert paused.returncode == 2 and "Traceback" not in paused.stderr
    (line,) = paused.stderr.strip().splitlines()
    assert line.startswith("jobctl queues pause: queue must not contain control characters")
    with served(db_url) as (base, _):
        refused = httpx.post(
            f"{base}/v1/jobs", json={"job_type": "greet\n"}, headers=BEARER, timeout=10
        )
        assert refused.status_code == 422 and refused.json()["detail"].startswith("job_type")
    assert pg.execute("SELECT count(*) FROM queues").fetchone() == (0,)


def test_a_schedule_named_with_a_slash_is_steered_over_http(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection
) -> None:
    with Session(engine) as session, session.begin():
        outbox.schedule(session, "reports/nightly", "render", {}, every=timedelta(hours=1))
    with served(db_url) as (base, _):
        for path, paused in (
            ("/v1/schedules/reports%2Fnightly/pause", True),
            ("/v1/schedules/reports/nightly/resume", False),
        ):
            answer = httpx.post(base + path, headers=BEARER, timeout=10)
            assert answer.status_code == 200, (path, answer.text)
            assert (answer.json()["name"], answer.json()["paused"]) == ("reports/nightly", paused)
        fired = httpx.post(
            f"{base}/v1/schedules/reports%2Fnightly/trigger", headers=BEARER, timeout=10
        )
        assert fired.status_code == 202
        missing = httpx.post(f"{base}/v1/schedules/reports/daily/pause", headers=BEARER, timeout=10)
        assert missing.status_code == 404
    assert pg.execute("SELECT count(*) FROM jobs WHERE job_type = 'render'").fetchone() == (1,)


# ------------------------------------------------------------- 8. idempotency


def test_idempotency_keys_have_their_own_namespace_and_refuse_another_body(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection
) -> None:
    # A producer's dedup key that looks like what the API used to store.
    producer = enqueue(engine, "bill", {"from": "producer"}, dedup_key="api:k1")
    with served(db_url) as (base, _):
        key = BEARER | {"Idempotency-Key": "k1"}
        first = httpx.post(
            f"{base}/v1/jobs",
            json={"job_type": "bill", "payload": {"n": 1}},
            headers=key,
            timeout=10,
        )
        assert first.status_code == 202 and first.json()["id"] != str(producer)
        again = httpx.post(
            f"{base}/v1/jobs",
            json={"job_type": "bill", "payload": {"n": 1}},
            headers=key,
            timeout=10,
        )
        assert (again.status_code, again.json()["id"]) == (202, first.json()["id"])
        assert again.headers["Idempotent-Replayed"] == "true"
        for other in ({"job_type": "ship", "payload": {"n": 1}}, {"job_type": "bill"}):
            refused = httpx.post(f"{base}/v1/jobs", json=other, headers=key, timeout=10)
            assert refused.status_code == 422, refused.text
            assert "Idempotency-Key" in refused.json()["detail"]
        # The README's dedup_key body field: outbox.enqueue's dedup key.
        deduped = [
            httpx.post(
                f"{base}/v1/jobs",
                json={"job_type": "bill", "payload": {"n": n}, "dedup_key": "order-7"},
                headers=BEARER,
                timeout=10,
            )
            for n in (1, 2)
        ]
        assert [d.status_code for d in deduped] == [202, 200]
        assert deduped[0].json()["id"] == deduped[1].json()["id"]
        assert deduped[1].json()["payload"] == {"n": 1}, "the job there already"
        mine = httpx.post(
            f"{base}/v1/jobs",
            json={"job_type": "bill", "dedup_key": "api:k1"},
            headers=BEARER,
            timeout=10,
        )
        assert (mine.status_code, mine.json()["id"]) == (200, str(producer))
    assert count_jobs(pg) == 3


# ------------------------------------------------------------- 9. bulk retry


def fail(pg: psycopg.Connection, job_id: uuid.UUID, state: str = "FAILED") -> None:
    pg.execute(
        "UPDATE jobs SET state = %s, attempt_count = 1, max_attempts = 1, started_at = now(),"
        " finished_at = clock_timestamp(), last_error_code = 'Boom' WHERE job_id = %s",
        (state, job_id),
    )


def test_a_bulk_retry_needs_a_filter_or_all_and_leaves_cancelled_jobs(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection, tmp_path: Path
) -> None:
    failed = [enqueue(engine, "greet", {}, queue=q) for q in ("a", "b")]
    cancelled = enqueue(engine, "greet", {}, queue="a")
    for job_id in failed:
        fail(pg, job_id)
    fail(pg, cancelled, "CANCELLED")
    with served(db_url) as (base, _):
        empty = httpx.post(f"{base}/v1/jobs/retry", json={}, headers=BEARER, timeout=10)
        assert empty.status_code == 422 and "all" in empty.json()["detail"]
        assert job(pg, failed[0])["state"] == "FAILED"
        both = httpx.post(
            f"{base}/v1/jobs/retry", json={"all": True, "queue": "a"}, headers=BEARER, timeout=10
        )
        assert both.status_code == 422
        everything = httpx.post(
            f"{base}/v1/jobs/retry", json={"all": True, "dry_run": True}, headers=BEARER, timeout=10
        )
        assert everything.json()["matched"] == 2, "the failed ones, not the cancelled one"
        in_a = httpx.post(f"{base}/v1/jobs/retry", json={"queue": "a"}, headers=BEARER, timeout=10)
        assert in_a.json()["matched"] == 1
        assert (job(pg, failed[0])["state"], job(pg, cancelled)["state"]) == ("QUEUED", "CANCELLED")
        asked = httpx.post(
            f"{base}/v1/jobs/retry",
            json={"queue": "a", "include_cancelled": True},
            headers=BEARER,
            timeout=10,
        )
        assert asked.json()["matched"] == 1 and job(pg, cancelled)["state"] == "QUEUED"
        # By ids, as the README says.
        by_ids = httpx.post(
            f"{base}/v1/jobs/retry",
            json={"ids": [str(failed[1]), str(uuid.uuid4())]},
            headers=BEARER,
            timeout=10,
        )
        assert by_ids.status_code == 200, by_ids.text
        assert by_ids.json()["matched"] == 1
        assert [j["applied"] for j in by_ids.json()["jobs"]] == [True, False]
    assert job(pg, failed[1])["state"] == "QUEUED"
    fail(pg, failed[0])
    bare = jobctl("jobs", "retry", url=db_url, cwd=tmp_path)
    assert bare.returncode == 2 and "--all" in bare.stderr
    all_of_them = jobctl("jobs", "retry", "--all", "--dry-run", url=db_url, cwd=tmp_path)
    assert all_of_them.stdout.startswith("would retry 1 failed job(s) in every queue")


# ------------------------------------------------------------- 11. HTTP


def test_http_answers_say_the_right_thing(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection
) -> None:
    waiting = enqueue(engine, "greet", {"secret": "s"})
    with served(db_url) as (base, _):
        # 401 before anything is said of the body.
        for body in ("{not json", '{"job_type": ""}'):
            anonymous = httpx.post(
                f"{base}/v1/jobs",
                content=body,
                headers={"content-type": "application/json"},
                timeout=10,
            )
            assert anonymous.status_code == 401, body
            assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
        malformed = httpx.post(
            f"{base}/v1/jobs",
            content="{not json",
            headers=BEARER | {"content-type": "application/json"},
            timeout=10,
        )
        assert malformed.status_code == 400 and "not valid JSON" in malformed.json()["detail"]
        # An integer of more digits than Python converts: a 400 too, not a 500 that
        # also dropped the connection.
        huge = httpx.post(
            f"{base}/v1/jobs",
            content='{"job_type": "x", "payload": {"n": ' + "9" * 5000 + "}}",
            headers=BEARER | {"content-type": "application/json"},
            timeout=10,
        )
        assert huge.status_code == 400 and "not valid JSON" in huge.json()["detail"]
        assert "digits" in huge.json()["detail"]
        for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = BEARER | ({"content-type": content_type} if content_type else {})
            other = httpx.post(
                f"{base}/v1/jobs", content='{"job_type": "x"}', headers=headers, timeout=10
            )
            assert other.status_code == 415, content_type
            assert other.headers["content-type"] == PROBLEM
        created = httpx.put(f"{base}/v1/tenants/acme", json={}, headers=BEARER, timeout=10)
        replaced = httpx.put(
            f"{base}/v1/tenants/acme", json={"max_running": 3}, headers=BEARER, timeout=10
        )
        assert (created.status_code, replaced.status_code) == (201, 200)
        got = httpx.get(f"{base}/v1/jobs/{waiting}", headers=BEARER, timeout=10)
        for answer in (got, created, malformed, httpx.get(f"{base}/openapi.json", timeout=10)):
            assert answer.headers["Cache-Control"] == "no-store"
            assert answer.headers["X-Content-Type-Options"] == "nosniff"
            assert answer.headers["X-Frame-Options"] == "DENY"
            assert "frame-ancestors 'none'" in answer.headers["Content-Security-Policy"]
        static = httpx.get(f"{base}/static/dashboard.css", timeout=10)
        assert static.status_code == 200 and "Cache-Control" not in static.headers
        # The dashboard's 401 challenges too.
        page = httpx.post(f"{base}/jobs/{waiting}/cancel", headers={"Origin": base}, timeout=10)
        assert page.status_code == 401 and "WWW-Authenticate" in page.headers
    assert count_jobs(pg) == 1


# ------------------------------------------------------------- 12. CLI errors


def test_cli_errors_are_one_line_naming_what_to_fix(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection, tmp_path: Path
) -> None:
    def one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
        assert done.returncode == code, (done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
        lines = [line for line in done.stderr.splitlines() if ": warning: " not in line]
        assert len(lines) == 1, done.stderr
        return lines[0]

    for span in ("²h", "1000000d", "1e9d", "nan", "-5m"):
        done = jobctl(
            "jobs", "retry", "--filter", f"finished_after={span}", url=db_url, cwd=tmp_path
        )
        assert f"--filter finished_after={span}" in one_line(done, 2)

    down = "postgresql://root:pw@127.0.0.1:1/jobs"
    checked = jobctl("check", "--database-url", down, url=db_url, cwd=tmp_path)
    assert "cannot reach PostgreSQL at 127.0.0.1:1" in one_line(checked, 1)
    assert "--database-url holds a password" in checked.stderr

    # A row lock held past jobctl's lock_timeout: said as such, not as an outage.
    queued = enqueue(engine, "greet", {}, queue="mail")
    with psycopg.connect(db_url.conninfo) as holder:
        holder.execute("SELECT 1 FROM jobs WHERE job_id = %s FOR UPDATE", [queued])
        locked = jobctl("jobs", "cancel", str(queued), url=db_url, cwd=tmp_path)
        holder.rollback()
    line = one_line(locked, 1)
    assert "locked by another session" in line and "lock_timeout" in line
    assert "cannot reach" not in line

    # A statement cancelled (as statement_timeout does): said as such.
    with psycopg.connect(db_url.conninfo) as holder:
        holder.execute("LOCK TABLE workers IN ACCESS EXCLUSIVE MODE")
        running = subprocess.Popen(
            [str(BIN / "jobctl"), "workers"],
            env=jobctl_env(db_url),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        with psycopg.connect(db_url.conninfo, autocommit=True) as admin:
            deadline = time.monotonic() + 20
            while not admin.execute(
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'jobctl' AND wait_event_type = 'Lock'"
                # This test's jobctl only, not one of a test running beside it.
                " AND datname = current_database()"
            ).fetchall():
                assert time.monotonic() < deadline, "jobctl never waited for the lock"
                time.sleep(0.05)
        _, stderr = running.communicate(timeout=30)
        holder.rollback()
    done = subprocess.CompletedProcess(running.args, running.returncode, "", stderr)
    line = one_line(done, 1)
    assert "cancelled the statement" in line and "statement_timeout" in line


# ------------------------------------------------------------- 13. a new user's run


def test_pausing_a_queue_nothing_uses_is_refused_and_leaves_nothing(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection, tmp_path: Path
) -> None:
    enqueue(engine, "greet", {}, queue="mail")
    typo = jobctl("queues", "pause", "mial", url=db_url, cwd=tmp_path)
    assert typo.returncode == 2, typo.stderr
    assert "no queue 'mial'" in typo.stderr and "--create" in typo.stderr
    assert pg.execute("SELECT count(*) FROM queues").fetchone() == (0,)
    with served(db_url) as (base, _):
        api = httpx.post(f"{base}/v1/queues/mial/pause", headers=BEARER, timeout=10)
        assert api.status_code == 404 and api.headers["content-type"] == PROBLEM
        ahead = httpx.post(f"{base}/v1/queues/later/pause?create=true", headers=BEARER, timeout=10)
        assert ahead.status_code == 200 and ahead.json()["paused"] is True
        shown = {
            q["queue"] for q in httpx.get(f"{base}/v1/queues", headers=BEARER).json()["queues"]
        }
        assert shown == {"mail", "later"}
        resumed = httpx.post(f"{base}/v1/queues/later/resume", headers=BEARER, timeout=10)
        assert resumed.json()["resumed_by"].startswith("api (")
        assert resumed.json()["paused_by"].startswith("api ("), "who paused it last stays"
        shown = {
            q["queue"] for q in httpx.get(f"{base}/v1/queues", headers=BEARER).json()["queues"]
        }
        assert shown == {"mail"}, "a resumed queue with nothing in it is gone from stats"
    stats = json.loads(jobctl("stats", "--json", url=db_url, cwd=tmp_path).stdout)
    assert [q["queue"] for q in stats["queues"]] == ["mail"]


def test_jobs_show_says_an_error_once_and_shows_its_traceback(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection, tmp_path: Path
) -> None:
    job_id = enqueue(engine, "resize", {})
    pg.execute(
        "UPDATE jobs SET state = 'FAILED', attempt_count = 1, max_attempts = 1,"
        " started_at = now(), finished_at = now(), last_error_code = 'ValueError',"
        " last_error_message = 'ValueError: image too large' WHERE job_id = %s",
        [job_id],
    )
    trace = (
        "Traceback (most recent call last):\n"
        '  File "app.py", line 9, in resize\n'
        "ValueError: image too large\n"
    )
    pg.execute(
        "INSERT INTO job_attempts (job_id, attempt, lease_generation, worker, ready_at,"
        " started_at, finished_at, outcome, error_code, error_message, traceback)"
        " VALUES (%s, 1, 1, 'w1', now(), now(), now(), 'FAILED', 'ValueError',"
        " 'ValueError: image too large', %s)",
        (job_id, trace),
    )
    shown = jobctl("jobs", "show", str(job_id), url=db_url, cwd=tmp_path).stdout
    assert "ValueError: ValueError" not in shown
    assert "ValueError: image too large" in shown
    assert 'File "app.py", line 9, in resize' in shown


def test_metrics_need_the_token_unless_served_openly(db_url: DatabaseUrl) -> None:
    with served(db_url) as (base, _):
        assert httpx.get(f"{base}/metrics", timeout=10).status_code == 401
        scraped = httpx.get(f"{base}/metrics", headers=BEARER, timeout=10)
        assert scraped.status_code == 200 and "hybrid_jobs_collector_rounds_total" in scraped.text
    with served(db_url, args=("--open-metrics",)) as (base, daemon):
        assert httpx.get(f"{base}/metrics", timeout=10).status_code == 200
        assert httpx.get(f"{base}/v1/jobs", timeout=10).status_code == 401, "reads still need it"
        assert daemon.wait_for_event("api.serving")["metrics"] == "open"


def test_a_busy_port_is_one_line(db_url: DatabaseUrl) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = serve_once(db_url, ["--port", str(port)], {"JOBCTL_API_TOKEN": TOKEN})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"jobctl serve: --port {port}: 127.0.0.1:{port} is in use by another process;"
        " choose another --port"
    ]


def test_metrics_bound_their_queue_label(db_url: DatabaseUrl, engine: Engine) -> None:
    for queue in ("a1", "a2", "a3", "a4"):
        enqueue(engine, "greet", {}, queue=queue)
    with served(db_url, args=("--metrics-max-queues", "2")) as (base, _):
        deadline = time.monotonic() + 30
        while "hybrid_jobs_jobs{" not in (
            text := httpx.get(f"{base}/metrics", headers=BEARER, timeout=10).text
        ):
            assert time.monotonic() < deadline, "no collection"
            time.sleep(0.1)
    assert 'hybrid_jobs_jobs{queue="a1",state="QUEUED"} 1.0' in text
    assert 'hybrid_jobs_jobs{queue="a2",state="QUEUED"} 1.0' in text
    assert 'hybrid_jobs_jobs{queue="_other",state="QUEUED"} 2.0' in text
    assert 'queue="a3"' not in text and 'queue="a4"' not in text
