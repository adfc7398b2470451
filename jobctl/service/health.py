"""Is the service's world there? PostgreSQL and RabbitMQ, each asked once with a
short timeout, for ``GET /readyz``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Final

import aio_pika
import sqlalchemy.exc

from jobctl.service import queries
from jobctl.service.database import Database
from jobctl.service.models import Check, Readiness
from jobctl.service.sql import fetch_one
from plumbing import diagnose
from plumbing.amqp import first_answering
from plumbing.config import AmqpUrl

TIMEOUT: Final = 2.0


async def readiness(database: Database, amqp: AmqpUrl, limit: float = TIMEOUT) -> Readiness:
    """Both services asked at once; ready when both answered within ``limit`` seconds."""

    async def postgres() -> None:
        async with database.reading() as session:
            await fetch_one(session, queries.READY_CHECK)

    async def rabbitmq() -> None:
        async def one(_index: int, node: AmqpUrl) -> None:
            connection = await aio_pika.connect(node.url, timeout=limit)
            await connection.close()

        await first_answering(amqp, one)  # a cluster is there while any node answers

    def why_postgres(exc: BaseException) -> str:
        if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.orig is not None:
            exc = exc.orig
        return diagnose.postgres(exc, database.url).reason

    checks = await asyncio.gather(
        _check("postgresql", database.url.address, postgres, why_postgres, limit),
        _check(
            "rabbitmq",
            amqp.address,
            rabbitmq,
            lambda exc: diagnose.rabbitmq(exc, amqp).reason,
            limit,
        ),
    )
    return Readiness(all(c.ok for c in checks), tuple(checks))


async def _check(
    service: str,
    address: str,
    attempt: Callable[[], Awaitable[None]],
    why: Callable[[BaseException], str],
    limit: float,
) -> Check:
    started = time.perf_counter()
    try:
        async with asyncio.timeout(limit):
            await attempt()
    except TimeoutError:
        detail = f"no answer within {limit:g} s"
    except Exception as exc:
        detail = why(exc)
    else:
        detail = ""
    return Check(service, not detail, address, detail, round(time.perf_counter() - started, 3))
