"""PostgreSQL's settings that matter to hybrid-jobs, its version, how many
connections the daemons would open against how many it takes, and its clock."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from psycopg import AsyncConnection

from hybrid_jobs import defaults
from hybrid_jobs.consumers.settings import connections_of as consumer_connections
from hybrid_jobs.jobctl.doctor.findings import Finding, Level
from hybrid_jobs.jobctl.doctor.queries import (
    DOCTOR_CLOCK,
    DOCTOR_CONNECTIONS_IN_USE,
    DOCTOR_SETTINGS,
    DOCTOR_TABLE_OPTIONS,
)
from hybrid_jobs.relay.settings import connections_of as relay_connections

CHECK = "postgres"

SETTINGS: Final = (
    "autovacuum",
    "track_counts",
    "fsync",
    "synchronous_commit",
    "idle_in_transaction_session_timeout",
    "statement_timeout",
    "max_connections",
    "superuser_reserved_connections",
    "reserved_connections",  # PostgreSQL 16 and later
    "server_version",
    "server_version_num",
)
# The tables rewritten all day (every job's life, every wake-up, every heartbeat):
# where dead rows pile up fastest without autovacuum.
CHURNING: Final = ("jobs", "outbox", "job_attempts", "workers", "relays", "fair_shares")
# What to suggest for idle_in_transaction_session_timeout: far longer than a
# handler's transaction waits between its statements, short enough that a stuck
# session's row locks go within minutes.
IDLE_IN_TRANSACTION_SUGGESTED: Final = "5min"
# A clock this far from the database's is worth fixing (times in logs and leases
# read apart), and this far off, wrong.
SKEW_WARNING_S: Final = 1.0
SKEW_PROBLEM_S: Final = 30.0


@dataclass(frozen=True)
class Setting:
    value: str
    source: str  # pg_settings.source: default, configuration file, database, user, client...


async def settings(conn: AsyncConnection[Any]) -> dict[str, Setting]:
    cur = await conn.execute(DOCTOR_SETTINGS, {"names": list(SETTINGS)})
    return {name: Setting(value, source) for name, value, source in await cur.fetchall()}


def _undo(name: str, found: Setting, wanted: str, dbname: str) -> str:
    """Where a setting came from, and so how to put it back."""
    if found.source == "database":
        return f'ALTER DATABASE "{dbname}" RESET {name}'
    if found.source == "user":
        return f"ALTER ROLE <the role> RESET {name} (it is set on the role this URL logs in as)"
    if found.source == "client":
        return f"take -c {name}=... out of PGOPTIONS or the URL's options"
    return (
        f"set {name} = {wanted} in postgresql.conf (or ALTER SYSTEM SET {name} = {wanted}), "
        "then SELECT pg_reload_conf()"
    )


def durability(found: dict[str, Setting], dbname: str) -> list[Finding]:
    """A commit must reach the disk before it returns: the promises rest on it."""
    out: list[Finding] = []
    sync = found["synchronous_commit"]
    if sync.value == "off":
        out.append(
            Finding(
                CHECK,
                Level.PROBLEM,
                "synchronous_commit is off",
                "a commit returns before it is on disk, so a crash of the server loses the"
                " last moments of committed work: an enqueue its producer saw commit, an "
                "outcome a consumer recorded. (The relay turns it off for its own sessions "
                f"on purpose: what it loses it does again.) Source: {sync.source}",
                _undo("synchronous_commit", sync, "on", dbname),
            )
        )
    else:
        out.append(Finding(CHECK, Level.OK, f"synchronous_commit is {sync.value}"))
    fsync = found["fsync"]
    if fsync.value == "off":
        out.append(
            Finding(
                CHECK,
                Level.PROBLEM,
                "fsync is off",
                "nothing is flushed to disk: a crash of the machine can lose committed work "
                "or corrupt the database",
                _undo("fsync", fsync, "on", dbname),
            )
        )
    return out


def vacuum(found: dict[str, Setting], tables_off: Sequence[str], dbname: str) -> list[Finding]:
    out: list[Finding] = []
    why = (
        "every job's life, wake-up and heartbeat leaves dead rows behind; without "
        "autovacuum they pile up, the tables and their indexes grow, and the relay's "
        "decision and the claims slow down hour by hour (anti-wraparound vacuums still run)"
    )
    for name in ("autovacuum", "track_counts"):
        if found[name].value == "off":
            title = (
                "autovacuum is off"
                if name == "autovacuum"
                else "track_counts is off, so autovacuum cannot see dead rows"
            )
            out.append(
                Finding(CHECK, Level.WARNING, title, why, _undo(name, found[name], "on", dbname))
            )
    for table in tables_off:
        out.append(
            Finding(
                CHECK,
                Level.WARNING,
                f"autovacuum is off for table {table}",
                why,
                f"ALTER TABLE {table} RESET (autovacuum_enabled)",
            )
        )
    if not out:
        out.append(Finding(CHECK, Level.OK, "autovacuum is on"))
    return out


async def tables_without_autovacuum(conn: AsyncConnection[Any]) -> list[str]:
    cur = await conn.execute(DOCTOR_TABLE_OPTIONS, {"tables": list(CHURNING)})
    return [table for table, value in await cur.fetchall() if not _true(value)]


def _true(value: str) -> bool:
    # PostgreSQL's spellings of a boolean reloption (parse_bool): a prefix of
    # true/false, yes/no, or on/off, 1 or 0.
    value = value.strip().lower()
    return value in ("1", "on") or (
        len(value) > 0 and ("true".startswith(value) or "yes".startswith(value))
    )


def timeouts(found: dict[str, Setting], dbname: str) -> list[Finding]:
    out: list[Finding] = []
    idle = found["idle_in_transaction_session_timeout"]
    if idle.value == "0":
        out.append(
            Finding(
                CHECK,
                Level.WARNING,
                "idle_in_transaction_session_timeout is 0 (never)",
                "a producer or handler that leaves a transaction open (a hung request, a "
                "thread that died holding its connection) keeps its row locks for ever: a "
                "job it touched cannot be claimed, finished or cancelled meanwhile",
                f'ALTER DATABASE "{dbname}" SET idle_in_transaction_session_timeout = '
                f"'{IDLE_IN_TRANSACTION_SUGGESTED}' (longer than any transaction of yours "
                "waits between statements)",
            )
        )
    else:
        out.append(
            Finding(CHECK, Level.OK, f"idle_in_transaction_session_timeout is {_ms(idle.value)}")
        )
    statement = found["statement_timeout"]
    if statement.value != "0":
        out.append(
            Finding(
                CHECK,
                Level.NOTE,
                f"statement_timeout is {_ms(statement.value)} for every session here",
                "producers' and handlers' statements that run longer are cancelled; the "
                "relay and consumers set their own for their statements (30 s). "
                f"Source: {statement.source}",
            )
        )
    return out


def _ms(value: str) -> str:
    ms = int(value)
    return f"{ms} ms" if ms < 1000 else f"{ms / 1000:g} s"


def version(found: dict[str, Setting]) -> Finding:
    # The oldest PostgreSQL the statements run on, and the oldest tested, as `jobctl
    # migrate` says them (imported here: that module brings alembic).
    from hybrid_jobs.jobctl.commands.migrate import OLDEST_POSTGRES, SUPPORTED_POSTGRES

    number = int(found["server_version_num"].value)
    said = f"PostgreSQL {found['server_version'].value}"
    if number < OLDEST_POSTGRES:
        return Finding(
            CHECK,
            Level.PROBLEM,
            f"{said} is too old",
            f"hybrid-jobs' statements need PostgreSQL {OLDEST_POSTGRES // 10000} or newer",
            f"upgrade PostgreSQL ({SUPPORTED_POSTGRES} or newer is tested)",
        )
    if number < SUPPORTED_POSTGRES * 10000:
        return Finding(
            CHECK,
            Level.WARNING,
            f"{said} is older than the versions hybrid-jobs is tested on",
            f"it runs, but is tested on PostgreSQL {SUPPORTED_POSTGRES} and newer",
            f"upgrade PostgreSQL to {SUPPORTED_POSTGRES} or newer",
        )
    return Finding(CHECK, Level.OK, said)


@dataclass(frozen=True)
class Fleet:
    """The daemons whose connections are counted: each consumer's concurrency, and
    how many relays; ``seen`` when read from the workers and relays tables rather
    than given with --consumers and --relays."""

    consumers: tuple[int, ...]
    relays: int
    seen: bool


async def connections(
    conn: AsyncConnection[Any], found: dict[str, Setting], fleet: Fleet
) -> Finding:
    """What the relays' and consumers' pools open at most, against what the server
    takes from clients that are not superusers."""
    most = int(found["max_connections"].value)
    reserved = int(found["superuser_reserved_connections"].value)
    if "reserved_connections" in found:
        reserved += int(found["reserved_connections"].value)
    available = most - reserved
    row = await (await conn.execute(DOCTOR_CONNECTIONS_IN_USE)).fetchone()
    in_use = row[0] if row else 0
    if not fleet.consumers and not fleet.relays:
        return Finding(
            CHECK,
            Level.NOTE,
            f"max_connections is {most}: no relay or consumer to count against it",
            f"{in_use} connection(s) are open now",
            "pass --consumers N --relays N to count the ones you mean to run",
        )
    relays = fleet.relays * relay_connections(defaults.RELAY_PUBLISHERS)
    consumers = sum(consumer_connections(c) for c in fleet.consumers)
    plain = sum(consumer_connections(c, plain_handlers=True) for c in fleet.consumers)
    whose = "seen in the workers and relays tables" if fleet.seen else "given"
    detail = (
        f"{fleet.relays} relay(s) ({whose}) open up to {relays} connections and "
        f"{len(fleet.consumers)} consumer process(es) up to {consumers} ({plain} if they "
        f"run plain def handlers, whose threads have a pool of their own); the server "
        f"takes {available} ({most} max_connections less {reserved} reserved for "
        f"superusers); {in_use} are open now"
    )
    fix = (
        f"raise max_connections to at least {plain + reserved + 10} (a restart of PostgreSQL), "
        "lower the consumers' --concurrency, or put PgBouncer in front (docs: Deploy, PgBouncer)"
    )
    if relays + consumers > available:
        title = "the relays and consumers would open more connections than the server takes"
        return Finding(CHECK, Level.PROBLEM, title, detail, fix)
    if relays + plain > available:
        title = "with plain def handlers, the consumers would open more connections than allowed"
        return Finding(CHECK, Level.WARNING, title, detail, fix)
    return Finding(CHECK, Level.OK, f"max_connections ({most}) is enough", detail)


async def clock(conn: AsyncConnection[Any]) -> list[Finding]:
    """This machine's clock against the database's: the midpoint of the round trip
    against the database's reading, give or take half the round trip."""
    before = time.time()
    row = await (await conn.execute(DOCTOR_CLOCK)).fetchone()
    after = time.time()
    assert row is not None
    theirs: datetime = row[0]
    skew = theirs.timestamp() - (before + after) / 2
    margin = (after - before) / 2
    off = max(abs(skew) - margin, 0.0)
    way = "behind" if skew > 0 else "ahead of"
    said = f"this machine's clock is {abs(skew):.3f} s {way} the database's (± {margin:.3f} s)"
    found: list[Finding] = []
    fix = (
        "synchronise the clocks of this machine and the database's "
        "(NTP: chrony or systemd-timesyncd)"
    )
    detail = (
        "hybrid-jobs times leases, retries and schedules by the database's clock alone, "
        "so this changes no decision; but the daemons' logs and the database's times "
        "read apart"
    )
    if off > SKEW_PROBLEM_S:
        found.append(Finding("clock", Level.PROBLEM, said, detail, fix))
    elif off > SKEW_WARNING_S:
        found.append(Finding("clock", Level.WARNING, said, detail, fix))
    else:
        found.append(Finding("clock", Level.OK, said))
    found.append(
        Finding(
            "clock",
            Level.NOTE,
            "the relays' and consumers' clocks cannot be measured from here",
            "their rows record when the database heard from them, by the database's clock, "
            "not their own",
            "run `jobctl doctor` on each machine that runs them: it measures that machine's clock",
        )
    )
    return found
