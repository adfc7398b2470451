"""The connection the surfaces share, and its two kinds of transaction.

The service functions take an SQLAlchemy ``AsyncSession`` and never commit, like
the producer API (``outbox``), whose functions every mutation goes through: a
caller can put several of them in one transaction, and the CLI, the HTTP API and a
dashboard open their transactions the same way::

    database = Database(database_url("postgresql://..."), "jobctl-api")
    async with database.reading() as session:      # one consistent snapshot
        page = await service.list_jobs(session, JobFilter(state=JobState.FAILED))
    async with database.writing() as session:      # commits at the end, or rolls back
        await service.cancel_jobs(session, [job_id])
    await database.dispose()
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import pool
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.plumbing.db import connection_kwargs, with_url_options

# A read or action that takes longer is failed rather than left to hold a
# connection (and, for a write, row locks) while its caller has given up; a row
# lock a daemon holds is waited for briefly, not for a daemon's whole statement.
STATEMENT_TIMEOUT_MS = 10_000
LOCK_TIMEOUT_MS = 3_000
CONNECT_TIMEOUT_S = 5


class Database:
    def __init__(
        self, url: DatabaseUrl, application_name: str, *, pooled: bool = True, pool_size: int = 5
    ) -> None:
        """``pooled``: keep connections for a server; a one-shot command takes one."""
        self.url = url
        connect_args = connection_kwargs(application_name) | {
            "connect_timeout": CONNECT_TIMEOUT_S,
            "options": with_url_options(
                url,
                f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c lock_timeout={LOCK_TIMEOUT_MS}",
            ),
        }
        pooling = (
            {"pool_size": pool_size, "max_overflow": pool_size, "pool_pre_ping": True}
            if pooled
            else {"poolclass": pool.NullPool}
        )
        self.engine = create_async_engine(url.sqlalchemy, connect_args=connect_args, **pooling)
        # Reads see one snapshot (every figure of a page agrees) and cannot write.
        self._reads = async_sessionmaker(
            self.engine.execution_options(
                isolation_level="REPEATABLE READ", postgresql_readonly=True
            )
        )
        # Writes keep READ COMMITTED, as the producer API expects: under REPEATABLE
        # READ a cancel racing a worker's outcome would fail instead of seeing it.
        self._writes = async_sessionmaker(self.engine)

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[AsyncSession]:
        async with self._reads() as session, session.begin():
            yield session

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[AsyncSession]:
        """A transaction that commits when the block ends, and rolls back (writing
        nothing) when it raises."""
        async with self._writes() as session, session.begin():
            yield session

    async def dispose(self) -> None:
        await self.engine.dispose()
