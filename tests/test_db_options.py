"""The daemons' connections carry their session options to the server."""

from __future__ import annotations

from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.plumbing.db import make_pool, make_sync_pool


async def test_daemon_connections_run_without_jit_and_with_their_timeouts(
    db_url: DatabaseUrl,
) -> None:
    # JIT compiling a backlog-sized plan took most of the relay decision's time.
    pool = make_pool(db_url, "options-check", 1)
    await pool.open(wait=True)
    try:
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT current_setting('jit'), current_setting('lock_timeout'),"
                " current_setting('statement_timeout')"
            )
            assert await cur.fetchone() == ("off", "5s", "30s")
    finally:
        await pool.close()
    sync = make_sync_pool(db_url, "options-check", 1)
    try:
        with sync.connection() as conn:
            assert conn.execute("SELECT current_setting('jit')").fetchone() == ("off",)
    finally:
        sync.close()
