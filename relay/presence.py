"""The relay's row in ``relays``: announced at every heartbeat, deleted on a clean
stop, expired by the workers chore when a relay dies without one.

Operators and alerts read it to tell "no relay is publishing" from "the backlog is
long", which the outbox alone cannot: it holds every queue's work beyond its
window by design.
"""

from __future__ import annotations

import os
import secrets
import socket

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from schema.queries import RELAY_GONE, RELAY_SEEN

Pool = AsyncConnectionPool[AsyncConnection]


def make_relay_id() -> str:
    """host:pid:random, so a restarted relay with a reused pid is a new row."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


async def announce(pool: Pool, relay_id: str, *, connected: bool, published: int) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            RELAY_SEEN,
            {
                "relay": relay_id,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "connected": connected,
                "published": published,
            },
        )


async def forget(pool: Pool, relay_id: str) -> None:
    async with pool.connection() as conn:
        await conn.execute(RELAY_GONE, {"relay": relay_id})
