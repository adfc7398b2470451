"""What a user meets when starting `relay` or `consumer`: a setting that retrying cannot
fix ends the process within seconds, with one line naming the setting and never the
password; a service that is merely down is waited for, saying so every few seconds,
and the wait ends cleanly on SIGTERM or when the service comes up."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import pytest

from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema.revisions import scripts
from tests.conftest import migrate
from tests.support.broker import rabbitmq_account
from tests.support.cluster import password_postgres
from tests.support.processes import BIN, ROOT, Daemon, running
from tests.support.proxy import TcpProxy

APP = ["--app", "tests.apps.basic"]
DAEMONS = {"relay": [], "consumer": APP}
SECRET = "hunter2"  # in every URL below; must never be printed
# The promise: a waiting daemon says so at most every 5 s (timestamps are to the ms).
QUIET_S = 4.9


@pytest.fixture(scope="module")
def account() -> Iterator[tuple[str, str, str]]:
    with rabbitmq_account() as found:
        yield found


HEAD = scripts().get_current_head()


def pg_url(dbname: str, *, user: str = "root", port: int = 5432) -> str:
    # Trust authentication ignores the password: it is there to be kept secret.
    return f"postgresql://{user}:pg-{SECRET}@127.0.0.1:{port}/{dbname}"


def start_and_exit(
    command: str, env: dict[str, str], *args: str, timeout: float = 30
) -> tuple[int, list[str], float]:
    """Run a daemon that is expected to exit: status, output lines, seconds taken."""
    started = time.monotonic()
    done = subprocess.run(
        [str(BIN / command), *DAEMONS[command], *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, (done.stdout + done.stderr).splitlines(), time.monotonic() - started


def assert_refused(command: str, env: dict[str, str], expected: str, *args: str) -> None:
    status, lines, took = start_and_exit(command, env, *args)
    assert status == 2, lines
    assert lines == [f"{command}: {expected}"]
    assert took < 15, f"took {took:.1f}s to say so"
    assert SECRET not in "\n".join(lines)


@pytest.mark.parametrize("command", DAEMONS)
def test_missing_database(command: str, env: dict[str, str]) -> None:
    name = f"hj_missing_{uuid.uuid4().hex[:8]}"
    env["DATABASE_URL"] = pg_url(name)
    assert_refused(command, env, f'DATABASE_URL: database "{name}" does not exist')


def test_unknown_role(env: dict[str, str], db_url: DatabaseUrl) -> None:
    role = f"ghost_{uuid.uuid4().hex[:8]}"
    env["DATABASE_URL"] = pg_url(db_url.dbname, user=role)
    assert_refused("relay", env, f'DATABASE_URL: role "{role}" does not exist')


def test_refused_postgres_password(env: dict[str, str]) -> None:
    with password_postgres() as cluster:
        env["DATABASE_URL"] = cluster.url(password=f"pg-wrong-{SECRET}")
        assert_refused(
            "relay", env, f'DATABASE_URL: password authentication failed for user "{cluster.user}"'
        )
        # The right password gets past the login, to the next check: this server
        # has no jobs table.
        env["DATABASE_URL"] = cluster.url()
        status, lines, _ = start_and_exit("relay", env)
        assert status == 2
        assert len(lines) == 1 and "has no jobs table" in lines[0], lines
        assert cluster.password not in lines[0]


@pytest.mark.parametrize("command", DAEMONS)
def test_refused_rabbitmq_password(
    command: str, env: dict[str, str], account: tuple[str, str, str]
) -> None:
    user, _, vhost = account
    env["AMQP_URL"] = f"amqp://{user}:mq-{SECRET}@127.0.0.1:5672/{vhost}"
    assert_refused(
        command,
        env,
        f'AMQP_URL: RabbitMQ refused the login of user "{user}": wrong user or password',
    )


@pytest.mark.parametrize("command", DAEMONS)
def test_unknown_vhost(command: str, env: dict[str, str]) -> None:
    vhost = f"hj_missing_{uuid.uuid4().hex[:8]}"
    # RabbitMQ checks the login before the vhost: guest's real password, then.
    env["AMQP_URL"] = f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
    assert_refused(
        command,
        env,
        f'AMQP_URL: RabbitMQ refused virtual host "{vhost}": it does not exist, or user '
        '"guest" has no permissions on it',
    )


def test_vhost_without_permissions(env: dict[str, str], account: tuple[str, str, str]) -> None:
    user, password, _ = account
    env["AMQP_URL"] = f"amqp://{user}:{password}@127.0.0.1:5672/"
    status, lines, _ = start_and_exit("relay", env)
    assert status == 2
    assert lines == [
        f'relay: AMQP_URL: RabbitMQ refused virtual host "/": it does not exist, or user '
        f'"{user}" has no permissions on it'
    ]
    assert password not in lines[0]


def test_an_account_with_a_password_works_and_stays_secret(
    env: dict[str, str], account: tuple[str, str, str]
) -> None:
    """The control for the refusals above: the same account, right password, starts."""
    user, password, vhost = account
    env["AMQP_URL"] = f"amqp://{user}:{password}@127.0.0.1:5672/{vhost}"
    with running("relay", [], env, "relay.started") as relay:
        ready = relay.wait_for_event("relay.services_ready")
    assert f"(schema {HEAD})" in ready["postgres"]
    assert password not in relay.text()
    assert "pg-" + SECRET not in relay.text()


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("DATABASE_URL", pg_url("jobs", port=70000), "DATABASE_URL has an invalid port"),
        ("DATABASE_URL", pg_url("jobs", port=0), "DATABASE_URL has an invalid port"),
        ("AMQP_URL", f"amqp://guest:{SECRET}@127.0.0.1:0/", "AMQP_URL has an invalid port"),
        ("AMQP_URL", f"amqp://guest:{SECRET}@127.0.0.1:99999/", "AMQP_URL has an invalid port"),
    ],
)
def test_port_out_of_range(env: dict[str, str], variable: str, value: str, expected: str) -> None:
    env[variable] = value
    assert_refused("relay", env, f"{expected} (must be a number 1-65535)")


@pytest.mark.parametrize("command", DAEMONS)
def test_unmigrated_database_says_run_jobctl_migrate(
    command: str, env: dict[str, str], empty_db_url: DatabaseUrl
) -> None:
    env["DATABASE_URL"] = empty_db_url.conninfo
    assert_refused(
        command,
        env,
        f'DATABASE_URL: database "{empty_db_url.dbname}" has no jobs table (not migrated): '
        "run `jobctl migrate`",
    )


def test_database_behind_this_release_says_run_jobctl_migrate(
    env: dict[str, str], empty_db_url: DatabaseUrl
) -> None:
    migrate(empty_db_url, "0001")
    env["DATABASE_URL"] = empty_db_url.conninfo
    assert_refused(
        "relay",
        env,
        f'DATABASE_URL: database "{empty_db_url.dbname}" is at migration 0001, this version '
        f"needs {HEAD}: run `jobctl migrate`",
    )


def test_the_error_names_the_setting_the_url_came_from(env: dict[str, str], tmp_path: Path) -> None:
    name = f"hj_missing_{uuid.uuid4().hex[:8]}"
    secret_file = tmp_path / "database_url"
    secret_file.write_text(pg_url(name))
    from_file = {k: v for k, v in env.items() if k != "DATABASE_URL"}
    from_file["DATABASE_URL_FILE"] = str(secret_file)
    assert_refused("relay", from_file, f'DATABASE_URL_FILE: database "{name}" does not exist')

    status, lines, _ = start_and_exit("relay", env, "--database-url", pg_url(name))
    assert status == 2
    assert lines[-1] == f'relay: --database-url: database "{name}" does not exist'
    assert SECRET not in "\n".join(lines)


def test_unknown_host(env: dict[str, str]) -> None:
    host = "no-such-host.invalid"
    try:
        socket.getaddrinfo(host, 5432)
    except socket.gaierror as exc:
        if exc.errno != socket.EAI_NONAME:
            pytest.skip(f"this machine's resolver answers {exc}, not 'no such name'")
    env["DATABASE_URL"] = f"postgresql://root:pg-{SECRET}@{host}:5432/jobs"
    assert_refused("relay", env, f'DATABASE_URL: host "{host}" not found (no such name in DNS)')


def _waiting_lines(daemon: Daemon, event: str, count: int, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in daemon.events() if e.get("event") == event]
        if len(found) >= count:
            return found
        assert daemon.proc.poll() is None, daemon.text()
        assert time.monotonic() < deadline, f"{len(found)} {event} in {timeout}s:\n{daemon.text()}"
        time.sleep(0.1)


def _gaps(events: list[dict]) -> list[float]:
    times = [datetime.fromisoformat(e["ts"]).timestamp() for e in events]
    return [b - a for a, b in pairwise(times)]


def test_postgres_down_is_waited_for_quietly_then_used(
    env: dict[str, str], db_url: DatabaseUrl
) -> None:
    proxy = TcpProxy("127.0.0.1", 5432)
    try:
        proxy.down()
        env["DATABASE_URL"] = pg_url(db_url.dbname, port=proxy.port)
        relay = Daemon("relay", [], env)
        try:
            waits = _waiting_lines(relay, "relay.waiting_for_postgres", 2, timeout=30)
            # Rate-limited: many attempts, one line every 5 s at most.
            assert all(gap >= QUIET_S for gap in _gaps(waits)), waits
            assert waits[-1]["attempts"] > 3
            assert waits[0]["detail"] == (
                f"waiting for PostgreSQL at 127.0.0.1:{proxy.port}: connection refused; "
                "is it running?"
            )
            lines = relay.text().splitlines()
            assert len(lines) == 2, "nothing but the waiting lines:\n" + "\n".join(lines)
            proxy.up()
            relay.wait_for_event("relay.started", timeout=30)
            assert relay.has_event("relay.postgres_answered")
        finally:
            assert relay.stop() == 0
    finally:
        proxy.close()
    assert SECRET not in relay.text()


def test_rabbitmq_down_is_waited_for_and_sigterm_stops_the_wait(env: dict[str, str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens once the socket is closed
    env["AMQP_URL"] = f"amqp://guest:mq-{SECRET}@127.0.0.1:{closed}/"
    consumer = Daemon("consumer", APP, env)
    try:
        waits = _waiting_lines(consumer, "consumer.waiting_for_rabbitmq", 2, timeout=30)
        assert waits[0]["reason"] == "connection refused"
        assert all(gap >= QUIET_S for gap in _gaps(waits))
        assert not consumer.has_event("consumer.started")
    finally:
        consumer.signal(signal.SIGTERM)
        assert consumer.proc.wait(10) == 0
        consumer.stop()
    events = [e["event"] for e in consumer.events()]
    assert events[-2:] == ["consumer.signal", "consumer.stopped"]
    assert len(consumer.text().splitlines()) == len(events), "every line is a JSON event"
    assert SECRET not in consumer.text()


def test_password_in_a_flag_is_warned_about_never_shown(
    env: dict[str, str], db_url: DatabaseUrl, account: tuple[str, str, str]
) -> None:
    user, password, vhost = account
    flags = [
        "--database-url",
        pg_url(db_url.dbname),
        "--amqp-url",
        f"amqp://{user}:{password}@127.0.0.1:5672/{vhost}",
    ]
    with running("relay", flags, env, "relay.started") as relay:
        warnings = [e for e in relay.events() if e["event"] == "relay.password_on_command_line"]
    assert [w["flag"] for w in warnings] == ["--database-url", "--amqp-url"]
    assert "DATABASE_URL_FILE" in warnings[0]["detail"]
    assert "AMQP_URL_FILE" in warnings[1]["detail"]
    text = relay.text()
    assert SECRET not in text
    assert password not in text


def test_no_warning_without_a_password_in_the_flags(
    env: dict[str, str], db_url: DatabaseUrl
) -> None:
    flags = ["--database-url", db_url.conninfo]
    with running("relay", flags, env, "relay.started") as relay:
        pass
    assert not relay.has_event("relay.password_on_command_line")
