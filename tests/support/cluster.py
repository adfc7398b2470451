"""A private PostgreSQL server that asks for a password, for the tests of a refused
login: the shared server trusts every local connection, so it never refuses one.

initdb and pg_ctl from the machine's PostgreSQL, run as the ``postgres`` user (initdb
refuses to run as root), in a temporary directory, on a free port; stopped and
removed afterwards. About a second to start.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Cluster:
    port: int
    user: str
    password: str

    def url(self, *, password: str | None = None, dbname: str = "postgres") -> str:
        secret = self.password if password is None else password
        return f"postgresql://{self.user}:{secret}@127.0.0.1:{self.port}/{dbname}"


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def password_postgres() -> Iterator[Cluster]:
    bindir = _bindir()
    if bindir is None or shutil.which("runuser") is None or os.geteuid() != 0:
        pytest.skip("needs initdb, and root to run it as the postgres user")
    cluster = Cluster(port=_free_port(), user="app", password="pg-cluster-s3cret")
    base = Path(tempfile.mkdtemp(prefix="hj-pg-"))
    shutil.chown(base, "postgres")
    pwfile = base / "pw"
    pwfile.write_text(cluster.password)
    shutil.chown(pwfile, "postgres")
    data = base / "data"

    def as_postgres(*args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True, capture_output=True)

    try:
        as_postgres(
            str(bindir / "initdb"), "-D", str(data), "-U", cluster.user,
            "--auth=scram-sha-256", f"--pwfile={pwfile}", "--no-sync",
        )  # fmt: skip
        options = f"-p {cluster.port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
        as_postgres(
            str(bindir / "pg_ctl"), "-D", str(data), "-l", str(base / "log"), "-w",
            "-o", options, "start",
        )  # fmt: skip
        try:
            yield cluster
        finally:
            as_postgres(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(base, ignore_errors=True)
