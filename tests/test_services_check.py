"""scripts/test's check of the services: how many pytest processes the server has
connections for, asked of the real server."""

from __future__ import annotations

import subprocess
import sys

import psycopg

from harness.services import ADMIN_URL, CONNECTIONS_FOR_FIVE, CONNECTIONS_FOR_FOUR
from tests.support.processes import ROOT


def test_more_workers_only_where_the_server_takes_their_connections() -> None:
    with psycopg.connect(ADMIN_URL) as conn:
        row = conn.execute("SHOW max_connections").fetchone()
    assert row is not None
    run = subprocess.run(
        [sys.executable, "-m", "harness.services", "--workers"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    if int(row[0]) >= CONNECTIONS_FOR_FIVE:
        assert (run.stdout.strip(), run.stderr) == ("5", "")
    elif int(row[0]) >= CONNECTIONS_FOR_FOUR:
        assert (run.stdout.strip(), run.stderr) == ("4", "")
    else:
        assert run.stdout.strip() == "3"
        assert "raise max_connections, or set TEST_WORKERS" in run.stderr
