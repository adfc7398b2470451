"""Moving wake-ups from the outbox table to RabbitMQ, one batch per transaction."""

from __future__ import annotations

import logging
import os
import signal

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from relay.broker import Publisher, WakeUp
from schema.queries import OUTBOX_CLAIM_DUE

log = logging.getLogger("relay")

# Fault injection for the crash tests: with this set to "kill-after-publish" the
# relay kills itself between the broker's confirms and the commit that marks the
# batch sent. Never set it anywhere else.
FAULT_ENV = "RELAY_FAULT_INJECTION"


async def drain_batch(
    pool: AsyncConnectionPool[AsyncConnection],
    publisher: Publisher,
    *,
    limit: int,
    publish_timeout: float,
) -> int:
    """Claim up to ``limit`` due wake-ups, publish them, mark them sent.

    Claim and mark are one statement in one transaction that commits only after
    every message is confirmed, so a failure anywhere leaves the rows unsent and
    they go out again: a wake-up can be published twice, never lost.
    """
    # Pipeline mode sends BEGIN along with the claim instead of waiting a round trip
    # for it: this is the latency path from a producer's commit to a consumer.
    async with pool.connection() as conn, conn.pipeline(), conn.transaction():
        cur = await conn.execute(OUTBOX_CLAIM_DUE, {"limit": limit})
        wakeups = [WakeUp(*row) for row in await cur.fetchall()]
        if wakeups:
            await publisher.publish(wakeups, publish_timeout)
            if os.environ.get(FAULT_ENV) == "kill-after-publish":
                log.warning("relay.fault_injected", extra={"count": len(wakeups)})
                os.kill(os.getpid(), signal.SIGKILL)
    return len(wakeups)
