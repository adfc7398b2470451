"""Forced interleavings of two transactions on real connections."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import psycopg

from hybrid_jobs.plumbing.config import DatabaseUrl


def waits_behind(
    db_url: DatabaseUrl,
    pg: psycopg.Connection,
    first: Callable[[psycopg.Connection], None],
    statement: str,
    params: Mapping[str, Any],
) -> list[Any]:
    """``first`` in a transaction left open; then ``statement`` on another
    connection, until PostgreSQL shows it waiting for a lock; then ``first``'s
    commit. The rows ``statement`` returned once it could go on."""
    with psycopg.connect(db_url.conninfo, autocommit=True) as holder:
        holder.execute("BEGIN")
        first(holder)
        rows: list[Any] = []
        with psycopg.connect(db_url.conninfo, autocommit=True) as waiter:
            pid = waiter.info.backend_pid
            worker = threading.Thread(
                target=lambda: rows.extend(waiter.execute(statement, params).fetchall())
            )
            worker.start()
            deadline = time.monotonic() + 30
            while not pg.execute(
                "SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted", [pid]
            ).fetchone():
                assert time.monotonic() < deadline, "the second statement never waited"
                time.sleep(0.02)
            holder.execute("COMMIT")
            worker.join(30)
            assert not worker.is_alive()
    return rows
