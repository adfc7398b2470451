"""The relays and consumers the database has heard from, and the waiting jobs that
nobody live can run.

A consumer refreshes its row in ``workers`` at least every third of its TTL, a relay
its row in ``relays`` every few seconds; a live relay forgets a row silent past its
``--worker-ttl``. So a row that is there but no longer live is a process that died
without a clean stop, or is frozen, or whose database connection is cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from hybrid_jobs.jobctl.doctor.findings import Finding, Level
from hybrid_jobs.jobctl.doctor.queries import (
    DOCTOR_PUBLISH_FAILING,
    DOCTOR_RELAYS,
    DOCTOR_WAITING_KINDS,
    DOCTOR_WORKERS,
)
from hybrid_jobs.schema.queries import RELAY_LIVE_SECONDS, WORKER_TTL_SECONDS

# How many processes a finding names before it says "and N more".
NAMED = 5


@dataclass(frozen=True)
class Process:
    name: str  # host:pid (id)
    live: bool
    stopping: bool
    silent_s: float
    queues: tuple[str, ...] = ()
    concurrency: int = 0
    connected: bool = True  # a relay's connection to RabbitMQ
    # a lease of it lapsed since it was last heard from: not live, however recent
    lapsed: bool = False


@dataclass(frozen=True)
class Seen:
    consumers: tuple[Process, ...]
    relays: tuple[Process, ...]

    @property
    def live_consumers(self) -> list[Process]:
        return [p for p in self.consumers if p.live]

    @property
    def live_relays(self) -> list[Process]:
        return [p for p in self.relays if p.live]

    @property
    def anything_live(self) -> bool:
        return bool(self.live_consumers or self.live_relays)

    def served_queues(self) -> set[str]:
        return {q for p in self.live_consumers for q in p.queues}


async def seen(conn: AsyncConnection[Any]) -> Seen:
    cur = await conn.execute(DOCTOR_WORKERS, {"worker_ttl": WORKER_TTL_SECONDS})
    consumers = tuple(
        Process(
            f"{host}:{pid} ({wid})",
            live,
            stopping,
            silent,
            tuple(queues),
            concurrency,
            lapsed=lapsed,
        )
        for wid, host, pid, queues, concurrency, stopping, live, silent, lapsed in (
            await cur.fetchall()
        )
    )
    cur = await conn.execute(DOCTOR_RELAYS)
    relays = tuple(
        Process(f"{host}:{pid} ({rid})", live, False, silent, connected=connected)
        for rid, host, pid, connected, live, silent in await cur.fetchall()
    )
    return Seen(consumers, relays)


def _names(processes: list[Process]) -> str:
    named = ", ".join(
        f"{p.name}, silent {p.silent_s:.0f} s" + (", a lease of it lapsed" if p.lapsed else "")
        for p in processes[:NAMED]
    )
    more = len(processes) - NAMED
    return named + (f", and {more} more" if more > 0 else "")


def consumers(found: Seen) -> list[Finding]:
    live = found.live_consumers
    stale = [p for p in found.consumers if not p.live and not p.stopping]
    stopping = [p for p in found.consumers if p.stopping]
    out: list[Finding] = []
    if not live:
        out.append(
            Finding(
                "consumers",
                Level.PROBLEM,
                "no consumer is live",
                f"none has announced itself in the last {WORKER_TTL_SECONDS:g} s without "
                "letting a lease lapse since: jobs wait until one starts or comes back (they "
                "are not lost)",
                "start `consumer --app YOUR_HANDLERS_MODULE`, or see why it stopped in its log",
            )
        )
    else:
        slots = sum(p.concurrency for p in live)
        queues = ", ".join(sorted(found.served_queues()))
        out.append(
            Finding(
                "consumers",
                Level.OK,
                f"{len(live)} consumer(s) live, {slots} slots, serving {queues}",
            )
        )
    if stale:
        out.append(
            Finding(
                "consumers",
                Level.WARNING,
                f"{len(stale)} consumer(s) stopped being heard from",
                f"silent past {WORKER_TTL_SECONDS:g} s, or a lease of it lapsed since it "
                f"was last heard from: {_names(stale)}. Killed, frozen or "
                "cut off from the database; their jobs run again once their leases expire",
                "see their logs and the machines they ran on; a live relay forgets their "
                "rows after its --worker-ttl",
            )
        )
    if stopping:
        out.append(
            Finding(
                "consumers",
                Level.NOTE,
                f"{len(stopping)} consumer(s) stopping",
                f"finishing their running jobs before they exit: {_names(stopping)}",
            )
        )
    return out


def relays(found: Seen) -> list[Finding]:
    live = found.live_relays
    stale = [p for p in found.relays if not p.live]
    out: list[Finding] = []
    if not live:
        out.append(
            Finding(
                "relays",
                Level.PROBLEM,
                "no relay is live",
                f"none has been heard from in the last {RELAY_LIVE_SECONDS} s: no wake-up goes "
                "out, no expired lease is swept and no schedule fires; jobs wait in the "
                "outbox (they are not lost)",
                "start `relay` (two, for availability), or see why it stopped in its log",
            )
        )
    elif not any(p.connected for p in live):
        out.append(
            Finding(
                "relays",
                Level.PROBLEM,
                f"{len(live)} relay(s) live, none connected to RabbitMQ",
                "no wake-up goes out: jobs wait in the outbox until a relay reconnects",
                "see the relays' logs (relay.broker_connection_lost) and RabbitMQ's",
            )
        )
    else:
        connected = sum(p.connected for p in live)
        out.append(
            Finding(
                "relays",
                Level.OK,
                f"{len(live)} relay(s) live, {connected} connected to RabbitMQ",
            )
        )
    if stale:
        out.append(
            Finding(
                "relays",
                Level.WARNING,
                f"{len(stale)} relay(s) stopped being heard from",
                f"silent past {RELAY_LIVE_SECONDS} s: {_names(stale)}. Killed, frozen or cut "
                "off from the database",
                "see their logs and the machines they ran on; a live relay forgets their "
                "rows after its --worker-ttl",
            )
        )
    return out


async def publishing(conn: AsyncConnection[Any]) -> list[Finding]:
    """The queues live relays cannot publish to, and why (the relays say so at every
    heartbeat)."""
    cur = await conn.execute(DOCTOR_PUBLISH_FAILING)
    return [
        Finding(
            "relays",
            Level.PROBLEM,
            f"the relays cannot publish to queue {queue}: {reason}",
            f"{count} relay(s) say so, since {since:%Y-%m-%d %H:%M:%SZ} ({failures} failures):"
            f" {detail}. That queue's jobs wait in the outbox; the others' go out",
            "fix what RabbitMQ refuses (see the rabbitmq checks and the relays' log, "
            "relay.queue_publish_failing)",
        )
        for queue, reason, count, since, failures, detail in await cur.fetchall()
    ]


async def waiting(conn: AsyncConnection[Any]) -> tuple[list[Finding], set[str]]:
    """Due jobs that no live consumer can run: nobody serves their queue
    (NO_CONSUMER), or nobody that does has their handler (NO_HANDLER); and the
    queues that have due jobs."""
    cur = await conn.execute(DOCTOR_WAITING_KINDS, {"worker_ttl": WORKER_TTL_SECONDS})
    rows = await cur.fetchall()
    out: list[Finding] = []
    no_consumer: dict[str, tuple[int, float, bool]] = {}
    for queue, job_type, count, oldest, paused, on_queue, handlers in rows:
        if on_queue == 0:
            had = no_consumer.get(queue, (0, 0.0, paused))
            no_consumer[queue] = (had[0] + count, max(had[1], oldest or 0.0), paused)
        elif handlers == 0 and not paused:
            out.append(
                Finding(
                    "queues",
                    Level.PROBLEM,
                    f"{count} job(s) of type {job_type} wait in queue {queue}, and none of "
                    f"its {on_queue} live consumer(s) has a handler for it",
                    f"the oldest has been due for {oldest or 0:.0f} s (NO_HANDLER in "
                    "`jobctl jobs show`)",
                    f"deploy a consumer whose --app registers {job_type!r} on queue {queue}",
                )
            )
    for queue, (count, oldest, paused) in sorted(no_consumer.items()):
        if paused:
            out.append(
                Finding(
                    "queues",
                    Level.NOTE,
                    f"queue {queue} is paused, with {count} job(s) due and no consumer serving it",
                    "they start once it is resumed and a consumer serves it",
                )
            )
            continue
        out.append(
            Finding(
                "queues",
                Level.PROBLEM,
                f"{count} job(s) wait in queue {queue}, and no live consumer serves it",
                f"the oldest has been due for {oldest:.0f} s (NO_CONSUMER in `jobctl jobs show`)",
                f"start a consumer with `--queue {queue}` (or whose handlers name it)",
            )
        )
    if not out:
        out.append(Finding("queues", Level.OK, "every due job has a live consumer to run it"))
    return out, {row[0] for row in rows}
