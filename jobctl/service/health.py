"""Is the service's world there? PostgreSQL and RabbitMQ, each asked once with a
short timeout, for ``GET /readyz``; and the cache that answers /readyz, so a probe
every few milliseconds costs one check (one connection to RabbitMQ, one statement)
per second or two, however many ask."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

import aio_pika
import sqlalchemy.exc

from hybrid_jobs.jobctl.service import queries
from hybrid_jobs.jobctl.service.database import Database
from hybrid_jobs.jobctl.service.models import Check, Readiness
from hybrid_jobs.jobctl.service.sql import fetch_one
from hybrid_jobs.plumbing import diagnose
from hybrid_jobs.plumbing.amqp import first_answering
from hybrid_jobs.plumbing.config import AmqpUrl

TIMEOUT: Final = 2.0

log = logging.getLogger("jobctl")


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
    return Readiness(all(c.ok for c in checks), tuple(checks), round(time.time(), 3))


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


class ReadinessCache:
    """The last answer, kept ``ttl`` seconds; one check at a time (callers that come
    while one runs wait for it and share it). A check that finds a service away is
    logged with its details when that changes, for the operator; callers without the
    token see only which service answered (:meth:`Readiness.public`)."""

    def __init__(self, database: Database, amqp: AmqpUrl, ttl: float) -> None:
        self.database = database
        self.amqp = amqp
        self.ttl = ttl
        self._found: Readiness | None = None
        self._at = 0.0
        self._lock = asyncio.Lock()
        self.checks = 0

    async def get(self) -> Readiness:
        if self._found is not None and time.monotonic() - self._at < self.ttl:
            return self._found
        async with self._lock:
            if self._found is not None and time.monotonic() - self._at < self.ttl:
                return self._found
            found = await readiness(self.database, self.amqp)
            self.checks += 1
            self._log(self._found, found)
            self._found, self._at = found, time.monotonic()
            return found

    @staticmethod
    def _log(before: Readiness | None, now: Readiness) -> None:
        said = None if before is None else [(c.service, c.detail) for c in before.checks]
        if now.ready:
            if before is not None and not before.ready:
                log.info("api.ready")
            return
        if said != [(c.service, c.detail) for c in now.checks]:
            log.warning(
                "api.not_ready",
                extra={
                    "checks": [dataclasses.asdict(c) for c in now.checks if not c.ok],
                },
            )
