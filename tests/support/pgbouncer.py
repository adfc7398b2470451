"""A PgBouncer of the test's own, in transaction pooling mode, in front of the local
PostgreSQL: to show the relay and the consumers work through a pooler."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def available() -> bool:
    return Path(PGBOUNCER).exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def pgbouncer(user: str = "root") -> Iterator[int]:
    """Run PgBouncer (transaction mode) on a free port; yield the port."""
    port = _free_port()
    home = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    (home / "users.txt").write_text(f'"{user}" ""\n')
    (home / "pgbouncer.ini").write_text(
        f"""[databases]
* = host=127.0.0.1 port=5432

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {home / "users.txt"}
admin_users = {user}
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
ignore_startup_parameters = extra_float_digits,options
logfile = {home / "pgbouncer.log"}
pidfile = {home / "pgbouncer.pid"}
"""
    )
    command = [PGBOUNCER, str(home / "pgbouncer.ini")]
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root: drop to the postgres account.
        owner = pwd.getpwnam("postgres")
        os.chown(home, owner.pw_uid, owner.pw_gid)
        for f in home.iterdir():
            os.chown(f, owner.pw_uid, owner.pw_gid)
        command[1:1] = ["-u", "postgres"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with psycopg.connect(
                    f"postgresql://{user}@127.0.0.1:{port}/pgbouncer", autocommit=True
                ):
                    break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = (home / "pgbouncer.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"pgbouncer did not start: {log}") from None
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(home, ignore_errors=True)


def transactions_served(port: int, dbname: str, user: str = "root") -> int:
    """How many transactions PgBouncer has passed on to ``dbname`` (SHOW STATS)."""
    with psycopg.connect(f"postgresql://{user}@127.0.0.1:{port}/pgbouncer", autocommit=True) as c:
        cur = c.execute("SHOW STATS")
        names = [d.name for d in cur.description or []]
        for row in cur.fetchall():
            stats = dict(zip(names, row, strict=True))
            if stats["database"] == dbname:
                return int(stats["total_xact_count"])
    return 0
