"""How many job ids one message may carry to a queue, so that a burst spreads over
every consumer instead of piling up at the first ones (a consumer keeps a message
until each id in it is claimed).

A consumer takes two messages at a time and holds at most its prefetch of ids
waiting for a slot, so a message carries at most half the smallest prefetch among
the queue's live consumers (WORKER_PACK_LIMIT), and never more than ``--pack``.
Read from the workers table at most every FRESH_SECONDS per queue; with no live
consumer known, ``--pack`` applies.
"""

from __future__ import annotations

import time
import weakref

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from hybrid_jobs.schema.queries import WORKER_PACK_LIMIT

# How long a queue's limit is reused before the workers table is read again. A
# consumer's prefetch changes with its jobs (consumers/prefetch.py) and its row says
# so at once; read once a second, a burst's first second went out at the old pack,
# a third of a 20,000-job drain (5 to 8 % of its rate). A read is one small
# statement on the workers table, at most five a second per queue that has work.
FRESH_SECONDS = 0.2

Pool = AsyncConnectionPool[AsyncConnection]

_known: weakref.WeakKeyDictionary[Pool, dict[str, tuple[float, int | None]]] = (
    weakref.WeakKeyDictionary()
)


async def pack_limit(pool: Pool, queue: str, most: int, worker_ttl: float) -> int:
    """The most ids a message to ``queue`` should carry now."""
    known = _known.setdefault(pool, {})
    now = time.monotonic()
    read_at, limit = known.get(queue, (0.0, None))
    if now - read_at >= FRESH_SECONDS:
        async with pool.connection() as conn:
            cur = await conn.execute(WORKER_PACK_LIMIT, {"queue": queue, "worker_ttl": worker_ttl})
            row = await cur.fetchone()
        limit = row[0] if row else None
        known[queue] = (now, limit)
    return most if limit is None else max(1, min(most, limit))
