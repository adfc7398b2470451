"""PostgreSQL connections for the daemons: pooled for statements, single for LISTEN."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from psycopg import AsyncConnection, AsyncRawCursor, Connection
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from hybrid_jobs.plumbing.config import DatabaseUrl


def connection_kwargs(application_name: str, database: DatabaseUrl | None = None) -> dict[str, Any]:
    # TCP keepalives notice a silently dead database connection in well under a minute;
    # application_name shows who is who in pg_stat_activity.
    kwargs: dict[str, Any] = {
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "application_name": application_name,
    }
    if database is not None and database.pooled:
        # A transaction pooler hands each transaction to any server connection, where
        # a statement prepared on another does not exist (PgBouncer before 1.21).
        kwargs["prepare_threshold"] = None
    return kwargs


# For the daemons' own statements: a transition that waits on a row lock for more
# than a few seconds (a producer holding a cancel request open, say) fails as
# transient and is retried, rather than stalling every heartbeat behind it. And no
# JIT: every one of them is an index walk bounded by its batch, but over a long
# backlog the planner's estimate passes jit_above_cost and compiling the plan takes
# most of the time (the relay's decision with 200,000 wake-ups pending: 1,096 ms of
# 1,146 ms, 68 ms without).
CONTROL_OPTIONS = "-c lock_timeout=5000 -c statement_timeout=30000 -c jit=off"

# For the consumer's and the relay's own connections: every statement with
# parameters planned once, for any values (a generic plan), prepared or not, and so
# are the trigger functions' queries that run in those sessions. By default
# PostgreSQL plans a prepared statement's first five executions for their values and
# then settles on the generic plan, which is what every hot statement here is
# written for and what the plan tests check (harness/plans.py; the daemons' chores,
# tests/test_daemon_chore_plans.py): the five custom plans only delay that. They cost
# 4 to 5 ms each for a claim, an outcome or the relay's decision, on every new pooled
# connection and for each statement it runs, so a relay or consumer that starts, or
# recycles a connection, stalled the jobs behind those plans: at 200 jobs/s of
# bench.full_feature's jobs, 320 ms of planning in the first second. And a statement
# that never settled (the relay's pack limit: 49 plans for 50 executions) was
# planned at every call. The pools of the operator's tools and of a job's own
# transactions keep PostgreSQL's default.
DAEMON_OPTIONS = CONTROL_OPTIONS + " -c plan_cache_mode=force_generic_plan"

# For the relay's connections: every write the relay makes is one it would make
# again if it were lost (a wake-up marked sent, a lease swept, a schedule fired with
# its job), and anything that depends on it (a consumer's claim) is a synchronous
# commit later in the same write-ahead log, which flushes it too. So the relay does
# not wait for a disk flush per transaction.
#
# And no bitmap scans. The decision reads outbox_inflight_idx (the wake-ups in
# flight) three times a pass, and that index keeps an entry for every wake-up
# settled since the last vacuum: thousands a second under load, where a minute
# passes between autovacuum's visits. An index scan marks each dead entry it
# passes, so the next pass skips it without visiting the table; a bitmap scan marks
# none and visits them all, every pass. Midway through a drain of 60,000 jobs
# (autovacuum off), a pass found 8,156 entries there for 25 wake-ups in flight, and
# after the drain the start of a job took 13.5-15.6 ms at p50 instead of 5.6-8.5
# (bench.drain; tests/test_relay_decision.py). Every statement of the relay walks
# an index bounded by its batch, where a bitmap scan gains nothing.
RELAY_OPTIONS = DAEMON_OPTIONS + " -c synchronous_commit=off -c enable_bitmapscan=off"


def with_url_options(database: DatabaseUrl, options: str) -> str:
    """``options`` after the URL's own startup options. Given to a connection,
    options replace the URL's, which name the instance's schema
    (``DatabaseUrl.in_schema``): this keeps both."""
    return " ".join(filter(None, [database.params.get("options"), options]))


def make_pool(
    database: DatabaseUrl,
    application_name: str,
    max_size: int,
    *,
    options: str | None = CONTROL_OPTIONS,
    checkout_timeout: float = 5.0,
) -> AsyncConnectionPool[AsyncConnection]:
    """A closed pool; ``await pool.open(wait=False)`` starts it.

    Connections are in autocommit mode: every transition is one statement, and
    outside an explicit ``conn.transaction()`` psycopg would spend a round trip on
    BEGIN and another on COMMIT around it. Where a transaction is needed (the relay's
    claim-publish-commit, a job's own transaction, maintenance under its advisory
    lock) the code opens one explicitly.

    Connections are not checked on checkout (that is a round trip on every hot-path
    statement); a broken one fails its statement, the caller's retry takes another,
    and the pool discards the broken one when it comes back. Waiting for a
    connection gives up after ``checkout_timeout``: when the database is down the
    caller should find out soon and say so, not hang.
    """
    return AsyncConnectionPool(
        **_pool_args(database, application_name, max_size, options, checkout_timeout),
        open=False,
    )


def make_sync_pool(
    database: DatabaseUrl,
    application_name: str,
    max_size: int,
    *,
    options: str | None = CONTROL_OPTIONS,
    checkout_timeout: float = 5.0,
) -> ConnectionPool[Connection]:
    """:func:`make_pool`'s connections for threads (a plain handler's), made and
    handed out by the same rules; open from the start."""
    return ConnectionPool(
        **_pool_args(database, application_name, max_size, options, checkout_timeout),
        open=True,
    )


def _pool_args(
    database: DatabaseUrl,
    application_name: str,
    max_size: int,
    options: str | None,
    checkout_timeout: float,
) -> dict[str, Any]:
    """What both kinds of pool are made with."""
    return {
        "conninfo": database.conninfo,
        "min_size": 1,
        "max_size": max_size,
        "kwargs": _pool_kwargs(database, application_name, options),
        "name": application_name,
        "timeout": checkout_timeout,
    }


def _pool_kwargs(
    database: DatabaseUrl, application_name: str, options: str | None
) -> dict[str, Any]:
    if options and not database.pooled:
        options = with_url_options(database, options)
    return (
        connection_kwargs(application_name, database)
        | {"autocommit": True}
        # Through a transaction pooler, startup options do not reach the server (set
        # the timeouts and the search_path on the role instead: see the deploy guide).
        | ({"options": options} if options and not database.pooled else {})
    )


async def listen_connection(database: DatabaseUrl, application_name: str) -> AsyncConnection:
    """A connection for LISTEN: the direct one when a transaction pooler is in the
    way, since a notification goes to the session that listens, which a pooler
    hands to someone else after each transaction."""
    return await AsyncConnection.connect(
        database.listen or database.conninfo,
        autocommit=True,
        **connection_kwargs(application_name),
    )


_NAMED = re.compile(r"%\((\w+)\)s|%%")


class Native:
    """A statement in PostgreSQL's own placeholders ($1, $2 ...), converted from
    psycopg's named ones (``%(name)s``) once, for the daemons' hottest statements.
    psycopg converts a query at every execution and caches the conversion only for
    queries of up to 4 KB; the relay's decision (13 KB) and the claims (4 and 20 KB)
    are longer, so each execution split the whole text again (0.09 ms of the
    relay's CPU per pass, measured). The text sent, and so the prepared statement
    and its plan, is the one psycopg's own conversion makes."""

    def __init__(self, statement: str) -> None:
        if "%" in _NAMED.sub("", statement):
            raise ValueError("only %(name)s placeholders (and %% for a percent sign)")
        numbers: dict[str, int] = {}

        def number(m: re.Match[str]) -> str:
            if m.group(0) == "%%":
                return "%"
            return f"${numbers.setdefault(m.group(1), len(numbers) + 1)}"

        # bytes, made once: psycopg sends them as they are, and their hash (the
        # key of the connection's prepared statements) is computed once too
        self.sql = _NAMED.sub(number, statement).encode()
        self.names = tuple(numbers)

    def params(self, values: Mapping[str, Any]) -> list[Any]:
        return [values[name] for name in self.names]

    async def execute(
        self, conn: AsyncConnection, values: Mapping[str, Any]
    ) -> AsyncRawCursor[Any]:
        # Prepared at its first execution, not its sixth (psycopg's default): each
        # execution before that is planned afresh, and these statements run on every
        # batch (a composed claim takes 4.5 ms to plan). Not where the connection
        # prepares nothing (a transaction pooler's).
        prepare = None if conn.prepare_threshold is None else True
        return await AsyncRawCursor(conn).execute(self.sql, self.params(values), prepare=prepare)


@cache
def native(statement: str) -> Native:
    """The statement's :class:`Native` form, made at its first use. Called where
    the statement runs (``await native(q.X).execute(conn, params)``), so the code
    still names the statement it runs (schema/docs.py's index reads that); the
    lookup hashes nothing new, as a string keeps its hash."""
    return Native(statement)
