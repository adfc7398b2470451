"""Before a daemon starts its loops: are its services there, and are its settings right?

``preflight`` connects to PostgreSQL (and checks that the schema is migrated) and to
RabbitMQ, both at once. What retrying cannot fix (a refused login, a database or
virtual host that does not exist, an unmigrated schema) raises ``ConfigError`` with
one line that names the setting to fix. An outage (nothing listening yet, a timeout,
a server starting up) is waited out with backoff, saying so at most every few
seconds, until the service answers or the daemon is asked to stop.

It runs once, at start-up. Once running, a daemon treats every failure as an outage
and keeps retrying (``plumbing.transient``): a database that was right a minute ago
is having a bad moment, not a typo.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

import aio_pika
import psycopg
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from hybrid_jobs.plumbing import diagnose
from hybrid_jobs.plumbing.amqp import first_answering
from hybrid_jobs.plumbing.config import AmqpUrl, ConfigError, DatabaseUrl
from hybrid_jobs.plumbing.diagnose import Diagnosis
from hybrid_jobs.plumbing.transient import reconnect_wait, unless_stopped
from hybrid_jobs.schema import revisions

# A waiting daemon says so at once, then at most this often.
LOG_EVERY_S = 5.0
# A host that drops packets would otherwise hold each attempt for the kernel's TCP
# timeout (minutes), with the daemon saying nothing meanwhile.
CONNECT_TIMEOUT_S = 10.0


async def preflight(
    database: DatabaseUrl, amqp: AmqpUrl | None, *, name: str, stop: asyncio.Event
) -> bool:
    """Wait until PostgreSQL (migrated) and, unless ``amqp`` is None, RabbitMQ answer.

    True when both did; False when ``stop`` was set first. Raises ``ConfigError``,
    naming the setting, for what retrying cannot fix. ``name`` is the daemon's: its
    logger, the prefix of its events, and its connections' names.
    """
    log = logging.getLogger(name)
    services: list[_Service[Any]] = [_Postgres(database, name)]
    if amqp is not None:
        services.append(_RabbitMQ(amqp, name))
    started = time.monotonic()
    if not await unless_stopped(stop, _together([_wait(log, name, s) for s in services])):
        return False
    log.info(
        f"{name}.services_ready",
        extra={s.key: s.summary for s in services}
        | {"waited_s": round(time.monotonic() - started, 1)},
    )
    return True


async def _together(checks: list[Coroutine[Any, Any, None]]) -> None:
    """Run the checks at once, so a wrong password is reported while the other
    service is still being waited for; the first ConfigError cancels the rest."""
    tasks = [asyncio.ensure_future(c) for c in checks]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Unavailable(Exception):
    """An attempt failed in a way that waiting can fix."""

    def __init__(self, diagnosis: Diagnosis) -> None:
        super().__init__(diagnosis.reason)
        self.diagnosis = diagnosis


_Url = TypeVar("_Url", DatabaseUrl, AmqpUrl)


class _Service(ABC, Generic[_Url]):
    key: str  # in event names: <daemon>.waiting_for_<key>
    label: str  # in messages

    def __init__(self, url: _Url, name: str) -> None:
        self.url: _Url = url
        self.name = name
        self.address = url.address
        self.setting = url.setting  # the setting to name in a ConfigError
        self.summary = url.redacted()  # for the ready line, once it answered

    @abstractmethod
    async def attempt(self) -> None:
        """Connect once; raise if that fails (ConfigError for a setting to fix)."""

    @abstractmethod
    def diagnose(self, exc: BaseException) -> Diagnosis: ...


async def _wait(log: logging.Logger, name: str, service: _Service[Any]) -> None:
    started = time.monotonic()
    last_logged = -math.inf

    def before_sleep(state: RetryCallState) -> None:
        nonlocal last_logged
        now = time.monotonic()
        exc = state.outcome.exception() if state.outcome else None
        if not isinstance(exc, _Unavailable) or now - last_logged < LOG_EVERY_S:
            return
        last_logged = now
        found = exc.diagnosis
        detail = f"waiting for {service.label} at {service.address}: {found.reason}"
        log.warning(
            f"{name}.waiting_for_{service.key}",
            extra={
                "address": service.address,
                "reason": found.reason,
                "waited_s": round(now - started, 1),
                "attempts": state.attempt_number,
                "detail": f"{detail}; {found.hint}" if found.hint else detail,
            },
        )

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(_Unavailable),
        wait=reconnect_wait,
        before_sleep=before_sleep,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            try:
                await service.attempt()
            except ConfigError:
                raise
            except Exception as exc:
                found = service.diagnose(exc)
                if found.fatal:
                    raise ConfigError(f"{service.setting}: {found.reason}") from None
                raise _Unavailable(found) from exc
    if last_logged > -math.inf:
        log.info(
            f"{name}.{service.key}_answered",
            extra={"address": service.address, "waited_s": round(time.monotonic() - started, 1)},
        )


class _Postgres(_Service[DatabaseUrl]):
    key = "postgres"
    label = "PostgreSQL"

    def diagnose(self, exc: BaseException) -> Diagnosis:
        return diagnose.postgres(exc, self.url)

    async def attempt(self) -> None:
        options: dict[str, Any] = {"application_name": f"{self.name}-preflight"}
        if "connect_timeout" not in self.url.params:
            options["connect_timeout"] = CONNECT_TIMEOUT_S
        conn = await psycopg.AsyncConnection.connect(self.url.conninfo, autocommit=True, **options)
        async with conn:
            misplaced = await misplaced_instance(conn, self.url.schema)
            if misplaced is not None:
                raise ConfigError(f'{self.setting}: database "{self.url.dbname}" {misplaced}')
            state = await (await conn.execute(revisions.SCHEMA_STATE)).fetchone()
            has_jobs, has_version = state or (False, False)
            revision = None
            if has_version:
                row = await (await conn.execute(revisions.SCHEMA_REVISION)).fetchone()
                revision = row[0] if row else None
        self._check_schema(bool(has_jobs), revision)
        self.summary = f"{self.url.redacted()} (schema {revision or 'unversioned'})"

    def _check_schema(self, has_jobs: bool, revision: str | None) -> None:
        why = revisions.unready(has_jobs, revision)
        if why is not None:
            raise ConfigError(f'{self.setting}: database "{self.url.dbname}" {why}')


async def misplaced_instance(conn: psycopg.AsyncConnection[Any], schema: str | None) -> str | None:
    """Why the connection does not reach the instance in ``schema``
    (``revisions.misplaced``), or None when it does."""
    row = await (await conn.execute(revisions.SCHEMA_FOUND_IN)).fetchone()
    found_in = row[0] if row else None
    if schema is None or found_in == schema:
        return None
    installs = [r[0] for r in await (await conn.execute(revisions.INSTALLS)).fetchall()]
    return revisions.misplaced(schema, found_in, installs)


class _RabbitMQ(_Service[AmqpUrl]):
    key = "rabbitmq"
    label = "RabbitMQ"

    def diagnose(self, exc: BaseException) -> Diagnosis:
        return diagnose.rabbitmq(exc, self.url)

    async def attempt(self) -> None:
        async def one(_index: int, node: AmqpUrl) -> str:
            connection = await aio_pika.connect(
                node.url,
                timeout=CONNECT_TIMEOUT_S,
                client_properties={
                    "connection_name": f"{self.name} {socket.gethostname()}:{os.getpid()} preflight"
                },
            )
            await connection.close()
            return node.address

        answered = await first_answering(self.url, one)
        if len(self.url.urls) > 1:
            self.summary = f"{self.url.redacted()} ({answered} answered first)"
