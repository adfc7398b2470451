"""``jobctl doctor``: what is wrong with an installation, and what to do about it.

Each module checks one part and says what it found as :class:`Finding` s (levels
and exit status: :mod:`.findings`): the schema (:mod:`.schema`), PostgreSQL's
settings, connections and clock (:mod:`.server`), the relays, consumers and waiting
jobs (:mod:`.fleet`), RabbitMQ's topology (:mod:`.broker`). Their statements are in
:mod:`.queries`; every one reads.

A part that cannot be checked (PostgreSQL does not answer, the tables are not
there) is a finding too, and the parts that need it are skipped, saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection

from hybrid_jobs import defaults
from hybrid_jobs.jobctl.doctor import broker, fleet, schema, server
from hybrid_jobs.jobctl.doctor.findings import Finding, Level, counts, exit_code, verdict
from hybrid_jobs.plumbing import diagnose
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.plumbing.db import connection_kwargs
from hybrid_jobs.schema.topology import Topology

__all__ = ["Finding", "Level", "Plan", "counts", "examine", "exit_code", "verdict"]

CONNECT_TIMEOUT_S = 10


@dataclass(frozen=True)
class Plan:
    """What to examine: the services as the daemons are configured for them, and
    optionally the fleet to size max_connections for (else the one seen)."""

    database: DatabaseUrl
    amqp: AmqpUrl
    topology: Topology
    consumers: int | None = None
    relays: int | None = None
    concurrency: int | None = None


async def examine(plan: Plan) -> list[Finding]:
    """Every check's findings, in the order a reader fixes them: the database,
    its schema and settings, the daemons, RabbitMQ."""
    try:
        conn = await AsyncConnection.connect(
            plan.database.conninfo,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            **connection_kwargs("jobctl-doctor", plan.database),
        )
    except psycopg.Error as exc:
        found = diagnose.postgres(exc, plan.database)
        hint = f"; {found.hint}" if found.hint else ""
        unreachable = Finding(
            "postgres",
            Level.PROBLEM,
            f"cannot reach PostgreSQL at {plan.database.address}",
            f"{found.reason}{hint}; the database's checks were skipped",
            f"check {plan.database.setting} ({plan.database.redacted()}) and that PostgreSQL runs",
        )
        return [unreachable, *await broker.check(plan.amqp, plan.topology, (), live=False)]
    async with conn:
        try:
            return await _with_database(conn, plan)
        except psycopg.Error as exc:
            # A table this release reads is not there (a schema made by hand), or the
            # connection broke: said as a finding, not a traceback.
            failed = Finding(
                "postgres",
                Level.PROBLEM,
                "a check could not read the database",
                f"PostgreSQL said: {diagnose.first_line(exc)}; the checks after it were skipped",
                "fix what it says, then run `jobctl doctor` again",
            )
            return [failed]


async def _with_database(conn: AsyncConnection[Any], plan: Plan) -> list[Finding]:
    found, at_head = await schema.revision(conn, plan.database)
    migrated = not any(f.level is Level.PROBLEM for f in found)
    if at_head:
        found += await schema.drift(conn, plan.database)
    settings = await server.settings(conn)
    found += [server.version(settings)]
    found += server.durability(settings, plan.database.dbname)
    found += server.vacuum(
        settings, await server.tables_without_autovacuum(conn), plan.database.dbname
    )
    found += server.timeouts(settings, plan.database.dbname)
    found += await server.clock(conn)
    if not migrated:
        found.append(
            Finding(
                "consumers",
                Level.NOTE,
                "the relays, consumers and waiting jobs were not checked",
                "they are read from the tables, which are not there yet",
            )
        )
        found.append(await server.connections(conn, settings, _given(plan)))
        found += await broker.check(plan.amqp, plan.topology, (), live=False)
        return found
    seen = await fleet.seen(conn)
    found.append(await server.connections(conn, settings, _fleet(plan, seen)))
    found += fleet.relays(seen)
    found += await fleet.publishing(conn)
    found += fleet.consumers(seen)
    waiting, due_in = await fleet.waiting(conn)
    found += waiting
    queues = seen.served_queues() | due_in
    found += await broker.check(plan.amqp, plan.topology, queues, seen.anything_live)
    return found


def _given(plan: Plan) -> server.Fleet:
    return _fleet(plan, fleet.Seen((), ()))


def _fleet(plan: Plan, seen: fleet.Seen) -> server.Fleet:
    """The fleet to size max_connections for: what --consumers and --relays say,
    else the live processes seen."""
    if plan.consumers is None:
        consumers = tuple(p.concurrency for p in seen.live_consumers)
    else:
        consumers = (plan.concurrency or defaults.CONSUMER_CONCURRENCY,) * plan.consumers
    relays = len(seen.live_relays) if plan.relays is None else plan.relays
    return server.Fleet(consumers, relays, seen=plan.consumers is None and plan.relays is None)
