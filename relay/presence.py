"""The relay's row in ``relays``: announced at every heartbeat, deleted on a clean
stop, expired by the workers chore when a relay dies without one.

Operators and alerts read it to tell "no relay is publishing" from "the backlog is
long", which the outbox alone cannot: it holds every queue's work beyond its
window by design. It also carries the queues this relay cannot publish to right
now and why (``failing_queues``): the state is the relay's own (each relay backs
its failing queues off on its own) and lives and dies with the process, so it goes
where the process's heartbeat already writes, at no extra write.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from hybrid_jobs.schema.queries import RELAY_GONE, RELAY_SEEN

Pool = AsyncConnectionPool[AsyncConnection]


def make_relay_id() -> str:
    """host:pid:random, so a restarted relay with a reused pid is a new row."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


async def announce(
    pool: Pool,
    relay_id: str,
    *,
    connected: bool,
    published: int,
    failing: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """``failing``: the queues this relay cannot publish to now, each with why
    (relay/backoff.py), for jobctl to show."""
    async with pool.connection() as conn:
        await conn.execute(
            RELAY_SEEN,
            {
                "relay": relay_id,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "connected": connected,
                "published": published,
                "failing": Jsonb(dict(failing or {})),
            },
        )


async def forget(pool: Pool, relay_id: str) -> None:
    async with pool.connection() as conn:
        await conn.execute(RELAY_GONE, {"relay": relay_id})
